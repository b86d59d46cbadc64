"""The simulated fleet for the end-to-end tests: brought up fresh for the session, torn down after.

Set INSTINCT_FLEET_KEEP=1 to leave the hosts running for a look afterwards.
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


@pytest.fixture(scope="session")
def fleet() -> Iterator[dict[str, Any]]:
    subprocess.run([sys.executable, str(FLEET), "up"], check=True, cwd=ROOT)
    yield json.loads((ROOT / ".fleet" / "fleet.json").read_text())
    if not os.environ.get("INSTINCT_FLEET_KEEP"):
        subprocess.run([sys.executable, str(FLEET), "down"], check=True, cwd=ROOT)
