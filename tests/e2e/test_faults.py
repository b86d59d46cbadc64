"""End to end: a host that is unreachable, hangs or dies mid-run fails alone, and the next run converges it.

Each test starts from the fault tests' inventory (``baseline``), so none depends on the order.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from fleetctl import BASELINE, container, deploy, fleet_tool, give_work, inventory, quiet, streamed_deploy

FLEET_SHARE = 0  # make test runs this module on fleet share 0, beside test_roll on share 1 (conftest.py)


def test_an_unreachable_host_is_one_clear_line_and_the_rest_converge(baseline: str, tmp_path: Path) -> None:
    ghost = inventory(tmp_path, "ghost", BASELINE, extra_hosts="ghosts = [('sim-ghost', {**base['sim_gpu'][0][1], 'ssh_port': 1})]\n")
    run = deploy(inventory=ghost)
    assert sorted(run.results["failed_hosts"]) == ["sim-ghost", "sim-nogpu"]
    assert run.results["totals"]["success"] == 0, run.changed()
    assert run.stderr.count("[sim-ghost] Could not connect") == 1 and "Traceback" not in run.stderr
    assert run.status("sim-ghost") == {"failed"} and "not reachable" in run.why("sim-ghost")
    quiet(deploy(inventory=baseline))


def test_a_host_that_hangs_mid_run_fails_alone(baseline: str, fleet: dict[str, Any], tmp_path: Path) -> None:
    short = inventory(tmp_path, "short", {**BASELINE, "command_timeout": 40})
    give_work(fleet, "sim-gpu-2")
    try:
        rc, output, seconds = streamed_deploy(short, "Beginning operation run", ["/usr/bin/docker", "pause", container(fleet, "sim-gpu-2")])
    finally:
        subprocess.run(["/usr/bin/docker", "unpause", container(fleet, "sim-gpu-2")], capture_output=True)
    assert rc != 0 and seconds < 120, f"rc {rc} after {seconds:.0f}s"
    assert "[sim-gpu-2] no answer within 40s" in output and "looks hung" in output
    assert "Traceback" not in output
    summary = output.split("Roll summary:")[-1]
    assert "sim-gpu-2" in summary and "failed" in summary.split("sim-gpu-2", 1)[1].splitlines()[0]
    repaired = deploy(inventory=short)  # the work the hung host never did
    assert {(h, names.split(" | ")[-1]) for h, names in repaired.changed()} == {("sim-gpu-2", "NUMA balancing off at boot")}
    quiet(deploy(inventory=short))


def test_a_host_killed_mid_run_fails_alone_and_converges_when_back(baseline: str, fleet: dict[str, Any]) -> None:
    give_work(fleet, "sim-gpu-2")
    try:
        rc, output, _ = streamed_deploy(baseline, "Beginning operation run", ["/usr/bin/docker", "kill", container(fleet, "sim-gpu-2")])
    finally:
        fleet_tool("revive", "sim-gpu-2")
    assert rc != 0 and "Traceback" not in output
    summary = output.split("Roll summary:")[-1]
    for host in ("sim-gpu-1", "sim-c1", "sim-c2"):
        assert "failed" not in "".join(line for line in summary.splitlines() if line.strip().startswith(host)), summary
    assert "failed" in "".join(line for line in summary.splitlines() if line.strip().startswith("sim-gpu-2")), summary
    back = deploy(inventory=baseline)
    assert back.results["failed_hosts"] == ["sim-nogpu"], back.stderr[-3000:]
    quiet(deploy(inventory=baseline))
