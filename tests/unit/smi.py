"""The stand-in amd-smi (tests/fleet/standin/amd-smi) run here, on the captured static output, with injected faults:
the evidence sections a simulated MI300X host's preflight fact reads."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from instinct_fleet.converge import evidence

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
STANDIN = ROOT / "tests" / "fleet" / "standin" / "amd_smi.py"
COMMANDS = {name.replace("-", "_"): arguments for name, arguments in evidence.COMMANDS}  # the fact's and the watch's


@functools.cache
def data() -> str:
    """A folder with the captures the stand-in reads (its STANDIN_AMD_SMI_DATA), made once."""
    data = tempfile.mkdtemp(prefix="instinct-fleet-smi-")
    atexit.register(shutil.rmtree, data, True)
    shutil.copy(FIXTURES / "amd-smi-static-json_mi300x-x8_rocm7.2.1_amdsmi26.2.2.json", Path(data) / "amd-smi-static.json")
    shutil.copy(FIXTURES / "amd-smi-version-json_rocm7.2.1_amdsmi26.2.2.json", Path(data) / "amd-smi-version.json")
    return data


@functools.cache
def _run(command: str, faults: str) -> str:
    path = Path(data()) / f"faults-{abs(hash(faults))}.json"
    path.write_text(faults)
    env = {**os.environ, "STANDIN_AMD_SMI_DATA": data(), "STANDIN_AMD_SMI_FAULTS": str(path) if faults != "{}" else "/nonexistent"}
    done = subprocess.run([sys.executable, str(STANDIN), *command.split()], capture_output=True, text=True, env=env, check=True)
    # As the probe reads it: stderr merged, indentation off, on one line.
    return "".join(line.lstrip() for line in (done.stderr + done.stdout).splitlines())


def sections(faults: dict[str, object] | None = None) -> dict[str, str]:
    """The probe's amd-smi sections of a host with these faults (the stand-in's FAULTS format)."""
    text = json.dumps(faults or {}, sort_keys=True)
    return {name: _run(command, text) for name, command in COMMANDS.items()}
