"""The package as a team uses it: the built wheel in a venv of its own, a project from ``instinct-fleet init`` outside
the checkout, and the simulated fleet deployed from there.

The fleet was converged through the repository's deploy.py (the ``converged`` fixture); the init
project, on the same inventory, must find nothing to change: every file it would write is byte
for byte what the repository's deploy wrote. A template or data file missing from the wheel
fails here (a stage could not render), as does anything read from the current directory or a clone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fleetctl import INVENTORY, ROOT, Run, simulated, unleaked

FLEET_SHARE = 2  # beside test_roll_gates, before it (conftest.py)


@pytest.fixture(scope="module")
def installed() -> Path:
    """The venv with the wheel built from this checkout installed (not editable), its verify extra included:
    ``make wheel-venv``, which make e2e builds beside the fleet images (a no-op when it is up to date)."""
    done = subprocess.run(["make", "--no-print-directory", "-s", "wheel-venv"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return ROOT / ".venv-wheel"


def _env() -> dict[str, str]:
    """The user's environment: nothing that points Python at the checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def test_an_init_project_with_the_installed_wheel_finds_the_fleet_converged_byte_for_byte(
    converged: Any, installed: Path, tmp_path: Path
) -> None:
    cli = str(installed / "bin" / "instinct-fleet")
    project = tmp_path / "infra"
    made = subprocess.run([cli, "init", str(project)], capture_output=True, text=True, env=_env())
    assert made.returncode == 0 and "wrote" in made.stdout, made.stderr
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import instinct_fleet; print(instinct_fleet.__file__)"],
        cwd=project,
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert where.stdout.startswith(str(installed)), f"the project imports instinct_fleet from {where.stdout!r}, not the wheel"

    # The demo inventory, as a user would copy it; it finds the simulated fleet through .fleet.
    shutil.copy(ROOT / INVENTORY, project / INVENTORY)
    (project / ".fleet").symlink_to(simulated.SHARED)
    done = subprocess.run([cli, "deploy", INVENTORY, "-y", "--json"], cwd=project, capture_output=True, text=True, env=_env(), timeout=900)
    unleaked(done.args, done.stdout, done.stderr)
    payload = json.loads(done.stdout)
    run = Run(done.returncode, payload["results"], done.stderr, payload["roll"])
    assert run.results["failed_hosts"] == ["sim-nogpu"], done.stderr[-3000:]
    assert run.changed() == set(), f"the init project's deploy changed what the repository's deploy.py wrote: {run.changed()}"

    # The verify module from the wheel (its conftest and checks are package data of instinct_fleet.verify).
    verified = subprocess.run(
        [cli, "verify", INVENTORY, "--limit", "sim-gpu-1", "--", "-q"], cwd=project, capture_output=True, text=True, env=_env(), timeout=600
    )
    unleaked(verified.args, verified.stdout, verified.stderr)
    assert verified.returncode == 0 and " passed" in verified.stdout, verified.stdout[-3000:] + verified.stderr[-2000:]


def test_vllm_facts_reads_the_vllm_inside_a_hosts_image(converged: Any, fleet: dict[str, Any], tmp_path: Path) -> None:
    """AMD's dev builds are not on PyPI: `vllm-facts --from-host` reads the vLLM source inside the host's image over
    the inventory's SSH, with the host's docker, and gives the table a wheel of the same source gives. The image is
    built on the host from the stand-in, with the small synthetic vLLM of the unit tests as its package."""
    import base64
    import io
    import runpy
    import sys
    import tarfile
    import zipfile

    from fleetctl import inventory, ssh

    from instinct_fleet.model.extract import extract

    synthetic_wheel = runpy.run_path(str(ROOT / "tests" / "unit" / "test_knowledge.py"))["synthetic_wheel"]
    wheel = synthetic_wheel(tmp_path)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar, zipfile.ZipFile(wheel) as zf:
        dockerfile = f"FROM {fleet['image']}\nCOPY site/ /usr/local/lib/python3.11/dist-packages/\n".encode()
        for name, data in [("Dockerfile", dockerfile), *((f"site/{n}", zf.read(n)) for n in zf.namelist())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tag = "localhost/vllm-dev-standin:rocm-9.9.9"
    ssh(fleet, "sim-gpu-1", f"echo {base64.b64encode(context.getvalue()).decode()} | base64 -d | docker build -q -t {tag} - >/dev/null")
    try:
        project = tmp_path / "infra"
        project.mkdir()
        (project / "group_data").symlink_to(ROOT / "group_data")

        def facts(version: str, inventory_path: str) -> subprocess.CompletedProcess[str]:
            argv = ["vllm-facts", version, "--from-host", "sim-gpu-1", "--inventory", inventory_path]
            return subprocess.run(
                [sys.executable, "-m", "instinct_fleet", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300
            )

        done = facts("9.9.9", inventory(project, "dev", {}, {"sim-gpu-1": {"vllm_image": tag}}))
        assert done.returncode == 0, done.stderr[-3000:]
        stored = json.loads((project / "vllm-facts" / "vllm-9.9.9.json").read_text())
        from_wheel = extract(wheel)
        assert {k: v for k, v in stored.items() if k != "source"} == {k: v for k, v in from_wheel.items() if k != "source"}
        refused = facts("9.9.8", inventory(project, "plain", {}))  # the stand-in's own image has no vllm package: said
        assert refused.returncode == 2 and "no vllm package in this image's python3" in refused.stderr, refused.stderr[-2000:]
    finally:
        ssh(fleet, "sim-gpu-1", f"docker rmi -f {tag} >/dev/null")
