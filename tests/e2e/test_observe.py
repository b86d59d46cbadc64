"""End to end: weights staged once per fleet, status, and a real Prometheus scraping the fleet (bench and report: test_bench.py).

On the fleet converged on inventories/local.py (the ``converged`` fixture), in any order. Prometheus and
Alertmanager are Debian's packages, run on the test machine against the file_sd, the rule file and the
Alertmanager config that ``instinct-fleet targets`` writes; a webhook in this process receives the alerts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fleetctl import FIGURES, INVENTORY, ROOT, Run, deploy, inventory, run_cli, ssh, until

from instinct_fleet.commands import picture
from instinct_fleet.model import paths

FLEET_SHARE = 2  # beside test_roll_gates, before it (conftest.py)
OSS = "openai/gpt-oss-120b"
INSTANCES = {("sim-gpu-1", "main"), ("sim-gpu-1", "batch"), ("sim-gpu-2", "llama-a"), ("sim-gpu-2", "oss"), ("sim-c1", "llama-405b")}
EXPORTERS = {"sim-gpu-1", "sim-c1", "sim-c2"}
LLAMA = "/var/lib/instinct-fleet/huggingface/hub/models--meta-llama--Llama-3.1-70B-Instruct"


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*argv)


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


class Hook(BaseHTTPRequestHandler):
    """The receiver Alertmanager delivers to: each notification's alerts, as (status, alertname, host, instance)."""

    seen: ClassVar[list[tuple[str, str, str, str]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        for alert in body["alerts"]:
            labels = alert["labels"]
            Hook.seen.append((alert["status"], labels["alertname"], labels.get("host", ""), labels.get("instance", "")))
        self.send_response(200)
        self.end_headers()


@pytest.fixture
def prometheus(converged: Run, tmp_path: Path) -> Iterator[str]:
    """Prometheus on the fleet's targets and rule file, sending to Alertmanager, which delivers to Hook; the rules from
    an inventory that differs only in alert_down_for (10 s, to wait less) and alert_webhook_url."""
    hook = ThreadingHTTPServer(("127.0.0.1", 19094), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    Hook.seen = []
    rules_from = inventory(tmp_path, "alerting", {"alert_down_for": "10s", "alert_webhook_url": "http://127.0.0.1:19094/hook"})
    targets, alerts, manager = tmp_path / "targets.json", tmp_path / "alerts.yml", tmp_path / "alertmanager.yml"
    (tmp_path / "boards").mkdir()
    written = ("-o", str(targets), "--alerts", str(alerts), "--alertmanager", str(manager), "--grafana", str(tmp_path / "boards"))
    done = cli("targets", rules_from, "--project-dir", str(ROOT), *written)
    assert done.returncode == 0, done.stderr
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: ['{alerts}']\n"
        "alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:19093']\n"
        f"scrape_configs:\n  - job_name: instinct-fleet\n    file_sd_configs:\n      - files: ['{targets}']\n"
    )
    address = "127.0.0.1:19090"
    argv = [
        shutil.which("prometheus") or "/usr/bin/prometheus",
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address={address}",
    ]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    delivers = [
        shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager",
        f"--config.file={manager}",
        f"--storage.path={tmp_path / 'alertmanager'}",
        "--web.listen-address=127.0.0.1:19093",
        "--cluster.listen-address=",
    ]
    alertmanager = subprocess.Popen(delivers, stdout=subprocess.DEVNULL, stderr=(tmp_path / "alertmanager.log").open("w"))
    try:
        yield f"http://{address}"
    finally:
        for process in (server, alertmanager):
            process.terminate()
            process.wait(timeout=30)
        hook.shutdown()
        hook.server_close()


def query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}", timeout=5) as reply:
        return list(json.load(reply)["data"]["result"])


def answered(url: str, promql: str) -> list[dict[str, Any]]:
    """The query's result, or none while Prometheus is still starting."""
    try:
        return query(url, promql)
    except OSError:
        return []


def test_prometheus_scrapes_every_vllm_instance_and_exporter(prometheus: str, tmp_path: Path) -> None:
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
    # The rule file loads beside the targets and every rule evaluates on the real series: healthy GPUs, none firing.
    with urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=5) as reply:
        groups = {g["name"]: g["rules"] for g in json.load(reply)["data"]["groups"]}
    assert set(groups) == {"instinct-fleet-gpu-health", "instinct-fleet-slo-ttft", "instinct-fleet-slo-success", "instinct-fleet-fleet"}
    assert len(groups["instinct-fleet-gpu-health"]) == 5
    assert {r["health"] for rules in groups.values() for r in rules} == {"ok"}, groups
    assert {r["state"] for r in groups["instinct-fleet-gpu-health"]} == {"inactive"}, groups["instinct-fleet-gpu-health"]
    assert query(prometheus, "pcie_max_speed") and query(prometheus, "gpu_memory_temperature")  # the fields the alerts read
    # The series the SLOs and the fleet's alerts read, as the fleet's writers expose them: the TTFT bound the SLO
    # selects (le="2.5", as vLLM's client writes it), the finish reasons, the router's pool, the watch's gauges.
    ttft = query(prometheus, 'vllm:time_to_first_token_seconds_bucket{job="vllm",le="2.5"}')
    assert {(r["metric"]["host"], r["metric"]["instance"]) for r in ttft} == INSTANCES
    assert {
        (r["metric"]["host"], r["metric"]["instance"]) for r in query(prometheus, 'vllm:request_success_total{finished_reason="error"}')
    } == INSTANCES
    assert {r["metric"]["instance"] for r in query(prometheus, "vllm_router_worker_health")} == {paths.router_unit(30000)}
    assert len(query(prometheus, "instinct_fleet_watch_quarantined")) == 5  # one per instance of the three watched hosts
    assert query(prometheus, "model:instinct_fleet_ttft_errors:ratio_rate5m") is not None
    # Every query of the Grafana boards, as Grafana sends it (its variables given values), is one Prometheus answers;
    # the panels of what always has a value show every model and host.
    grafana = {"$__rate_interval": "1m", "$model": ".*", "$host": ".*", "$instance": ".*"}
    answers: dict[str, int] = {}
    for name in ("instinct-fleet.json", "instinct-fleet-instance.json"):
        board = json.loads((tmp_path / "boards" / name).read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for variable, value in grafana.items():
                    expr = expr.replace(variable, value)
                answers[f"{board['uid']}: {panel['title']}"] = len(query(prometheus, expr))  # a bad query raises (HTTP 400)
    models = {r["metric"]["model"] for r in running}
    assert answers["instinct-fleet: Running requests"] == len(models) and answers["instinct-fleet: Instances up"] == 4, answers
    assert answers["instinct-fleet: Junction temperature"] == len(EXPORTERS) and answers["instinct-fleet: Quarantined"] == 3, answers
    # The same panels drawn without Grafana: the PNG's lines are the series Prometheus gives the board's query.
    png = tmp_path / "fleet.png"
    drawn = cli("report", "--fleet", INVENTORY, "--prometheus", prometheus, "--since", "5m", "-o", str(png))
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    panels = {p.title: p for p in picture.read_back(png)}
    up = {line.legend: line.points[-1][1] for line in panels["Instances up"].lines}
    assert up == {r["metric"]["host"]: float(r["value"][1]) for r in query(prometheus, 'sum by (host) (up{job="vllm"})')}
    assert up["sim-nogpu"] == 0 and up["sim-gpu-1"] == 2


def test_an_instance_that_stops_pages_through_alertmanager_and_resolves_when_it_is_back(prometheus: str, fleet: dict[str, Any]) -> None:
    until(lambda: answered(prometheus, 'up{job="vllm",host="sim-gpu-2",instance="llama-a"} == 1') != [], 90)
    ssh(fleet, "sim-gpu-2", "systemctl stop vllm-llama-a")
    try:
        fired = until(lambda: ("firing", "VllmInstanceDown", "sim-gpu-2", "llama-a") in Hook.seen, 120)
    finally:
        ssh(fleet, "sim-gpu-2", "systemctl start vllm-llama-a")
    resolved = until(lambda: ("resolved", "VllmInstanceDown", "sim-gpu-2", "llama-a") in Hook.seen, 180)
    FIGURES.append(f"Alertmanager: VllmInstanceDown delivered {fired:.0f} s after the stop, resolved {resolved:.0f} s after the start")
    # sim-nogpu's instance never answered: its alert fired too, and no other instance's did.
    assert {(a[2], a[3]) for a in Hook.seen if a[1] == "VllmInstanceDown"} <= {("sim-gpu-2", "llama-a"), ("sim-nogpu", "main")}


def test_the_exporter_port_answers_only_prometheus_allow_from(converged: Run, fleet: dict[str, Any]) -> None:
    c1 = next(h["address"] for h in fleet["hosts"] if h["name"] == "sim-c1")
    # sim-gpu-1 may reach sim-c1's vLLM port (vllm_allow_from) but is no scraper.
    assert ssh(fleet, "sim-gpu-1", f"curl -s -o /dev/null -w '%{{http_code}}' -m 3 http://{c1}:18004/health").strip() == "200"
    refused = ssh(fleet, "sim-gpu-1", f"curl -s -o /dev/null -m 3 http://{c1}:5000/metrics; echo $?").strip()
    assert refused == "28", refused  # the packet is dropped: curl times out
