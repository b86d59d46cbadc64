"""Adding a managed file is two edits: docs/development.md's own diff, applied to a copy of the package, passes the
stage, template and declaration tests there with no other change, and the new file is managed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "development.md"
# The tests that would have needed an edit before (the expected operations, the template list) and the
# declaration's own checks.
CHECKS = [
    "tests/unit/test_stages.py::test_a_fresh_host_gets_the_whole_stage",
    "tests/unit/test_stages.py::test_a_converged_host_gets_nothing",
    "tests/unit/test_stages.py::test_the_watch_switched_off_is_stopped_and_its_files_removed_then_nothing",
    "tests/unit/test_templates.py::test_every_template_is_loaded_by_the_declaration_and_each_file_it_makes_passes_its_reader",
    "tests/unit/test_templates.py::test_the_host_readme_names_every_managed_unit_and_file",
    "tests/unit/test_declared.py",
    "tests/unit/test_probe_covers_desired.py",
]


def the_diff() -> str:
    section = DOC.read_text().split("## Adding a managed thing", 1)[1]
    (diff,) = re.findall(r"```diff\n(.*?)```", section, re.S)
    return diff


def test_the_documented_two_edit_diff_is_all_a_new_managed_file_needs(tmp_path: Path) -> None:
    diff = the_diff()
    touched = re.findall(r"^\+\+\+ b/(\S+)", diff, re.M)
    assert touched == ["instinct_fleet/converge/managed.py", "instinct_fleet/templates/motd.j2"]  # the two edits
    for part in ("instinct_fleet", "tests", "docs"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    applied = subprocess.run(["git", "apply", "-"], input=diff, cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
    # The copy's package is the one imported, and its declaration holds the new file.
    probe = (
        "import instinct_fleet, tests.unit.stages as s; from instinct_fleet.converge import managed;"
        "p = s.plan({}, s.SimHost()); print(instinct_fleet.__file__); print(p.desired.file('/etc/instinct-fleet/motd').text)"
    )
    shown = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert shown.stdout.startswith(str(tmp_path)) and "h1 serves vLLM for instinct-fleet" in shown.stdout
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *CHECKS],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout
