"""The noise test: Mann-Whitney against its exact distribution, vLLM's per-request records, and each verdict."""

from __future__ import annotations

import itertools
import random
from statistics import median
from typing import Any

import pytest

from instinct_fleet.fleet import noise

FLOORS = {"output_throughput": 10.0, "median_tpot_ms": 0.5, "median_ttft_ms": 2.0}
ALPHA = 0.001  # canary_alpha's default
TTFT, TPOT, THROUGHPUT = noise.TTFT, noise.TPOT, noise.THROUGHPUT


def detailed(ttfts_ms: list[float], tpots_ms: list[float], throughput: float, out_len: int = 64) -> dict[str, Any]:
    """One run as ``vllm bench serve --save-detailed`` saves it: run-level figures and every request's records."""
    return {
        "completed": len(ttfts_ms),
        "output_throughput": throughput,
        "median_ttft_ms": median(ttfts_ms),
        "median_tpot_ms": median(tpots_ms),
        "ttfts": [t / 1000 for t in ttfts_ms],
        "itls": [[t / 1000] * (out_len - 1) for t in tpots_ms],
        "output_lens": [out_len] * len(ttfts_ms),
        "errors": [""] * len(ttfts_ms),
    }


def runs(seed: int, count: int, ttft: float, tpot: float, throughput: float, requests: int = 24) -> list[dict[str, Any]]:
    """``count`` runs of ``requests`` each, every figure drawn around the given ones (a busy host's spread)."""
    rng = random.Random(seed)
    return [
        detailed(
            [rng.lognormvariate(0, 0.25) * ttft for _ in range(requests)],
            [rng.gauss(tpot, tpot * 0.05) for _ in range(requests)],
            rng.gauss(throughput, throughput * 0.03),
        )
        for _ in range(count)
    ]


def exact_greater(x: list[float], y: list[float]) -> float:
    """The exact one-sided p of U for ``y`` over every split of the pooled values (ties counted as half)."""

    def u(ys: tuple[float, ...], xs: tuple[float, ...]) -> float:
        return sum(1.0 if b > a else 0.5 if b == a else 0.0 for a in xs for b in ys)

    pooled = x + y
    observed = u(tuple(y), tuple(x))
    total = hits = 0
    for chosen in itertools.combinations(range(len(pooled)), len(y)):
        ys = tuple(pooled[i] for i in chosen)
        xs = tuple(pooled[i] for i in range(len(pooled)) if i not in chosen)
        total += 1
        hits += u(ys, xs) >= observed
    return hits / total


@pytest.mark.parametrize("seed", range(8))
def test_mann_whitney_agrees_with_the_exact_permutation_distribution(seed: int) -> None:
    rng = random.Random(seed)
    x = [float(rng.randint(0, 12)) for _ in range(6)]  # integers: ties happen
    y = [float(rng.randint(0, 12) + seed % 4) for _ in range(7)]
    assert noise.mann_whitney_greater(x, y) == pytest.approx(exact_greater(x, y), abs=0.03)


def test_mann_whitney_is_one_sided_and_certain_only_for_a_clear_shift() -> None:
    x = [float(v) for v in range(20)]
    assert noise.mann_whitney_greater(x, [v + 100 for v in x]) < 1e-6
    assert noise.mann_whitney_greater([v + 100 for v in x], x) > 0.999
    assert 0.4 < noise.mann_whitney_greater(x, list(x)) < 0.6
    assert noise.mann_whitney_greater([], x) == 1.0


def test_per_request_values_are_read_as_vllm_records_them() -> None:
    run = {
        "ttfts": [0.010, 0.0, 0.030],
        "itls": [[0.004, 0.006], [], [0.002]],
        "output_lens": [3, 0, 1],
        "errors": ["", "Internal Server Error", ""],
    }
    assert noise.per_request(run, "ttft") == pytest.approx([10.0, 30.0])  # the failed request is left out
    # TPOT: (latency - ttft) / (output_len - 1) with latency = ttft + sum(itl); one output token has none.
    assert noise.per_request(run, "tpot") == pytest.approx([5.0])
    assert noise.per_request({"output_throughput": 1.0}, "ttft") == []  # without --save-detailed


def test_the_harmless_change_the_issue_met_is_no_regression() -> None:
    """TTFT 4.4 -> 5.3 ms (+20%) from one run of 24 requests: beyond 10%, but within the 2 ms floor."""
    before = detailed([4.4] * 24, [4.0] * 24, 726.0)
    after = detailed([5.3] * 24, [4.02] * 24, 721.0)
    verdict = noise.compare([before], [after], 10, FLOORS, ALPHA)
    assert verdict.outcome == "passed"
    ttft = next(j for j in verdict.judged if j.metric is TTFT)
    assert ttft.beyond_limit and not ttft.beyond_floor and ttft.status == "within"
    assert "median TTFT 4.4 -> 5.3 ms (+20.5%): within the floor of 2 ms" in verdict.evidence()


def test_the_same_configuration_measured_twice_is_never_a_regression() -> None:
    """Twenty draws of one configuration: a median may move beyond 10% by chance (then it is inconclusive, and the
    roll proceeds by default), but the noise test never confirms it."""
    outcomes = [
        noise.compare(runs(seed, 3, 45.0, 4.0, 726.0), runs(seed + 100, 3, 45.0, 4.0, 726.0), 10, FLOORS, ALPHA).outcome
        for seed in range(20)
    ]
    assert "regressed" not in outcomes and outcomes.count("passed") >= 15, outcomes


def test_a_slowdown_of_one_and_a_half_times_is_caught_with_its_evidence() -> None:
    before = runs(1, 3, 45.0, 4.0, 726.0)
    after = runs(2, 3, 67.5, 6.0, 484.0)
    verdict = noise.compare(before, after, 10, FLOORS, ALPHA)
    assert verdict.outcome == "regressed"
    assert {j.metric.key for j in verdict.beyond()} == {"output_throughput", "median_tpot_ms", "median_ttft_ms"}
    tpot = next(j for j in verdict.judged if j.metric is TPOT)
    assert tpot.p is not None and tpot.p < 1e-6 and tpot.requests == (72, 72)
    assert "beyond 10%, 0.5 ms and the noise (Mann-Whitney p=" in tpot.evidence() and "over 72 and 72 requests" in tpot.evidence()
    throughput = next(j for j in verdict.judged if j.metric is THROUGHPUT)
    assert throughput.band is not None and "the 3 and 3 runs' spreads add up to" in throughput.evidence()


def test_beyond_the_threshold_and_floor_but_within_the_noise_is_inconclusive() -> None:
    # Throughput is one figure per run: one baseline run gives no noise band.
    one = noise.compare([{"output_throughput": 700.0}], [{"output_throughput": 600.0}], 10, FLOORS, ALPHA)
    assert one.outcome == "inconclusive" and "one run a side: no noise band" in one.evidence()
    # Runs whose spreads add up to more than the change: inconclusive; to less: a regression.
    wide = [{"output_throughput": v} for v in (560.0, 700.0, 760.0)]
    narrow = [{"output_throughput": v} for v in (690.0, 700.0, 705.0)]
    after = [{"output_throughput": v} for v in (600.0, 610.0, 620.0)]
    assert noise.compare(wide, after, 10, FLOORS, ALPHA).outcome == "inconclusive"
    assert noise.compare(narrow, after, 10, FLOORS, ALPHA).outcome == "regressed"
    # Requests whose distributions overlap: TTFT +25% in its median, yet Mann-Whitney cannot tell them apart.
    rng = random.Random(7)
    before = [detailed([rng.uniform(10, 90) for _ in range(8)], [4.0] * 8, 700.0)]
    shuffled = [detailed([rng.uniform(10, 90) for _ in range(8)], [4.0] * 8, 700.0)]
    ttft = noise.judge(TTFT, before, shuffled, 10, 2.0, ALPHA)
    assert ttft is not None
    if ttft.beyond_limit and ttft.beyond_floor:  # the draw moved the median: the test must not confirm it
        assert ttft.status == "inconclusive" and ttft.p is not None and ttft.p >= ALPHA


def test_tune_asks_the_other_way_round() -> None:
    before = runs(3, 3, 45.0, 6.0, 500.0)
    faster = runs(4, 3, 30.0, 4.0, 726.0)
    assert noise.compare(before, faster, 10, FLOORS, ALPHA).outcome == "passed"  # nothing got worse
    better = noise.compare(before, faster, 0, FLOORS, ALPHA, direction="better")
    assert {j.metric.key for j in better.beyond()} == {"output_throughput", "median_tpot_ms", "median_ttft_ms"}
    same = noise.compare(before, runs(5, 3, 45.0, 6.0, 500.0), 0, FLOORS, ALPHA, direction="better")
    assert not same.beyond()


def test_a_side_missing_a_figure_is_not_judged_on_it() -> None:
    verdict = noise.compare([{"output_throughput": 700.0}], [{"output_throughput": 690.0, "median_ttft_ms": 9.0}], 10, FLOORS, ALPHA)
    assert [j.metric.key for j in verdict.judged] == ["output_throughput"]


def test_spread_names_the_median_the_range_and_the_runs() -> None:
    assert noise.spread([700.0]) == "700.0"
    assert noise.spread([690.0, 700.0, 720.0]) == "700.0 (690.0-720.0, 3 runs)"
