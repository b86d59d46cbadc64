"""The benchmark report on vLLM result files: tables, the seed comparison, outliers and the plots."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from instinct_fleet.cli import main
from instinct_fleet.live import report
from instinct_fleet.model import knowledge

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-bench-serve_gpt-oss-120b_seed001.json"
# What bench's config.json says of 001's run (001:73): its model on one MI300X, the seed-001-gpt-oss profile as is.
SEED_PROFILE = {"dataset": "random", "input_len": 4096, "output_len": 1024, "num_prompts": 80, "concurrency": [8]}
GPT_OSS_TP1 = {"model": "openai/gpt-oss-120b", "gpus": [0], "gpu_model": "MI300X", "num_prompts": 80, "profile_settings": SEED_PROFILE}
# vLLM prints each figure under a label (vllm/benchmarks/serve.py) and saves it under a key; 001 copies the labels.
VLLM_LABELS = {
    "Successful requests": "completed",
    "Benchmark duration (s)": "duration",
    "Total input tokens": "total_input_tokens",
    "Total generated tokens": "total_output_tokens",
    "Request throughput (req/s)": "request_throughput",
    "Output token throughput (tok/s)": "output_throughput",
    "Total Token throughput (tok/s)": "total_token_throughput",
    **{
        f"{stat} {metric} (ms)": f"{stat.lower()}_{metric.lower()}_ms"
        for stat in ("Mean", "Median", "P99")
        for metric in ("TTFT", "TPOT", "ITL", "E2EL")
    },
}


def seed_001_output() -> dict[str, float]:
    """The figures of 001's `vllm bench serve` output (001:81-103), read from the seed itself, by vLLM's keys."""
    figures: dict[str, float] = {}
    for line in knowledge.seed_text("001").splitlines()[80:103]:
        label, _, value = line.partition(":")
        if label.strip() in VLLM_LABELS:
            figures[VLLM_LABELS[label.strip()]] = float(value)
    return figures


def results(tmp_path: Path, throughput: dict[tuple[str, str], float]) -> Path:
    """A results tree as `instinct-fleet bench` lays it out, one seed-001 run per instance."""
    base = json.loads(FIXTURE.read_text())
    for (host, instance), value in throughput.items():
        where = tmp_path / "20261123T000000Z" / host / instance
        where.mkdir(parents=True)
        (where / "vllm-8qps-gpt-oss-120b.json").write_text(json.dumps({**base, "output_throughput": value}))
        (where / "config.json").write_text(json.dumps({"recipe": "gpt-oss-120b", **GPT_OSS_TP1}))
    return tmp_path / "20261123T000000Z"


def seed_profile_run(tmp_path: Path, host: str, config: dict[str, object] | None) -> None:
    where = tmp_path / "r" / host / "main"
    where.mkdir(parents=True)
    shutil.copy(FIXTURE, where / "run.json")
    if config is not None:
        (where / "config.json").write_text(json.dumps(config))


def test_the_fixture_and_the_reference_are_the_seeds_own_figures() -> None:
    """Both sides of the ratio test come from 001's text, separately: a figure typed wrongly in either fails."""
    published = seed_001_output()
    assert len(published) == 19 and published["total_input_tokens"] == 327463 and published["completed"] == 80
    fixture = json.loads(FIXTURE.read_text())
    assert {key: fixture[key] for key in published} == published
    assert set(fixture) - set(published) == {"label", "model_id", "num_prompts", "max_concurrency", "failed"}
    reference = report.REFERENCES["seed-001-gpt-oss"]
    assert reference.figures == {key: value for key, value in published.items() if key in reference.figures}
    assert len(reference.figures) == 15  # every rate and latency figure 001 publishes; counts and duration are not figures


def test_the_seed_run_matches_its_published_figures_exactly(tmp_path: Path) -> None:
    seed_profile_run(tmp_path, "gpu-1", GPT_OSS_TP1)
    runs = report.load(tmp_path / "r")
    rows = report.reference_rows(runs)
    # Every serve figure 001 publishes: req/s, throughput, and mean, median and P99 of TTFT, TPOT, ITL and E2EL.
    assert {row[3]: row[6] for row in rows[1:]} == dict.fromkeys(report.REFERENCES["seed-001-gpt-oss"].figures, "1.00")
    assert len(rows) == 1 + 15
    assert runs[0].profile == "seed-001-gpt-oss" and runs[0].concurrency == 8
    assert report.not_compared(runs) == []
    assert report.seed_marks(runs, "output_throughput") == (("seed 001: openai/gpt-oss-120b", 8, 479.07),)


def test_each_ratio_is_measured_over_published_throughput_and_latency_alike(tmp_path: Path) -> None:
    """A run at half the seed's throughput and twice its median TTFT: ratios 0.50 and 2.00 (the figure measured over
    the figure published, whichever way is better), not their inverses."""
    seed_profile_run(tmp_path, "gpu-1", GPT_OSS_TP1)
    run = tmp_path / "r" / "gpu-1" / "main" / "run.json"
    data = json.loads(run.read_text())
    run.write_text(json.dumps({**data, "output_throughput": data["output_throughput"] / 2, "median_ttft_ms": data["median_ttft_ms"] * 2}))
    ratios = {row[3]: row[6] for row in report.reference_rows(report.load(tmp_path / "r"))[1:]}
    assert (ratios["output_throughput"], ratios["median_ttft_ms"], ratios["median_tpot_ms"]) == ("0.50", "2.00", "1.00")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"model": "meta-llama/Llama-3.1-8B-Instruct"}, "model meta-llama/Llama-3.1-8B-Instruct, the seed's openai/gpt-oss-120b"),
        ({"gpus": list(range(8))}, "GPU count 8, the seed's 1"),
        ({"gpu_model": "MI355X"}, "GPU model MI355X, the seed's MI300X"),
        ({"num_prompts": 16}, "prompt count 16, the seed's 80"),
        ({"profile_settings": {**SEED_PROFILE, "input_len": 128}}, "input length 128, the seed's 4096"),
        ({"profile_settings": {**SEED_PROFILE, "output_len": 16}}, "output length 16, the seed's 1024"),
        ({"profile_settings": {**SEED_PROFILE, "dataset": "sharegpt"}}, "dataset sharegpt, the seed's random"),
        ({"gpu_model": None}, "its config.json does not say its GPU model"),
    ],
)
def test_a_run_is_compared_only_on_the_seeds_workload(tmp_path: Path, change: dict[str, object], why: str) -> None:
    """Any field of the workload that differs leaves the run out, with that field named; a profile that merely
    carries the seed's name (a user's own bench_profiles entry) is no exception."""
    config = {key: value for key, value in {**GPT_OSS_TP1, **change}.items() if value is not None}
    seed_profile_run(tmp_path, "other", config)
    runs = report.load(tmp_path / "r")
    assert report.reference_rows(runs) == [report.reference_rows([])[0]]
    assert report.not_compared(runs) == [f"other/main (seed-001-gpt-oss): no comparable reference: {why}"]
    assert report.seed_marks(runs, "output_throughput") == ()
    text, _ = report.write(tmp_path / "r")
    assert "No run is like a seed's measurement" in text.read_text() and f"no comparable reference: {why}" in text.read_text()


def test_a_run_at_another_concurrency_or_without_its_config_is_not_compared(tmp_path: Path) -> None:
    seed_profile_run(tmp_path, "bare", None)
    where = tmp_path / "r" / "c4" / "main"
    where.mkdir(parents=True)
    (where / "run.json").write_text(json.dumps({**json.loads(FIXTURE.read_text()), "max_concurrency": 4}))
    (where / "config.json").write_text(json.dumps(GPT_OSS_TP1))
    assert report.not_compared(report.load(tmp_path / "r")) == [
        "bare/main (seed-001-gpt-oss): no comparable reference: no config.json beside it says what it ran",
        "c4/main (seed-001-gpt-oss): no comparable reference: concurrency 4, the seed's 8",
    ]


def test_an_instance_more_than_ten_percent_below_its_peers_is_flagged_with_its_host(tmp_path: Path) -> None:
    tree = results(tmp_path, {("gpu-1", "main"): 480.0, ("gpu-2", "main"): 470.0, ("gpu-3", "main"): 400.0, ("gpu-4", "main"): 440.0})
    flagged = report.outliers(report.load(tree))
    # One run each: named, but unconfirmed, since a difference between single runs may be noise.
    assert [(o.run.host, round(o.value), round(o.peers), o.confirmed) for o in flagged] == [("gpu-3", 400, 455, False)]
    report.write(tree)
    assert "unconfirmed: one run may be noise, so measure it again with repeats" in (tree / "report.md").read_text()


def repeat(tree: Path, host: str, values: list[float]) -> None:
    """More runs of the same measurement, as bench and the canary write them (``-runN``)."""
    first = tree / host / "main" / "vllm-8qps-gpt-oss-120b.json"
    data = json.loads(first.read_text())
    first.write_text(json.dumps({**data, "output_throughput": values[0]}))
    for n, value in enumerate(values[1:], start=2):
        (first.parent / f"vllm-8qps-gpt-oss-120b-run{n}.json").write_text(json.dumps({**data, "output_throughput": value}))


def test_repeated_runs_count_once_by_their_median_with_their_spread_and_confirm_an_outlier(tmp_path: Path) -> None:
    tree = results(tmp_path, {("gpu-1", "main"): 480.0, ("gpu-2", "main"): 470.0, ("gpu-3", "main"): 400.0})
    repeat(tree, "gpu-1", [480.0, 470.0, 490.0])
    repeat(tree, "gpu-2", [470.0, 475.0, 465.0])
    repeat(tree, "gpu-3", [400.0, 405.0, 395.0])
    runs = report.load(tree)
    assert len(runs) == 9
    # The fleet sums each instance once, by its median: not three runs of each.
    assert report.fleet_rows(runs)[1][2:4] == ["3", "1350.00"]
    rows = {row[0]: row for row in report.run_rows(runs)[1:]}
    assert rows["gpu-1"][4:5] == ["3"] and rows["gpu-1"][7] == "480.00 (470.00-490.00, 3 runs)"
    (flagged,) = report.outliers(runs)
    assert (flagged.run.host, flagged.runs, flagged.confirmed) == ("gpu-3", 3, True)
    # A best run within 10% of the peers leaves it unconfirmed.
    repeat(tree, "gpu-3", [400.0, 405.0, 460.0])
    (flagged,) = report.outliers(report.load(tree))
    assert not flagged.confirmed


def test_report_writes_markdown_plots_and_prints_the_fleet_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = results(tmp_path, {("gpu-1", "main"): 479.07, ("gpu-2", "main"): 300.0})
    assert main(["report", str(tree)]) == 0
    out = capsys.readouterr().out
    assert "seed-001-gpt-oss" in out and "779.07" in out  # two instances' output throughput, summed
    text = (tree / "report.md").read_text()
    assert "**gpu-2** main" in text and "| gpu-1 | main | seed-001-gpt-oss | output_throughput | 479.07 | 479.07 | 1.00 |" in text
    for name in ("throughput", "ttft", "tpot", "instances"):
        png = tree / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"![{name}]({name}.png)" in text


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        (lambda p: None, "is not a directory"),
        (lambda p: p.mkdir(), "no vLLM result files"),
        (lambda p: (p.mkdir(), (p / "x.json").write_text('{"output_throughput": 1}')), "expected <host>/<instance>/<result>.json"),
        (lambda p: (p.mkdir(), (p / "a").mkdir(), (p / "a" / "b").mkdir(), (p / "a" / "b" / "r.json").write_text("{")), "not a vLLM"),
    ],
)
def test_bad_results_directories_fail_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str], setup, says: str) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "results"
    setup(target)
    assert main(["report", str(target)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


# vLLM's result for a run that lost requests: its own fields (vllm/benchmarks/serve.py), "" for a request that succeeded.
RESET = "ConnectionResetError: [Errno 104] Connection reset by peer"
TRACEBACK = f'Traceback (most recent call last):\n  File "serve.py", line 1, in request\n{RESET}\n'
LOST = {"completed": 20, "failed": 12, "errors": [""] * 20 + [TRACEBACK] * 11 + ["Internal Server Error"]}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({}, None),  # the fixture: 80 completed, 0 failed
        (LOST, f"12 of 32 requests failed ({RESET}; Internal Server Error)"),
        # A vLLM that writes no "failed": counted from the errors.
        ({"failed": None, "completed": None, "errors": ["", "boom", "boom"]}, "2 requests failed (boom)"),
        ({"failed": True, "errors": []}, None),  # not a count
        ({"failed": 3, "completed": 5, "errors": []}, "3 of 8 requests failed"),
    ],
)
def test_failed_requests_are_counted_as_vllm_writes_them(fields: dict[str, object], says: str | None) -> None:
    data = {**json.loads(FIXTURE.read_text()), **fields}
    assert report.failed_requests({k: v for k, v in data.items() if v is not None}) == says


def test_a_run_that_lost_requests_is_listed_and_left_out_of_every_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = results(tmp_path, {("gpu-1", "main"): 479.07, ("gpu-2", "main"): 470.0, ("gpu-3", "main"): 900.0})
    lossy = tree / "gpu-3" / "main" / "vllm-8qps-gpt-oss-120b.json"
    lossy.write_text(json.dumps({**json.loads(lossy.read_text()), **LOST}))
    runs = report.load(tree)
    (gpu3,) = [r for r in runs if r.host == "gpu-3"]
    assert gpu3.failed and gpu3.unlike(report.REFERENCES["seed-001-gpt-oss"]) == gpu3.failed
    assert report.outliers(runs) == []  # gpu-3's 900 tok/s neither sets the median nor is compared
    assert report.fleet_rows(runs)[1][2:4] == ["2", "949.07"]
    assert [row[:6] for row in report.run_rows(runs)[1:]] == [
        ["gpu-1", "main", "seed-001-gpt-oss", "8", "1", "0"],
        ["gpu-2", "main", "seed-001-gpt-oss", "8", "1", "0"],
        ["gpu-3", "main", "seed-001-gpt-oss", "8", "1", "12"],
    ]
    assert {row[0] for row in report.reference_rows(runs)[1:]} == {"gpu-1", "gpu-2"}
    assert main(["report", str(tree)]) == 0
    assert f"Failed requests (left out above): gpu-3/main (12 of 32 requests failed ({RESET}" in capsys.readouterr().out
    text = (tree / "report.md").read_text()
    failed = text.split("## Failed requests")[1].split("##")[0]
    assert "**gpu-3** main (seed-001-gpt-oss, concurrency 8, vllm-8qps-gpt-oss-120b.json): 12 of 32 requests failed" in failed
    assert "gpu-3/main (seed-001-gpt-oss): 12 of 32 requests failed" in text  # not compared with the seed, and why
