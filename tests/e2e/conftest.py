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


# The shares the Makefile's e2e-0 and e2e-1 targets run; a module naming another would never run.
SHARES = (0, 1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fleet-share",
        type=int,
        help="run only the modules whose FLEET_SHARE is this (default 0): make test runs share 0 and share 1 "
        "at once, each on its own fleet (INSTINCT_FLEET_SLOT)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    share = config.getoption("--fleet-share")
    if share is None:
        return
    shares = {item.module.__name__: getattr(item.module, "FLEET_SHARE", 0) for item in items}  # type: ignore[attr-defined]
    unrun = sorted(name for name, value in shares.items() if value not in SHARES)
    if unrun:
        raise pytest.UsageError(f"FLEET_SHARE of {', '.join(unrun)} is not one of {SHARES}, which make e2e runs")
    keep = [item for item in items if shares[item.module.__name__] == share]  # type: ignore[attr-defined]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


FLEET_LOG: list[str] = []


def _fleet(command: str) -> None:
    done = subprocess.run([sys.executable, str(FLEET), command], cwd=ROOT, capture_output=True, text=True)
    FLEET_LOG.extend(line for line in done.stdout.splitlines() if line.startswith("[fleet"))
    assert done.returncode == 0, f"fleet {command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="session")
def fleet() -> Iterator[dict[str, Any]]:
    from fleetctl import FLEET_FILE

    if not (os.environ.get("INSTINCT_FLEET_REUSE") and FLEET_FILE.is_file()):
        _fleet("up")
    yield json.loads(FLEET_FILE.read_text())
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


@pytest.fixture
def baseline(converged: Any, tmp_path: Path) -> str:
    """The fault tests' inventory (BASELINE): the fleet as test_roll's crash-loop test leaves it (a no-op then)."""
    from fleetctl import BASELINE, deploy, inventory

    path = inventory(tmp_path, "baseline", BASELINE)
    run = deploy(inventory=path)
    assert run.results["failed_hosts"] == ["sim-nogpu"], run.stderr[-3000:]
    return path


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
