"""The oldest pyinfra instinct-fleet admits (the Makefile's PYINFRA_FLOOR) runs the documented command.

`make e2e` builds .venv-floor with that pyinfra; a re-run there of
`pyinfra -y inventories/local.py deploy.py` on the converged fleet must change nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from fleetctl import ROOT, deploy, unleaked

FLEET_SHARE = 0  # a short module beside test_deploy (conftest.py)

FLOOR_PYTHON = ROOT / ".venv-floor" / "bin" / "python"


def test_the_pyinfra_floor_runs_the_documented_deploy_and_changes_nothing(converged: Any) -> None:
    assert FLOOR_PYTHON.exists(), "no .venv-floor: run `make floor-venv` (make e2e does)"
    version = subprocess.run(
        [str(FLOOR_PYTHON), "-c", "import importlib.metadata as m; print(m.version('pyinfra'))"], capture_output=True, text=True
    )
    floor = re.search(r"^PYINFRA_FLOOR = (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert floor is not None and version.stdout.strip() in (floor.group(1), f"{floor.group(1)}.0"), version.stdout
    assert deploy().results["failed_hosts"] == ["sim-nogpu"]  # converged (a no-op after test_deploy.py)
    done = subprocess.run(
        [str(FLOOR_PYTHON), "-m", "pyinfra", "-y", "inventories/local.py", "deploy.py", "--json"], cwd=ROOT, capture_output=True, text=True
    )
    unleaked(done.args, done.stdout, done.stderr)
    results = json.loads(done.stdout[done.stdout.index("{") :])
    results = results.get("results", results)
    assert results["failed_hosts"] == ["sim-nogpu"], done.stderr[-3000:]
    assert results["totals"]["success"] == 0, done.stderr[-3000:]
    assert "Roll summary:" in done.stderr and "Traceback" not in done.stderr
