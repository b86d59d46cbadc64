"""The watch on the simulated fleet: a hung engine (/health 200, no step, requests waiting: vllm#39863) behind the real
router is taken out of its pool, restarted and put back, under a steady client load; one that hangs after every
restart is left out after its budget, the deploy's pool sync does not put it back, and an operator re-admits it.

Last on share 0, on the fault tests' inventory (BASELINE: a 5 s drain) plus the watch's settings: no serving file
changes, so no roll, and it leaves the fleet serving.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetctl import BASELINE, Load, deploy, hang, inventory, pool, router_url, run_cli, ssh, until

FLEET_SHARE = 0

# A stall window the tests can wait for, and a budget of two restarts.
WATCHED = {"watch_interval": 1, "watch_stall_seconds": 8, "watch_max_restarts": 2}
UNIT = "vllm-batch"  # sim-gpu-1's second instance, on port 8081, in the router's pool of gpt-oss-120b


def watch_state(fleet: dict[str, Any]) -> dict[str, Any]:
    address = next(h["address"] for h in fleet["hosts"] if h["name"] == "sim-gpu-1")
    with urllib.request.urlopen(f"http://{address}:9401/state", timeout=10) as reply:
        return dict(json.loads(reply.read())["instances"][UNIT])


def test_a_hung_instance_leaves_the_pool_restarts_and_returns_and_one_that_always_hangs_is_left_out(
    fleet: dict[str, Any], baseline: str, tmp_path: Path
) -> None:
    watched = inventory(tmp_path, "watched", {**BASELINE, **WATCHED})
    run = deploy(inventory=watched)
    assert run.results["failed_hosts"] == ["sim-nogpu"], run.stderr[-3000:]
    changed = run.changed_ops()
    assert ("sim-gpu-1", "Watch config") in changed and not [op for _, op in changed if op.startswith("Roll:")], changed
    address = next(h["address"] for h in fleet["hosts"] if h["name"] == "sim-gpu-1")
    url = f"http://{address}:8081"
    until(lambda: url in pool(fleet) and watch_state(fleet)["state"] == "in", 60)

    # (1) One hang under load: out within the stall window and a reading, restarted, back after its gate.
    with Load(router_url(fleet), key=fleet["api_key"]) as load:
        time.sleep(3)
        hang(url, fleet["api_key"])
        out = until(lambda: url not in pool(fleet), 60)
        left = time.monotonic()
        until(lambda: url in pool(fleet), 120)
        time.sleep(3)
    assert out <= 8 + 2 * 1 + 5, out  # the stall window, two readings, and the router call
    # Requests sent to it between the hang and its leaving fail; none sent after it left does.
    assert [s.why for s in load.done if not s.ok and s.at >= left] == []
    assert load.served(True) + load.served(False) >= 40
    seen = watch_state(fleet)
    assert seen["state"] == "in" and seen["restarts"] == 1 and seen["restarts_total"] == 1, seen
    journal = ssh(fleet, "sim-gpu-1", "journalctl -u instinct-fleet-watch -p err --no-pager -o cat")
    assert f"{UNIT}: no engine step for" in journal and "out of its router pools" in journal, journal

    # (2) It hangs again after every restart: the second restart spends the budget of two, the next stall leaves it out.
    hang(url, fleet["api_key"])
    until(lambda: url not in pool(fleet), 60)
    until(lambda: url in pool(fleet), 120)
    hang(url, fleet["api_key"])
    with Load(router_url(fleet), key=fleet["api_key"]) as load:
        until(lambda: watch_state(fleet)["state"] == "left-out", 60)
        time.sleep(5)
    assert url not in pool(fleet)
    assert watch_state(fleet)["restarts"] == 2
    journal = ssh(fleet, "sim-gpu-1", "journalctl -u instinct-fleet-watch -p err --no-pager -o cat")
    assert f"{UNIT} is left out of its router pools" in journal, journal
    # status says so, with what to do; the deploy's pool sync does not put it back, nor does its roll.
    status = run_cli("status", watched, "--json")
    rows = [r for r in json.loads(status.stdout) if r["host"] == "sim-gpu-1" and r["instance"] == "batch"]
    assert rows and rows[0]["watch"] == "left-out" and not rows[0]["ok"], status.stdout[-2000:]
    # The deploy's health stage fails the host on the hung instance, and says the watch holds it out.
    again = deploy(inventory=watched)
    assert again.results["failed_hosts"] == ["sim-gpu-1", "sim-nogpu"], again.stderr[-3000:]
    assert "the watch holds it out of its router pools" in again.why("sim-gpu-1"), again.roll
    assert not [op for host, op in again.changed_ops() if host == "sim-gpu-1" and "Router pool" in op], again.changed_ops()
    assert url not in pool(fleet)

    # (3) The operator fixes it (here: a restart) and re-admits it, then deploys again (the failed deploy's roll marker
    # pauses the watch until a deploy finishes there): the deploy passes, the watch gates it and puts it back.
    ssh(fleet, "sim-gpu-1", f"systemctl restart {UNIT} && rm /var/lib/instinct-fleet/watch/{UNIT}.out")
    fixed = deploy(inventory=watched)
    assert fixed.results["failed_hosts"] == ["sim-nogpu"], fixed.stderr[-3000:]
    until(lambda: url in pool(fleet) and watch_state(fleet)["state"] == "in", 120)
