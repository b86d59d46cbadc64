"""The simulated fleet for the end-to-end tests: brought up fresh for the session, torn down after.

Set INSTINCT_FLEET_KEEP=1 to leave the hosts running for a look afterwards, and
INSTINCT_FLEET_REUSE=1 to run on a fleet that is already up (while working on a test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "tests" / "fleet" / "fleet.py"


FLEET_LOG: list[str] = []


def _fleet(command: str) -> None:
    done = subprocess.run([sys.executable, str(FLEET), command], cwd=ROOT, capture_output=True, text=True)
    FLEET_LOG.extend(line for line in done.stdout.splitlines() if line.startswith("[fleet"))
    assert done.returncode == 0, f"fleet {command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="session")
def fleet() -> Iterator[dict[str, Any]]:
    if not (os.environ.get("INSTINCT_FLEET_REUSE") and (ROOT / ".fleet" / "fleet.json").is_file()):
        _fleet("up")
    yield json.loads((ROOT / ".fleet" / "fleet.json").read_text())
    if not os.environ.get("INSTINCT_FLEET_KEEP"):
        _fleet("down")


@pytest.fixture(scope="session")
def first_run(fleet: dict[str, Any]) -> Any:
    """The fleet's first deploy of inventories/local.py, made by whichever test asks first: every test that
    needs a converged fleet asks for it through ``converged``, so no test depends on the file order."""
    from fleetctl import deploy

    return deploy()


@pytest.fixture(scope="module")
def converged(first_run: Any) -> Any:
    """The fleet on inventories/local.py at the start of a module: a no-op run after the first deploy, a
    re-converge after a module that left the fleet on another inventory."""
    from fleetctl import deploy

    run = deploy()
    assert run.results["failed_hosts"] == ["sim-nogpu"], run.stderr[-3000:]
    return run


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fleet's own timeline (image builds, host start) and the roll figures, for the CI log."""
    from fleetctl import FIGURES

    if FIGURES:
        terminalreporter.section("rolling re-tune figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
    if FLEET_LOG:
        terminalreporter.section("simulated fleet")
        for line in FLEET_LOG:
            terminalreporter.write_line(line)
