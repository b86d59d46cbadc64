"""GPU health on the simulated fleet: the stand-in amd-smi reads a per-host fault file (tests/fleet/standin/amd-smi),
the host's watch and the deploy judge its evidence, quarantine what an error touches, and the deploy re-admits once it
clears.

On share 0, on the fault tests' inventory (BASELINE): it leaves the fleet as it found it, faults cleared and every
instance back in its pool.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetctl import BASELINE, ROOT, Load, deploy, inventory, pool, quiet, router_url, run_cli, ssh, until

FLEET_SHARE = 1  # beside test_roll (conftest.py)
FAULTS = "/etc/instinct-fleet-standin/faults.json"  # what the stand-in amd-smi reads (tests/fleet/standin/amd-smi)
HOST = "sim-gpu-2"  # vllm-llama-a on GPUs 0-3, vllm-oss on GPU 4 (in the router's pool of gpt-oss-120b)
QUARANTINE = "/var/lib/instinct-fleet/quarantine.json"


def faults(fleet: dict[str, Any], value: dict[str, Any] | None) -> None:
    if value is None:
        ssh(fleet, HOST, f"rm -f {FAULTS}")
    else:
        ssh(fleet, HOST, f"mkdir -p {FAULTS.rsplit('/', 1)[0]} && printf '%s' {shlex.quote(json.dumps(value))} > {FAULTS}")


def cli(command: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_cli(command, "--project-dir", str(ROOT), *argv)


def active(fleet: dict[str, Any], unit: str) -> str:
    return ssh(fleet, HOST, f"systemctl is-active {unit} || true").strip()


def watched(address: str, unit: str) -> dict[str, Any]:
    """What the host's watch says of one instance (GET /state on watch_port)."""
    with urllib.request.urlopen(f"http://{address}:9401/state", timeout=10) as reply:
        return dict(json.loads(reply.read())["instances"][unit])


def test_an_uncorrectable_ecc_gpu_is_quarantined_under_load_admitted_once_cleared_and_an_operator_holds_one_out(
    fleet: dict[str, Any], baseline: str, tmp_path: Path
) -> None:
    address = next(h["address"] for h in fleet["hosts"] if h["name"] == HOST)
    oss = f"http://{address}:8001"
    until(lambda: oss in pool(fleet), 60)

    # (1) Two uncorrectable errors in GPU 4's memory under steady load. Between deploys, the host's watch reads the
    # same evidence (every watch_gpu_interval, 30 s): it drains vllm-oss out of the router and stops it; vllm-llama-a
    # on GPUs 0-3 serves on, and no client request fails.
    faults(fleet, {"gpus": {"4": {"uncorrectable": 2, "block": "UMC"}}})
    with Load(router_url(fleet), key=fleet["api_key"]) as load:
        out = until(lambda: oss not in pool(fleet), 60)
        left = time.monotonic()
        until(lambda: active(fleet, "vllm-oss") == "inactive", 60)
        time.sleep(3)
    assert out <= 30 + 10, out  # a reading and the router call
    assert load.failed() == [] and [s for s in load.done if s.at >= left and s.ok] != [], (load.failed()[:5], len(load.done))
    seen = watched(address, "vllm-oss")
    assert seen["state"] == "quarantined" and "GPU 4: 2 uncorrectable ECC error(s) (blocks: UMC 2)" in seen["reason"], seen
    assert watched(address, "vllm-llama-a")["state"] == "in" and active(fleet, "vllm-llama-a") == "active"
    journal = ssh(fleet, HOST, "journalctl -u instinct-fleet-watch -p err --no-pager -o cat")
    assert "vllm-oss is quarantined: GPU 4: 2 uncorrectable ECC error(s)" in journal, journal[-2000:]

    # The next deploy reads the evidence too: it holds vllm-oss out and records why; no client request fails.
    with Load(router_url(fleet), key=fleet["api_key"]) as load:
        time.sleep(2)
        run = deploy(inventory=baseline)
        time.sleep(2)
    assert run.results["failed_hosts"] == ["sim-nogpu"], run.stderr[-3000:]
    rows = {(r["host"], r["instance"]): r for r in run.roll}
    held = rows[(HOST, "vllm-oss")]
    assert held["status"] == "quarantined" and "GPU 4: 2 uncorrectable ECC error(s) (blocks: UMC 2)" in held["why"], held
    assert load.failed() == [] and load.served(True) + load.served(False) >= 20, (load.failed()[:5], len(load.done))
    assert oss not in pool(fleet)
    assert active(fleet, "vllm-oss") == "inactive" and active(fleet, "vllm-llama-a") == "active"
    record = json.loads(ssh(fleet, HOST, f"cat {QUARANTINE}"))
    assert list(record["units"]) == ["vllm-oss"] and "[gpu-ecc-uncorrectable]" in record["units"]["vllm-oss"][0]
    quiet(deploy(inventory=baseline))  # the same evidence again: nothing to change

    # status shows it, and the verdict; verify names the GPU.
    shown = cli("status", baseline, "--limit", HOST, "--json")
    assert shown.returncode == 1, shown.stderr[-2000:]
    seen = {r["instance"]: r for r in json.loads(shown.stdout)}
    assert seen["oss"]["quarantined"] and "GPU 4" in seen["oss"]["quarantined"] and seen["llama-a"]["ok"]
    assert "GPU 4: 2 uncorrectable ECC" in seen["gpu health"]["error"]
    planned = cli("plan", baseline, "--limit", HOST, "--gpus")  # the verdict the next deploy acts on, per GPU
    assert planned.returncode == 1 and f"  {HOST}: 1 error(s)" in planned.stdout, planned.stdout[-3000:] + planned.stderr[-2000:]
    assert "error: GPU 4: 2 uncorrectable ECC error(s) (blocks: UMC 2)" in planned.stdout
    checked = cli("verify", baseline, "--limit", HOST, "--", "-q", "-k", "gpus_are_healthy or watch_holds or units_are")
    assert checked.returncode != 0 and "GPU 4: 2 uncorrectable ECC" in checked.stdout, checked.stdout[-3000:]

    # (2) admit reads the evidence again and refuses while it is there.
    refused = cli("admit", baseline, HOST, "-y")
    assert refused.returncode != 0 and "[quarantine-admit]" in refused.stderr, refused.stderr[-3000:]
    assert active(fleet, "vllm-oss") == "inactive"

    # (3) The counter clears (a GPU reset): the next deploy re-admits it behind its health gate, into its pool.
    faults(fleet, None)
    back = deploy(inventory=baseline)
    assert back.results["failed_hosts"] == ["sim-nogpu"], back.stderr[-3000:]
    assert "quarantined" not in back.status(HOST)
    until(lambda: oss in pool(fleet), 60)
    assert active(fleet, "vllm-oss") == "active"
    assert len(json.loads(ssh(fleet, HOST, f"cat {QUARANTINE}"))["readmitted"]) == 1

    # (4) An operator holds GPU 4 out whatever its evidence, and admits it back.
    taken = cli("quarantine", baseline, HOST, "--gpu", "4", "--reason", "RMA ticket 41", "-y")
    assert taken.returncode == 0, taken.stderr[-3000:]
    assert oss not in pool(fleet) and active(fleet, "vllm-oss") == "inactive"
    assert "RMA ticket 41 (by an operator)" in json.loads(ssh(fleet, HOST, f"cat {QUARANTINE}"))["units"]["vllm-oss"][0]
    quiet(deploy(inventory=baseline))  # a plain deploy keeps the operator's quarantine
    admitted = cli("admit", baseline, HOST, "-y")
    assert admitted.returncode == 0, admitted.stderr[-3000:]
    until(lambda: oss in pool(fleet), 60)

    # (5) Firmware and an XGMI bit rate that drift from the fleet: named with both values (warnings on this inventory).
    faults(fleet, {"gpus": {"0": {"firmware": "00159999"}, "1": {"xgmi_rate": 16}}})
    drift = deploy(inventory=inventory(tmp_path, "drift", {**BASELINE, "gpu_health_levels": {"gpu-fleet-drift": "warning"}}))
    faults(fleet, None)
    assert "GPU 0: firmware 00159999, where the fleet's majority is 00159017 [gpu-fleet-drift]" in drift.stderr, drift.stderr[-3000:]
    assert "GPU 1: XGMI bit rate 16 Gb/s, where the fleet's majority is 32 Gb/s [gpu-fleet-drift]" in drift.stderr
    assert "quarantined" not in drift.status(HOST)
