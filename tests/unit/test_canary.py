"""The canary: which unit it is, and the regression decision on recorded ``vllm bench serve`` results."""

from __future__ import annotations

import json
from pathlib import Path

from instinct_fleet.fleet import canary
from instinct_fleet.fleet.roll import Roll, ServingUnit, batches
from instinct_fleet.model.inventory import resolve_host
from instinct_fleet.model.validate import validate_canary

# vLLM's result fields, as the stand-in's bench (and vLLM's) writes them: one run of a 16-prompt profile.
BEFORE = {"output_throughput": 1500.0, "median_tpot_ms": 2.6, "median_ttft_ms": 45.0, "completed": 16}


def run(throughput: float, tpot: float, ttft: float) -> dict[str, float]:
    return {**BEFORE, "output_throughput": throughput, "median_tpot_ms": tpot, "median_ttft_ms": ttft}


def test_a_change_within_the_limit_passes_and_one_beyond_it_names_each_metric_with_its_figures() -> None:
    faster = canary.compare("main", [BEFORE], [run(1650, 2.35, 41)], 10)
    assert faster.regressions == () and "output throughput 1500.0 -> 1650.0 tok/s (+10.0%)" in faster.figures()
    slower = canary.compare("main", [BEFORE], [run(760, 5.2, 47)], 10)
    assert slower.regressions == (
        "output throughput 1500.0 -> 760.0 tok/s (-49.3%, more than 10%)",
        "median TPOT 2.6 -> 5.2 ms (+100.0%, more than 10%)",
    )
    # TTFT alone, just beyond the limit; and a stricter limit catches a smaller change.
    assert canary.compare("main", [BEFORE], [run(1500, 2.6, 49.6)], 10).regressions[0].startswith("median TTFT")
    assert canary.compare("main", [BEFORE], [run(1400, 2.6, 45)], 5).regressions[0].startswith("output throughput")


def test_repeated_runs_are_compared_by_their_means() -> None:
    noisy = [run(1300, 2.6, 45), run(1700, 2.6, 45)]  # one slow run alone would be a regression
    assert canary.compare("main", noisy, [run(1500, 2.6, 45)], 10).regressions == ()
    assert canary.means(noisy)["output_throughput"] == 1500


def test_a_result_missing_a_field_compares_only_what_both_have() -> None:
    partial = {"output_throughput": 1500.0}
    assert canary.compare("main", [partial], [run(1000, 9, 90)], 10).regressions == (
        "output throughput 1500.0 -> 1000.0 tok/s (-33.3%, more than 10%)",
    )


def test_the_roll_records_both_phases_and_reports_the_regression() -> None:
    units = [ServingUnit("a", ("a",), "restart")]
    roll = Roll(units, batches(units, 1, canary=True), 0, on_failure="rollback", canary_host="a", canary_limit=10)
    assert roll.measure("a", "before", "main", [BEFORE]) is None
    problem = roll.measure("a", "after", "main", [run(700, 5.5, 46)])
    assert problem is not None and "canary regressed" in problem and "1500.0 -> 700.0" in problem
    (row,) = roll.summary({"a": ("vllm-main",)}, set())
    assert row["canary"][0]["before"]["output_throughput"] == 1500 and row["canary"][0]["after"]["median_tpot_ms"] == 5.5


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
    canary.store(tmp_path, first[0], first[1], BEFORE)
    canary.store(tmp_path, second[0], second[1], BEFORE)
    folder = tmp_path / "h1" / "main"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "latency-c1-run2.json", "latency-c1.json"]
    assert json.loads((folder / "config.json").read_text())["profile"] == "latency"
