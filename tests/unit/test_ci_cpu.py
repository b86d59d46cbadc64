"""benchmarks/ci_cpu.py: each process is counted under the program it runs, whatever its arguments name."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def ci_cpu() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "ci_cpu.py"
    spec = importlib.util.spec_from_file_location("ci_cpu", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VENV = "/tmp/ci.dir/ci62/.venv/bin"
TMP = "/tmp/pytest-of-root/pytest-3/test_a_crash0/inventories/change.py"


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        # The end-to-end tests' own commands, on inventories under pytest's tmp_path.
        (f"{VENV}/python3 -m instinct_fleet deploy {TMP} --project-dir /tmp/ci.dir/ci62 --json -y", "instinct-fleet command"),
        (f"{VENV}/python3 -m pyinfra {TMP} /tmp/ci.dir/ci62/deploy.py -y", "pyinfra"),
        (f"{VENV}/python3 -m pytest -p no:cacheprovider --rootdir /x/instinct_fleet/verify /x/instinct_fleet/verify", "verify's testinfra"),
        (f"{VENV}/python3 {VENV}/pytest -p no:cacheprovider tests/e2e --fleet-share 0 --fleet-shares 3", "end-to-end tests"),
        (f"{VENV}/python3 {VENV}/pytest tests/unit", "unit tests"),
        (f"{VENV}/python3 {VENV}/instinct-fleet status inventories/local.py", "instinct-fleet command"),
        (f"{VENV}/python3 {VENV}/pip install --quiet -e .[test]", "pip"),
        ("ssh -i /tmp/pytest-of-root/key -p 2201 root@127.0.0.1 true", "ssh client"),
        ("/usr/local/lib/python3.11/dist-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=x", "Ray node"),
    ],
)
def test_a_process_is_counted_under_the_program_it_runs(command: str, kind: str) -> None:
    assert ci_cpu().kind(command) == kind
