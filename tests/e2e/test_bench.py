"""End to end: bench on every instance and from a client host, refused mid-roll, and report reading its results.

On the fleet converged on inventories/local.py (the ``converged`` fixture), in any order.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from fleetctl import FIGURES, INVENTORY, Run, deploy, run_cli, ssh

from instinct_fleet.model import paths

FLEET_SHARE = 1  # beside test_roll (conftest.py)
INSTANCES = {("sim-gpu-1", "main"), ("sim-gpu-1", "batch"), ("sim-gpu-2", "llama-a"), ("sim-gpu-2", "oss"), ("sim-c1", "llama-405b")}


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*argv)


def test_bench_runs_the_seed_profile_on_every_instance_and_report_reads_it(converged: Run, tmp_path: Path) -> None:
    started = time.monotonic()
    done = cli("bench", INVENTORY, "--profile", "seed-001-gpt-oss", "--num-prompts", "8", "--output", str(tmp_path))
    FIGURES.append(f"bench, seed-001 profile shortened to 8 prompts, 5 instances: {time.monotonic() - started:.0f}s")
    assert done.returncode == 1, done.stdout + done.stderr  # sim-nogpu's instance is refused
    assert "sim-nogpu/main seed-001-gpt-oss concurrency 8, 8 prompts: refused, the instance is not serving" in done.stderr
    assert "[5/5]" in done.stdout and "done in" in done.stdout
    (stamp,) = tmp_path.iterdir()
    for host, instance in INSTANCES:
        result = json.loads((stamp / host / instance / "seed-001-gpt-oss-c8.json").read_text())
        assert result["completed"] == 8 and result["max_concurrency"] == 8 and result["label"] == "seed-001-gpt-oss"
        assert result["total_input_tokens"] >= 8 * 4096 * 0.99 and result["output_lens"] == [1024] * 8
        assert 0 < result["median_ttft_ms"] < result["median_e2el_ms"] and result["median_tpot_ms"] > 0
        config = json.loads((stamp / host / instance / "config.json").read_text())
        assert config["image"].endswith(":v0.22.0") and config["image_id"].startswith("sha256:") and config["vllm_version"] == "0.22.0"
        assert config["recipe"] and "--port" in config["vllm_serve_args"] and config["profile_settings"]["input_len"] == 4096
    report = cli("report", str(stamp))
    assert report.returncode == 0, report.stderr
    text = (stamp / "report.md").read_text()
    # 8 prompts are not 001's 80: no run is set against the seed's figures, and each says which field differs.
    assert "No run is like a seed's measurement" in text and "| output_throughput | 479.07 |" not in text
    assert "sim-gpu-1/main (seed-001-gpt-oss): no comparable reference: prompt count 8, the seed's 80" in text
    assert "sim-gpu-2/llama-a (seed-001-gpt-oss): no comparable reference: model meta-llama/Llama-3.1-70B-Instruct" in text
    assert all(json.loads((stamp / h / i / "config.json").read_text())["gpu_model"] == "MI300X" for h, i in INSTANCES)
    assert {p.name for p in stamp.glob("*.png")} == {"throughput.png", "ttft.png", "tpot.png", "instances.png"}


def test_bench_from_a_client_host_reaches_the_instance_over_the_network(converged: Run, tmp_path: Path) -> None:
    argv = ["--limit", "sim-gpu-1", "--instance", "main", "--client", "sim-gpu-2", "--profile", "latency", "--num-prompts", "4"]
    done = cli("bench", INVENTORY, *argv, "--output", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    (stamp,) = tmp_path.iterdir()
    assert [p.name for p in stamp.iterdir()] == ["sim-gpu-1"]
    assert json.loads((stamp / "sim-gpu-1" / "main" / "config.json").read_text())["client"] == "sim-gpu-2"
    result = json.loads((stamp / "sim-gpu-1" / "main" / "latency-c1.json").read_text())
    assert (result["completed"], result["max_concurrency"], result["output_lens"]) == (4, 1, [128] * 4)


def test_bench_refuses_a_host_whose_roll_is_in_progress(converged: Run, fleet: dict[str, Any], tmp_path: Path) -> None:
    ssh(fleet, "sim-gpu-2", f"mkdir -p /run/instinct-fleet && echo 'roll batch 1 started 2026-11-23T00:00:00Z' > {paths.ROLL_MARKER}")
    done = cli("bench", INVENTORY, "--limit", "sim-gpu-2", "--num-prompts", "2", "--output", str(tmp_path))
    assert done.returncode == 1
    assert "refused, a roll is in progress on sim-gpu-2 (roll batch 1 started" in done.stderr
    assert not list(tmp_path.iterdir())
    cleared = deploy().changed_ops()  # a marker left behind by a roll that failed goes once the host is whole
    assert cleared == {("sim-gpu-2", "Roll: done on this host")}, cleared


def test_bench_accuracy_asks_the_probe_alone_and_report_reads_the_answers(converged: Run, tmp_path: Path) -> None:
    """sim-gpu-2's instances need the API key (inventories/local.py): the probe's client sends it as bench does."""
    started = time.monotonic()
    done = cli("bench", INVENTORY, "--accuracy", "--limit", "sim-gpu-*", "--output", str(tmp_path))
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    (stamp,) = tmp_path.iterdir()
    assert stamp.name.endswith("-probe") and "asking the accuracy probe (200 items, built-in) of 4 instance(s)" in done.stdout
    for host, instance in sorted(INSTANCES - {("sim-c1", "llama-405b")}):
        stored = json.loads((stamp / host / instance / "probe.json").read_text())
        assert stored["probe"]["items"] == 200 and 170 <= stored["probe"]["right"] <= 196, (host, instance, stored["probe"])
        assert all(a["error"] is None and a["text"] for a in stored["answers"])
        assert f"{host}/{instance}: probe accuracy " in done.stdout
    report = cli("report", str(stamp))
    assert report.returncode == 0 and "accuracy" in report.stdout, report.stderr
    assert "| sim-gpu-2 | oss | 200 |" in (stamp / "report.md").read_text()
    FIGURES.append(f"bench --accuracy, 200 built-in items on 4 instances of 2 hosts: {seconds:.0f}s")
