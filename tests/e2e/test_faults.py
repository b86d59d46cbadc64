"""End to end: a host that is unreachable, hangs or dies mid-run, or whose instance never serves, fails alone, and
the next run converges it.

Each test starts from the fault tests' inventory (``baseline``), so none depends on the order.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fleetctl import (
    BASELINE,
    container,
    deploy,
    fleet_tool,
    give_work,
    inventory,
    quiet,
    serving_files,
    started_at,
    streamed_deploy,
)

FLEET_SHARE = 0  # with test_deploy, test_watch and the short modules of share 1's router and floor (conftest.py)
FLEET_LAST = True  # it leaves the fleet on BASELINE: after the modules on inventories/local.py (conftest.py)


def test_an_unreachable_host_is_one_clear_line_and_the_rest_converge(baseline: str, tmp_path: Path) -> None:
    ghost = inventory(
        tmp_path,
        "ghost",
        BASELINE,
        extra_hosts="ghosts = [('sim-ghost', {**base['sim_gpu'][0][1], 'ssh_port': 1, 'router': False, 'vllm_instances': []})]\n",
    )
    run = deploy(inventory=ghost)
    assert sorted(run.results["failed_hosts"]) == ["sim-ghost", "sim-nogpu"]
    assert run.results["totals"]["success"] == 0, run.changed()
    assert run.stderr.count("[sim-ghost] Could not connect") == 1 and "Traceback" not in run.stderr
    assert run.status("sim-ghost") == {"failed"} and "not reachable" in run.why("sim-ghost")
    quiet(deploy(inventory=baseline))


# The line a host's deploy file prints once its plan is made: after its preflight fact, before any operation
# runs (nothing talks to the host in between). A fault injected there lands before the host's first operation.
READY = "[sim-gpu-2] Ready: deploy.py"


def fault_mid_run(fleet: dict[str, Any], inventory_path: str, fault: list[str], undo: Callable[[], object]) -> tuple[int, str, float]:
    """A deploy in which sim-gpu-2 has one operation and ``fault`` hits it once the host is ready; ``undo`` after.

    docker can lose the race to that one operation (its command may finish before the pause or the kill lands): that
    run tested no fault, so it is made again, at most three times."""
    for _ in range(3):
        give_work(fleet, "sim-gpu-2")
        try:
            rc, output, seconds = streamed_deploy(inventory_path, READY, fault)
        finally:
            undo()
        if "[sim-gpu-2] Success" not in output:
            break
    return rc, output, seconds


def test_a_host_that_hangs_mid_run_fails_alone(baseline: str, fleet: dict[str, Any], tmp_path: Path) -> None:
    short = inventory(tmp_path, "short", {**BASELINE, "command_timeout": 40})
    pause, unpause = (["/usr/bin/docker", verb, container(fleet, "sim-gpu-2")] for verb in ("pause", "unpause"))
    rc, output, seconds = fault_mid_run(fleet, short, pause, lambda: subprocess.run(unpause, capture_output=True))
    assert rc != 0 and seconds < 120, f"rc {rc} after {seconds:.0f}s"
    assert "[sim-gpu-2] no answer within 40s" in output and "looks hung" in output
    assert "Traceback" not in output
    summary = output.split("Roll summary:")[-1]
    assert "sim-gpu-2" in summary and "failed" in summary.split("sim-gpu-2", 1)[1].splitlines()[0]
    # The work the hung host never did, and only that: its one operation, unless the command it had already
    # received finished once the host was unpaused (the file is then there, and nothing is left to repair).
    repaired = deploy(inventory=short)
    assert {(h, names.split(" | ")[-1]) for h, names in repaired.changed()} <= {("sim-gpu-2", "NUMA balancing off at boot")}
    assert repaired.results["failed_hosts"] == ["sim-nogpu"], repaired.stderr[-3000:]
    quiet(deploy(inventory=short))


def test_a_host_killed_mid_run_fails_alone_and_converges_when_back(baseline: str, fleet: dict[str, Any]) -> None:
    kill = ["/usr/bin/docker", "kill", container(fleet, "sim-gpu-2")]
    rc, output, _ = fault_mid_run(fleet, baseline, kill, lambda: fleet_tool("revive", "sim-gpu-2"))
    assert rc != 0 and "Traceback" not in output
    summary = output.split("Roll summary:")[-1]
    for host in ("sim-gpu-1", "sim-c1", "sim-c2"):
        assert "failed" not in "".join(line for line in summary.splitlines() if line.strip().startswith(host)), summary
    assert "failed" in "".join(line for line in summary.splitlines() if line.strip().startswith("sim-gpu-2")), summary
    back = deploy(inventory=baseline)
    assert back.results["failed_hosts"] == ["sim-nogpu"], back.stderr[-3000:]
    quiet(deploy(inventory=baseline))


def test_an_instance_that_never_becomes_healthy_fails_its_host_alone(
    baseline: str, fleet: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rolling_on_failure = "stop": the failed unit stays as it failed, its host alone fails; the wait was never silent."""
    stop = {**BASELINE, "rolling_on_failure": "stop"}
    sick = inventory(tmp_path, "sick", stop, {"sim-gpu-1": {"vllm_env": {"STANDIN_NEVER_HEALTHY": "1"}, "health_timeout": 15}})
    other = started_at(fleet, "sim-gpu-2", "vllm-llama-a")
    monkeypatch.setenv("INSTINCT_FLEET_PROGRESS_INTERVAL", "4")
    run = deploy(inventory=sick)
    monkeypatch.delenv("INSTINCT_FLEET_PROGRESS_INTERVAL")
    assert "sim-gpu-1" in run.results["failed_hosts"]
    # Every few seconds a line, with the phase the unit's journal shows (the stand-in logs vLLM's own start-up lines).
    waits = re.findall(
        r"waiting: sim-gpu-1 vllm-main.service: health gate on :\d+(?: \(([^)]*)\))?, \d+s so far, at most \d+s left", run.stderr
    )
    assert waits and {"starting the API server", "capturing CUDA/HIP graphs"} & set(waits), run.stderr[-3000:]
    assert run.status("sim-gpu-1") == {"failed"} and "no answer within 15s (health_timeout)" in run.why("sim-gpu-1"), run.roll
    assert "last journal lines" in run.stderr
    assert {h for h, _ in run.changed()} == {"sim-gpu-1"}
    assert started_at(fleet, "sim-gpu-2", "vllm-llama-a") == other
    back = deploy(inventory=baseline)  # the fault removed: the host converges back
    assert back.results["failed_hosts"] == ["sim-nogpu"], back.stderr[-3000:]
    quiet(deploy(inventory=baseline))


def test_an_instance_that_fails_its_first_completion_fails_its_host_alone(baseline: str, fleet: dict[str, Any], tmp_path: Path) -> None:
    """/health and /v1/models answer, but the engine dies at its first forward pass: the gate's one-token
    completion catches it at once (health.serving), with the answer, instead of calling the unit healthy;
    the host goes back to its healthy generation, which answers again."""
    broken = inventory(tmp_path, "first-completion", BASELINE, {"sim-gpu-1": {"vllm_env": {"STANDIN_FAIL_COMPLETIONS": "1"}}})
    other = started_at(fleet, "sim-gpu-2", "vllm-llama-a")
    files = serving_files(fleet)
    run = deploy(inventory=broken)
    assert run.rc != 0 and "sim-gpu-1" in run.results["failed_hosts"]
    why = run.why("sim-gpu-1")
    assert run.status("sim-gpu-1") == {"rolled-back"} and "its first completion failed" in why and "HTTP 500" in why, run.roll
    assert "EngineCore encountered an issue" in why
    assert started_at(fleet, "sim-gpu-2", "vllm-llama-a") == other
    assert serving_files(fleet) == files
    quiet(deploy(inventory=baseline))  # back on the baseline's files, serving: nothing to do
