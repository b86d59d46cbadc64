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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fleet-share",
        type=int,
        help="run only the modules whose FLEET_SHARE (default 0) is this: make test runs every share at once, "
        "each on its own fleet (INSTINCT_FLEET_SLOT)",
    )
    parser.addoption("--fleet-shares", type=int, default=1, help="how many shares make e2e runs (E2E_SHARES in the Makefile)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Modules that leave the fleet on another inventory run after those on inventories/local.py (FLEET_LAST):
    # each switch of inventory rolls units, and a module's ``converged`` would roll them back.
    items.sort(key=lambda item: bool(getattr(item.module, "FLEET_LAST", False)))  # type: ignore[attr-defined]
    share = config.getoption("--fleet-share")
    if share is None:
        return
    count = config.getoption("--fleet-shares")
    shares = {item.module.__name__: getattr(item.module, "FLEET_SHARE", 0) for item in items}  # type: ignore[attr-defined]
    unrun = sorted(name for name, value in shares.items() if value not in range(count))
    if unrun:
        # A module naming a share the Makefile does not run would never run.
        raise pytest.UsageError(f"FLEET_SHARE of {', '.join(unrun)} is not below {count}, the shares make e2e runs")
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
def on_local(first_run: Any) -> Any:
    """The fleet on inventories/local.py at the start of this test, whatever the tests before it in its
    module left: for a test whose assertions are relative to local.py, in a module of other inventories."""
    from fleetctl import deploy

    run = deploy()
    assert run.results["failed_hosts"] == ["sim-nogpu"], run.stderr[-3000:]
    return run


@pytest.fixture
def baseline(first_run: Any, tmp_path: Path) -> str:
    """The fault tests' inventory (BASELINE): the fleet as test_roll's crash-loop test leaves it (a no-op then).

    It asks for ``first_run``, not ``converged``: a module's first converge to inventories/local.py would roll
    every unit there and straight back here (about 40 s in test_roll)."""
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
