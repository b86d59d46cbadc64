"""The noise test: Student's t and Mann-Whitney against exact values, vLLM's per-request records, each verdict, and
the false alarms and the power of the whole verdict measured by simulation with run-to-run variation."""

from __future__ import annotations

import itertools
import math
import random
from statistics import median
from typing import Any

import pytest

from instinct_fleet.live import noise
from instinct_fleet.model.defaults import FleetVars

FLOORS = {"output_throughput": 10.0, "median_tpot_ms": 0.5, "median_ttft_ms": 2.0}
ALPHA = FleetVars().canary_alpha
RUNS = FleetVars().canary_runs
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


@pytest.mark.parametrize(
    ("x", "y"),
    [
        ([1.0] * 7 + [2.0] * 2, [1.0] * 3 + [2.0] * 6),
        ([0.0] * 5 + [1.0] * 3, [0.0] * 2 + [1.0] * 5 + [2.0]),
        ([3.0] * 8, [3.0] * 6 + [4.0] * 2),
    ],
)
def test_mann_whitney_s_variance_is_the_exact_variance_of_u_over_every_split_ties_included(x: list[float], y: list[float]) -> None:
    """With many ties the normal approximation is coarse against the exact p (the tolerance of the test above), but its
    variance is exact: the tie-corrected formula equals U's variance over every split of the pooled values. So the
    p-value is the one the exact mean and variance give, to rounding; without the tie correction it is not."""

    def u(ys: list[float], xs: list[float]) -> float:
        return sum(1.0 if b > a else 0.5 if b == a else 0.0 for a in xs for b in ys)

    pooled = x + y
    us = [
        u([pooled[i] for i in chosen], [pooled[i] for i in range(len(pooled)) if i not in chosen])
        for chosen in itertools.combinations(range(len(pooled)), len(y))
    ]
    mean = sum(us) / len(us)
    variance = sum((v - mean) ** 2 for v in us) / len(us)
    z = (u(y, x) - mean - 0.5) / math.sqrt(variance)
    assert noise.mann_whitney_greater(x, y) == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), abs=1e-12)


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


def test_a_slowdown_of_one_and_a_half_times_is_caught_with_its_evidence() -> None:
    before = runs(1, 3, 45.0, 4.0, 726.0)
    after = runs(2, 3, 67.5, 6.0, 484.0)
    verdict = noise.compare(before, after, 10, FLOORS, ALPHA)
    assert verdict.outcome == "regressed"
    assert {j.metric.key for j in verdict.beyond()} == {"output_throughput", "median_tpot_ms", "median_ttft_ms"}
    tpot = next(j for j in verdict.judged if j.metric is TPOT)
    assert tpot.p_runs is not None and tpot.p_runs < tpot.level and tpot.p is not None and tpot.requests == (72, 72)
    assert tpot.tests == 3 and tpot.level == pytest.approx(ALPHA / 3)
    assert "beyond 10%, 0.5 ms and the noise (t-test p=" in tpot.evidence()
    assert f"over the 3 and 3 runs, Mann-Whitney p={tpot.p:.3g} over 72 and 72 requests (alpha {ALPHA:g} / 3 figures = " in tpot.evidence()
    throughput = next(j for j in verdict.judged if j.metric is THROUGHPUT)
    assert throughput.p is None and f"t-test p={throughput.p_runs:.3g} over the 3 and 3 runs (alpha" in throughput.evidence()


def test_beyond_the_threshold_and_floor_but_within_the_noise_is_inconclusive() -> None:
    # One run a side: no variance to judge by.
    one = noise.compare([{"output_throughput": 700.0}], [{"output_throughput": 600.0}], 10, FLOORS, ALPHA)
    assert one.outcome == "inconclusive" and "1 and 1 runs: too few to judge the noise (3 in all at least)" in one.evidence()
    # The same medians (700 -> 610): runs that scatter widely cannot tell it from noise, runs that agree can.
    wide = [{"output_throughput": v} for v in (560.0, 700.0, 900.0)]
    narrow = [{"output_throughput": v} for v in (690.0, 700.0, 705.0)]
    after = [{"output_throughput": v} for v in (600.0, 610.0, 620.0)]
    assert noise.compare(wide, after, 10, FLOORS, ALPHA).outcome == "inconclusive"
    assert noise.compare(narrow, after, 10, FLOORS, ALPHA).outcome == "regressed"
    # Runs that tell it, but requests that do not: the request test is a second condition. Each run's middle
    # request moved (its median TTFT +30%), the other requests as they were.
    before = [detailed([10, 20, 30, 40, 50 + i, 60, 70, 80, 90], [4.0] * 9, 700.0) for i in (-1, 0, 1)]
    after = [detailed([10, 20, 30, 40, 65 + i, 66, 70, 80, 90], [4.0] * 9, 700.0) for i in (-1, 0, 1)]
    ttft = noise.judge(TTFT, before, after, 10, 2.0, ALPHA)
    assert ttft is not None and ttft.p_runs is not None and ttft.p_runs < ALPHA and ttft.p is not None and ttft.p >= ALPHA
    assert ttft.status == "inconclusive"


def test_the_canary_splits_alpha_over_the_figures_it_judges() -> None:
    """A run-level p between alpha / 3 and alpha is beyond the noise for one figure judged alone, not for one of three."""
    before = [{"output_throughput": v, "median_tpot_ms": 4.0} for v in (700.0, 702.0, 698.0)]
    after = [{"output_throughput": v, "median_tpot_ms": 4.0} for v in (600.0, 650.0, 680.0)]
    alone = noise.judge(THROUGHPUT, before, after, 5, 10.0, 0.05)  # 700 -> 650: beyond 5% and the floor
    assert alone is not None and alone.p_runs is not None and 0.05 / 2 < alone.p_runs < 0.05 and alone.status == "beyond"
    verdict = noise.compare(before, after, 5, FLOORS, 0.05)
    assert [j.tests for j in verdict.judged] == [2, 2] and verdict.outcome == "inconclusive"
    assert "(alpha 0.05 / 2 figures = 0.025)" in verdict.evidence()


def test_student_t_agrees_with_its_closed_forms_and_its_table() -> None:
    for t in (-3.0, -0.5, 0.0, 0.7, 2.0, 12.0):
        assert noise.student_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, abs=1e-12)  # Cauchy
        assert noise.student_sf(t, 2) == pytest.approx(0.5 - t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    # One-sided critical values (any table of Student's t): 4 and 10 degrees of freedom.
    for t, df, p in ((2.132, 4, 0.05), (3.747, 4, 0.01), (7.173, 4, 0.001), (2.764, 10, 0.01), (4.144, 10, 0.001)):
        assert noise.student_sf(t, df) == pytest.approx(p, rel=2e-3)


def test_the_run_test_judges_ratios_and_needs_three_runs() -> None:
    assert noise.runs_greater([1.0], [2.0]) is None and noise.runs_greater([], [1.0, 2.0, 3.0]) is None
    assert noise.runs_greater([1.0, 1.0], [1.0]) == 0.5 and noise.runs_greater([1.0, 1.0], [2.0]) == 0.0
    # On the logarithms: the same ratio gives the same p at any scale, and one side times k mirrors it divided by k.
    x, y = [10.0, 11.0, 9.5], [12.0, 13.5, 12.5]
    p = noise.runs_greater(x, y)
    assert p is not None and p == pytest.approx(noise.runs_greater([v * 1000 for v in x], [v * 1000 for v in y]))
    assert noise.runs_greater(y, x) == pytest.approx(1 - p)
    # Doubling runs are evenly spaced in logarithms: t = 3 log 2 / (log 2 sqrt(2/3)), 4 degrees of freedom. A value
    # that is not positive has no logarithm: then the values themselves.
    assert noise.runs_greater([1.0, 2.0, 4.0], [8.0, 16.0, 32.0]) == pytest.approx(noise.student_sf(3 / math.sqrt(2 / 3), 4))
    assert noise.runs_greater([0.0, 1.0, 2.0], [3.0, 4.0, 5.0]) == pytest.approx(noise.student_sf(3 / math.sqrt(2 / 3), 4))


def simulated(rng: random.Random, count: int, variation: float, slower: float, requests: int = 24) -> list[dict[str, Any]]:
    """``count`` runs of one configuration whose every figure is moved by a run's own factor (lognormal, sd
    ``variation``: a busy neighbour slows TTFT, TPOT and throughput alike), ``slower`` times slower. ``requests``
    0: the run-level figures only (no --save-detailed records)."""
    made = []
    for _ in range(count):
        factor = math.exp(rng.gauss(0, variation)) * slower
        if not requests:
            made.append(
                {
                    "output_throughput": 726.0 / factor * rng.gauss(1, 0.01),
                    "median_tpot_ms": 4.0 * factor * rng.gauss(1, 0.01),
                    "median_ttft_ms": 45.0 * factor * rng.lognormvariate(0, 0.06),
                }
            )
            continue
        ttfts = [rng.lognormvariate(0, 0.25) * 45.0 * factor for _ in range(requests)]
        made.append(detailed(ttfts, [rng.gauss(4.0, 0.2) * factor for _ in range(requests)], 726.0 / factor * rng.gauss(1, 0.01)))
    return made


VARIATIONS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25)


@pytest.mark.parametrize("variation", VARIATIONS)
def test_harmless_changes_raise_false_alarms_at_most_alpha_of_the_time(variation: float) -> None:
    """The test alone (no threshold, no floor: only the noise decides), 5000 harmless comparisons of the default
    runs a side: the share judged regressed stays within alpha plus 3.72 binomial standard deviations (a true rate of
    alpha exceeds that one time in 10,000; removing the split over the three figures triples the rate). The run test
    is the condition that holds the rate (the request test can only lower it), so the runs carry no request records here."""
    rng = random.Random(int(variation * 100))
    trials = 5000
    alarms = sum(
        noise.compare(simulated(rng, RUNS, variation, 1.0, 0), simulated(rng, RUNS, variation, 1.0, 0), 0, {}, ALPHA).outcome == "regressed"
        for _ in range(trials)
    )
    assert alarms / trials <= ALPHA + 3.72 * math.sqrt(ALPHA * (1 - ALPHA) / trials), alarms


def test_the_pooled_request_test_this_replaced_fails_the_same_simulation() -> None:
    """What the simulation sees: Mann-Whitney over every request of every run, as one sample, at 10% run-to-run
    variation raises false alarms far beyond alpha, and with the runs as the unit the verdict does not."""
    rng = random.Random(11)
    pooled = judged = 0
    for _ in range(200):
        before, after = simulated(rng, RUNS, 0.10, 1.0), simulated(rng, RUNS, 0.10, 1.0)
        xb = [v for r in before for v in noise.per_request(r, "ttft")]
        xa = [v for r in after for v in noise.per_request(r, "ttft")]
        pooled += noise.mann_whitney_greater(xb, xa) < ALPHA
        judged += noise.compare(before, after, 0, {}, ALPHA).outcome == "regressed"
    assert pooled / 200 > 10 * ALPHA and judged / 200 <= ALPHA, (pooled, judged)


@pytest.mark.parametrize(("slower", "variation"), [(1.5, 0.0), (1.5, 0.05), (4.0, 0.0), (4.0, 0.15)])
def test_slowdowns_are_caught_with_the_default_runs(slower: float, variation: float) -> None:
    """The canary's defaults (threshold, floors, alpha, runs), with request records: a 1.5x slowdown is caught in at
    least 95 of 100 comparisons up to 5% run-to-run variation, a 4x one up to 15% (the simulated fleet's own runs
    vary by under 2% in throughput and TPOT: benchmarks/canary_noise.json). Beyond that, three runs a side are too
    few for this alpha: such a canary is inconclusive (canary_inconclusive), and more canary_runs tell it."""
    rng = random.Random(int(slower * 10 + variation * 100))
    v = FleetVars()
    floors = dict(v.canary_floors)
    caught = sum(
        noise.compare(
            simulated(rng, RUNS, variation, 1.0), simulated(rng, RUNS, variation, slower), v.canary_max_regression, floors, ALPHA
        ).outcome
        == "regressed"
        for _ in range(100)
    )
    assert caught >= 95, caught


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


def test_each_side_is_its_median_run_so_one_disturbed_run_moves_nothing() -> None:
    """The figure compared is the median over the runs: one run slowed by a neighbour (300 of 700 tok/s) leaves the
    after side at 699 tok/s, within the limit; a mean would make it 566 tok/s, a 19% fall."""
    before = [{"output_throughput": v} for v in (700.0, 702.0, 698.0)]
    after = [{"output_throughput": v} for v in (700.0, 699.0, 300.0)]
    judged = noise.judge(THROUGHPUT, before, after, 10, 10.0, ALPHA)
    assert judged is not None and (judged.before, judged.after) == (700.0, 699.0) and judged.status == "within"
