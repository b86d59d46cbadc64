"""The canary: which unit it is, and the regression decision on recorded ``vllm bench serve`` results."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from instinct_fleet.live import canary
from instinct_fleet.model import workload
from instinct_fleet.model.inventory import resolve_host
from instinct_fleet.model.validate import validate_canary, validate_rolling
from instinct_fleet.roll.roll import ServingUnit, batches
from tests.unit.test_noise import ALPHA, FLOORS, runs
from tests.unit.test_roll import journal

RULE = canary.Rule(limit=10, floors=FLOORS, alpha=ALPHA, inconclusive="proceed")


def test_a_regression_beyond_the_noise_fails_the_canary_with_its_evidence() -> None:
    found = RULE.compare("main", runs(1, 3, 45.0, 4.0, 726.0), runs(2, 3, 67.5, 6.0, 484.0))
    problem = RULE.problem(found)
    assert problem is not None and problem.startswith("canary regressed: main: output throughput")
    assert "median TPOT" in problem and "Mann-Whitney p=" in problem
    entry = found.as_json()
    assert entry["outcome"] == "regressed" and entry["runs"] == [3, 3] and len(entry["regressions"]) == 3
    assert entry["before"]["median_tpot_ms"] == pytest.approx(4.0, rel=0.05)


def test_an_inconclusive_canary_proceeds_or_rolls_back_as_canary_inconclusive_says() -> None:
    before, after = [{"output_throughput": 700.0}], [{"output_throughput": 600.0}]  # one run a side: no noise to judge by
    found = RULE.compare("main", before, after)
    assert found.verdict.outcome == "inconclusive" and RULE.problem(found) is None
    strict = dataclasses.replace(RULE, inconclusive="rollback")
    problem = strict.problem(strict.compare("main", before, after))
    assert problem is not None and problem.startswith("canary inconclusive (canary_inconclusive = rollback): main: output throughput")


def test_the_roll_records_both_phases_and_says_what_it_decided() -> None:
    units = [ServingUnit("a", ("a",), "restart")]
    roll = journal(units, canary=True, on_failure="rollback", canary_host="a", canary_rule=RULE)
    assert roll.measure("a", "before", "main", runs(1, 3, 45.0, 4.0, 726.0)) is None
    problem = roll.measure("a", "after", "main", runs(2, 3, 67.5, 6.0, 484.0))
    assert problem is not None and "canary regressed" in problem
    (row,) = roll.summary({"a": ("vllm-main",)}, set())
    assert row["canary"][0]["outcome"] == "regressed" and row["canary"][0]["after"]["median_tpot_ms"] == pytest.approx(6.0, rel=0.05)
    # An inconclusive canary lets the roll go on and the summary says so.
    roll = journal(units, canary=True, on_failure="rollback", canary_host="a", canary_rule=RULE)
    roll.measure("a", "before", "main", [{"output_throughput": 700.0}])
    assert roll.measure("a", "after", "main", [{"output_throughput": 600.0}]) is None
    assert roll.reasons["a"][0].startswith("canary inconclusive, proceeding: main: output throughput 700.0 -> 600.0 tok/s")


def test_a_first_deploy_with_a_canary_says_it_had_nothing_to_compare() -> None:
    units = [ServingUnit("a", ("a",), "start")]
    roll = journal(units, canary=True, on_failure="rollback", canary_host=None, canary_rule=RULE)
    roll.proceeds(0, set())
    (row,) = roll.summary({"a": ("vllm-main",)}, set())
    assert row["status"] == "started" and row["why"] == "batch 0; no canary: nothing of it served before this deploy to compare with"


def test_the_built_in_canary_fits_every_instance() -> None:
    """The default profile, sized down to an instance's --max-model-len; a profile of the user's own name is theirs."""
    spec, found = resolve_host("h1", {"vllm_args": {"max-model-len": 256}})
    assert not found, found
    (job,) = workload.jobs(spec, spec.services[0], "canary", None, None)
    assert (job.profile.input_len, job.profile.output_len, job.num_prompts, job.concurrency) == (128, 64, 16, 4)
    spec, _ = resolve_host("h1", {})  # gpt-oss-120b's 8192: the profile as it is
    (job,) = workload.jobs(spec, spec.services[0], "canary", None, None)
    assert (job.profile.input_len, job.profile.output_len) == (512, 64)
    own = {"canary": {"input_len": 300, "output_len": 10, "num_prompts": 2, "concurrency": [1]}}
    spec, _ = resolve_host("h1", {"vllm_args": {"max-model-len": 256}, "bench_profiles": own})
    assert [f.rule for f in validate_canary(spec)] == ["canary-profile"]


def test_the_canary_rule_is_the_fleet_s_variables() -> None:
    spec, found = resolve_host("h1", {"canary_profile": "latency", "canary_floors": {"median_ttft_ms": 5}})
    assert not found, found
    rule = canary.Rule.of(spec.vars)
    assert rule.floors == {"output_throughput": 10.0, "median_tpot_ms": 0.5, "median_ttft_ms": 5.0}
    assert (rule.limit, rule.alpha, rule.inconclusive) == (10, 0.01, "proceed")


def test_the_canary_is_the_smallest_restarting_unit_alone_then_rolling_batch() -> None:
    units = [
        ServingUnit("cluster big", ("h1", "h2"), "restart"),
        ServingUnit("sim-b", ("sim-b",), "restart"),
        ServingUnit("sim-a", ("sim-a",), "restart"),
        ServingUnit("sim-c", ("sim-c",), "start"),
    ]
    assert [[u.name for u in b] for b in batches(units, 2, canary=True)] == [["sim-c"], ["sim-a"], ["cluster big", "sim-b"]]
    assert [[u.name for u in b] for b in batches(units, 2)] == [["sim-c"], ["cluster big", "sim-a"], ["sim-b"]]


def test_a_canary_profile_must_exist_and_fit_every_instance(tmp_path: Path) -> None:
    def findings(**data: object) -> list[str]:
        spec, found = resolve_host("h1", {"vllm_instances": [{"name": "main", "args": {"max-model-len": 2048}}], **data})
        assert not found, found
        return [f"{f.rule}: {f.message}" for f in validate_canary(spec)]

    assert findings() == []
    assert findings(canary_profile="latency") == []  # 1024 + 128 tokens fit
    (missing,) = findings(canary_profile="nope")
    assert missing.startswith("canary-profile: h1 has no bench profile 'nope'")
    (long,) = findings(canary_profile="seed-001-gpt-oss")
    assert "more than h1/main's --max-model-len 2048" in long


def test_the_canary_stores_its_runs_where_bench_does_for_report(tmp_path: Path) -> None:
    spec, _ = resolve_host("h1", {"vllm_instances": [{"name": "main"}], "canary_runs": 2})
    (first, second) = canary.runs(spec, spec.services[0], "latency")
    one, two = runs(1, 2, 45.0, 4.0, 726.0)
    canary.store(tmp_path, first[0], first[1], one)
    canary.store(tmp_path, second[0], second[1], two)
    folder = tmp_path / "h1" / "main"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "latency-c1-run2.json", "latency-c1.json"]
    assert json.loads((folder / "config.json").read_text())["profile"] == "latency"
    # Every run is kept whole, its per-request records included: report and the noise test read them.
    assert json.loads((folder / "latency-c1-run2.json").read_text())["ttfts"] == two["ttfts"]


def test_the_canary_s_settings_are_one_value_for_the_fleet() -> None:
    """The roll judges its canary on one host by one rule: a host that disagrees is named with the fleet's value."""
    specs = [
        resolve_host(name, {"canary_profile": "latency", **extra})[0]
        for name, extra in (("a", {}), ("b", {}), ("c", {"canary_floors": {"median_ttft_ms": 5}}))
    ]
    (found,) = validate_rolling(specs)
    assert (found.rule, str(found.host), found.key) == ("rolling-fleet", "c", "canary_floors")
    assert (
        "'median_ttft_ms': 5.0} here, {'output_throughput': 10.0, 'median_tpot_ms': 0.5, 'median_ttft_ms': 2.0} on most hosts"
        in found.message
    )
    # A host with no instance has no serving unit to roll: its canary settings are nobody's (a router, a host leaving).
    idle = resolve_host("d", {"canary_profile": None, "canary_floors": {"median_ttft_ms": 9}, "vllm_instances": []})[0]
    assert validate_rolling([*specs, idle]) == [found]


def test_the_canary_splits_alpha_over_every_comparison_it_judges() -> None:
    """A canary unit of two instances: harmless changes, 5000 of them at 10% run-to-run variation, fail the canary (one
    instance regressed) at most alpha of the time, within 3.72 binomial standard deviations; without the split over
    the instances the rate doubles."""
    import math
    import random

    from tests.unit.test_noise import RUNS, simulated

    rng = random.Random(64)
    rule = canary.Rule(limit=0, floors={}, alpha=ALPHA, inconclusive="proceed")  # the noise alone decides
    trials = 5000
    alarms = 0
    for _ in range(trials):
        sides = [(simulated(rng, RUNS, 0.10, 1.0, 0), simulated(rng, RUNS, 0.10, 1.0, 0)) for _ in range(2)]
        verdicts = [rule.compare(f"i{n}", before, after, comparisons=2).verdict.outcome for n, (before, after) in enumerate(sides)]
        alarms += "regressed" in verdicts
    assert alarms / trials <= ALPHA + 3.72 * math.sqrt(ALPHA * (1 - ALPHA) / trials), alarms


def test_a_multi_concurrency_profile_is_judged_job_by_job() -> None:
    """A job at concurrency 1 slowed twice, one at 64 unchanged: pooled, the slowdown hides in the spread of both; job
    by job, it is caught, and named with its concurrency."""
    from instinct_fleet.roll import measure

    spec, _ = resolve_host("h1", {"bench_profiles": {"two": {"input_len": 64, "output_len": 16, "concurrency": [1, 64]}}})
    jobs = [(job, repeat) for job in workload.jobs(spec, spec.services[0], "two", None, None) for repeat in range(3)]
    assert [measure.compared(job, jobs) for job, _ in jobs[::3]] == ["main at concurrency 1", "main at concurrency 64"]
    single = [(job, 0) for job in workload.jobs(spec, spec.services[0], "latency", None, None)]
    assert measure.compared(single[0][0], single) == "main"
    fast, slow = runs(1, 3, 45.0, 4.0, 726.0), runs(2, 3, 90.0, 8.0, 363.0)
    steady = runs(3, 3, 45.0, 4.0, 726.0)
    pooled = RULE.compare("main", [*fast, *steady], [*slow, *runs(4, 3, 45.0, 4.0, 726.0)])
    assert pooled.verdict.outcome != "regressed"
    by_job = RULE.compare("main at concurrency 1", fast, slow, comparisons=2)
    assert by_job.verdict.outcome == "regressed" and by_job.evidence().startswith("main at concurrency 1: ")
