"""End to end: weights staged once per fleet, status, and a real Prometheus scraping the fleet (bench and report: test_bench.py).

On the fleet converged on inventories/local.py (the ``converged`` fixture), in any order. Prometheus is
Debian's package, run on the test machine against the file_sd that
``instinct-fleet targets`` writes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetctl import CLI, FIGURES, INVENTORY, ROOT, Run, deploy, ssh

from instinct_fleet.model import paths

FLEET_SHARE = 2  # beside test_roll_gates, before it (conftest.py)
OSS = "openai/gpt-oss-120b"
INSTANCES = {("sim-gpu-1", "main"), ("sim-gpu-1", "batch"), ("sim-gpu-2", "llama-a"), ("sim-gpu-2", "oss"), ("sim-c1", "llama-405b")}
EXPORTERS = {"sim-gpu-1", "sim-c1", "sim-c2"}
LLAMA = "/var/lib/instinct-fleet/huggingface/hub/models--meta-llama--Llama-3.1-70B-Instruct"


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_lost_weights_are_copied_again_from_the_fleet_store_not_downloaded(converged: Run, fleet: dict[str, Any]) -> None:
    store = Path(fleet["weights_dir"]) / "hub"
    assert sorted(p.name for p in store.iterdir()) == ["models--meta-llama--Llama-3.1-70B-Instruct", "models--openai--gpt-oss-120b"]
    ssh(fleet, "sim-gpu-2", f"rm -rf {LLAMA}")
    repaired = deploy().changed_ops()
    assert repaired == {("sim-gpu-2", "Copy meta-llama/Llama-3.1-70B-Instruct into the Hugging Face cache")}, repaired
    staged = ssh(fleet, "sim-gpu-2", f"cat {LLAMA}/.instinct-fleet-staged").split()
    assert staged[0] == "main" and ssh(fleet, "sim-gpu-2", f"test -f {LLAMA}/snapshots/{staged[1]}/config.json && echo ok").strip() == "ok"


def settled(*argv: str) -> subprocess.CompletedProcess[str]:
    """``status`` once every unit answers (an exporter started a moment ago is active before it listens), within 60 s."""
    deadline = time.monotonic() + 60
    while True:
        done = cli("status", *argv)
        if done.returncode == 0 or time.monotonic() > deadline:
            return done
        time.sleep(2)


def test_status_agrees_with_the_units(converged: Run, fleet: dict[str, Any]) -> None:
    done = settled(INVENTORY, "--limit", "sim-[gc]*", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    assert {(r["host"], r["instance"]) for r in rows if r["port"] and r["pool"] is None} == INSTANCES
    # Each router's row: its pool as the router's health checks see it (sim-nogpu's instance never answers).
    pools = {r["instance"]: r["pool"] for r in rows if r["pool"] is not None}
    assert pools == {OSS: "3 of 4 healthy"}, pools
    health = {r["host"]: r for r in rows if r["instance"] == "gpu health"}  # the GPU health verdict, one row per host
    assert set(health) == {"sim-gpu-1", "sim-gpu-2", "sim-c1", "sim-c2"} and all(r["ok"] and r["health"] == "ok" for r in health.values())
    for row in rows:
        if row["instance"] == "gpu health":
            continue
        active = ssh(fleet, row["host"], f"systemctl show -p ActiveState --value {row['unit']}").strip()
        assert row["state"] == active == "active", row
    ssh(fleet, "sim-c2", f"systemctl stop {paths.EXPORTER_UNIT}")
    stopped = cli("status", INVENTORY, "--limit", "sim-c2", "--json")
    assert stopped.returncode == 1
    (exporter,) = [r for r in json.loads(stopped.stdout) if r["instance"] == paths.EXPORTER_UNIT]
    actual = ssh(fleet, "sim-c2", f"systemctl show -p ActiveState --value {paths.EXPORTER_UNIT}").strip()
    assert exporter["host"] == "sim-c2" and exporter["state"] == actual == "inactive" and not exporter["ok"]
    repaired = deploy().changed_ops()
    assert repaired == {("sim-c2", f"{paths.EXPORTER_UNIT} running and enabled")}, repaired
    assert settled(INVENTORY, "--limit", "sim-c2").returncode == 0


@pytest.fixture
def prometheus(converged: Run, tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    targets, alerts = tmp_path / "targets.json", tmp_path / "alerts.yml"
    done = cli("targets", INVENTORY, "-o", str(targets), "--alerts", str(alerts))
    assert done.returncode == 0, done.stderr
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: ['{alerts}']\n"
        f"scrape_configs:\n  - job_name: instinct-fleet\n    file_sd_configs:\n      - files: ['{targets}']\n"
    )
    address = "127.0.0.1:19090"
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address={address}"]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    try:
        yield f"http://{address}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}", timeout=5) as reply:
        return list(json.load(reply)["data"]["result"])


def test_prometheus_scrapes_every_vllm_instance_and_exporter(prometheus: str) -> None:
    expected = {("vllm", host, instance, "1") for host, instance in INSTANCES}
    expected |= {("amd-device-metrics", host, paths.EXPORTER_UNIT, "1") for host in EXPORTERS}
    expected.add(("vllm", "sim-nogpu", "main", "0"))  # in the inventory, but it failed preflight: down
    expected.add(("vllm-router", "sim-gpu-1", paths.router_unit(30000), "1"))  # the router's --prometheus-port
    # The watch of every host that serves (sim-nogpu's was never installed: it failed preflight).
    expected |= {("instinct-fleet-watch", host, paths.WATCH_UNIT, "1") for host in ("sim-gpu-1", "sim-gpu-2", "sim-c1")}
    expected.add(("instinct-fleet-watch", "sim-nogpu", paths.WATCH_UNIT, "0"))
    deadline = time.monotonic() + 90
    seen: set[tuple[str, str, str, str]] = set()
    while time.monotonic() < deadline and seen != expected:
        time.sleep(1)
        try:
            seen = {(r["metric"]["job"], r["metric"]["host"], r["metric"]["instance"], r["value"][1]) for r in query(prometheus, "up")}
        except OSError:
            continue
    FIGURES.append(f"Prometheus: every target scraped as expected after {90 - (deadline - time.monotonic()):.0f}s")
    assert seen == expected
    running = query(prometheus, "vllm:num_requests_running")
    assert {(r["metric"]["host"], r["metric"]["instance"]) for r in running} == INSTANCES
    assert all(r["metric"]["model_name"] for r in running)
    gfx = query(prometheus, "gpu_gfx_activity")
    assert {r["metric"]["host"] for r in gfx} == EXPORTERS
    assert {r["metric"]["card_series"] for r in gfx} == {"AMD Instinct MI300X OAM"}
    assert len(gfx) == 8 * len(EXPORTERS)  # one series per GPU
    # The GPU health alerts load beside the targets and evaluate on the exporters' series: healthy GPUs, none firing.
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=5) as reply:
        (group,) = json.load(reply)["data"]["groups"]
    assert group["name"] == "instinct-fleet-gpu-health" and len(group["rules"]) == 5
    assert {r["health"] for r in group["rules"]} == {"ok"} and {r["state"] for r in group["rules"]} == {"inactive"}, group["rules"]
    assert query(prometheus, "pcie_max_speed") and query(prometheus, "gpu_memory_temperature")  # the fields the alerts read


def test_the_exporter_port_answers_only_prometheus_allow_from(converged: Run, fleet: dict[str, Any]) -> None:
    c1 = next(h["address"] for h in fleet["hosts"] if h["name"] == "sim-c1")
    # sim-gpu-1 may reach sim-c1's vLLM port (vllm_allow_from) but is no scraper.
    assert ssh(fleet, "sim-gpu-1", f"curl -s -o /dev/null -w '%{{http_code}}' -m 3 http://{c1}:18004/health").strip() == "200"
    refused = ssh(fleet, "sim-gpu-1", f"curl -s -o /dev/null -m 3 http://{c1}:5000/metrics; echo $?").strip()
    assert refused == "28", refused  # the packet is dropped: curl times out
