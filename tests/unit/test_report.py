"""The benchmark report on vLLM result files: tables, the seed comparison, outliers and the plots."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from instinct_fleet.cli import main
from instinct_fleet.fleet import report

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-bench-serve_gpt-oss-120b_seed001.json"
GPT_OSS_TP1 = {"model": "openai/gpt-oss-120b", "gpus": [0]}  # what bench's config.json says of 001's configuration


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


def test_the_seed_is_compared_only_with_the_same_model_and_configuration(tmp_path: Path) -> None:
    seed_profile_run(tmp_path, "llama", {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpus": [0]})
    seed_profile_run(tmp_path, "tp8", {"model": "openai/gpt-oss-120b", "gpus": list(range(8))})
    seed_profile_run(tmp_path, "bare", None)
    runs = report.load(tmp_path / "r")
    assert report.reference_rows(runs) == [report.reference_rows([])[0]]
    assert report.not_compared(runs) == [
        "bare/main (seed-001-gpt-oss): no config.json beside it says what it ran",
        "llama/main (seed-001-gpt-oss): it served meta-llama/Llama-3.1-8B-Instruct, the seed openai/gpt-oss-120b",
        "tp8/main (seed-001-gpt-oss): it ran on 8 GPU(s), the seed on 1",
    ]
    assert report.seed_marks(runs, "output_throughput") == ()
    text, _ = report.write(tmp_path / "r")
    assert "No run is like a seed's measurement" in text.read_text() and "tp8/main" in text.read_text()


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
