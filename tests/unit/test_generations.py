"""Generations: what the fact reads of them, and what a roll keeps and restores, from that alone."""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from instinct_fleet.converge import apply, generations
from instinct_fleet.converge.generations import GenerationPlan, Generations
from instinct_fleet.model import paths
from tests.unit.stages import SimHost, deploy, plan

UNIT = paths.unit_path("vllm-main")
ENV = paths.unit_env_path("vllm-main")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


RUNNING = {UNIT: sha("unit v2"), ENV: sha("env v2")}


def test_the_fact_reads_the_numbers_the_healthy_one_and_its_files() -> None:
    text = f"numbers: 1 2 3\nhealthy: 2\n{sha('unit v2')}  .{UNIT}\n{sha('env v2')}  .{ENV}\n"
    assert generations.parse(text) == Generations((1, 2, 3), 2, RUNNING)
    assert generations.parse("numbers:\nhealthy:\n") == Generations()
    # A healthy mark naming a generation that is gone (pruned by hand) marks nothing.
    assert generations.parse("numbers: 3\nhealthy: 2\n").healthy is None


def test_the_fact_s_shell_reads_a_real_generations_directory(tmp_path: Path) -> None:
    """probe_command run by sh on a copy of the layout: numbers sorted as numbers (10 after 2), a name that is
    not a number left out, the healthy one's files hashed; no directory at all reads as no generations."""
    root = tmp_path / "generations"
    for number in ("1", "2", "10", "10.tmp", "notes"):
        (root / number).mkdir(parents=True)
    unit = root / "10" / "files" / UNIT.lstrip("/")
    unit.parent.mkdir(parents=True)
    unit.write_text("unit v2")
    (root / "healthy").write_text("10")  # no newline at its end: read still takes it
    command = generations.probe_command().replace(paths.GENERATIONS_DIR, str(root))
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30, check=True)
    assert generations.parse(done.stdout) == Generations(numbers=(1, 2, 10), healthy=10, files={UNIT: sha("unit v2")})
    empty = subprocess.run(
        ["/bin/sh", "-c", command.replace(str(root), str(tmp_path / "none"))], capture_output=True, text=True, timeout=30
    )
    assert generations.parse(empty.stdout) == Generations() and empty.stderr == ""


def test_only_serving_files_count() -> None:
    hashes = {**RUNNING, paths.DAEMON_JSON: sha("{}"), paths.RAY_ENV: sha("ray"), paths.SYSCTL_FILE: sha("x")}
    assert generations.serving_hashes(hashes) == {**RUNNING, paths.RAY_ENV: sha("ray")}


def test_files_that_are_the_healthy_generation_are_not_kept_again() -> None:
    found = Generations((1, 2), 2, RUNNING)
    assert generations.plan(found, RUNNING, answered=True) == GenerationPlan(
        keep=None, keep_healthy=False, target=2, after=3, target_files=RUNNING
    )


def test_other_files_are_kept_first_and_are_the_target_only_when_they_answered() -> None:
    found = Generations((1, 2), 2, RUNNING)
    edited = {**RUNNING, ENV: sha("env edited")}
    assert generations.plan(found, edited, answered=True) == GenerationPlan(
        keep=3, keep_healthy=True, target=3, after=4, target_files=edited
    )
    # Not answering at preflight: kept for the record, but a rollback goes to the last healthy one.
    assert generations.plan(found, edited, answered=False) == GenerationPlan(
        keep=3, keep_healthy=False, target=2, after=4, target_files=RUNNING
    )
    assert generations.plan(Generations(), edited, answered=False).target is None


def test_a_fresh_host_keeps_nothing_and_has_nothing_to_go_back_to() -> None:
    assert generations.plan(Generations(), {}, answered=True) == GenerationPlan(keep=None, keep_healthy=False, target=None, after=1)


def test_the_save_script_keeps_and_prunes_what_the_fact_reads() -> None:
    save = generations.save_script(5, keep=3, healthy=True)
    assert f"{paths.GENERATIONS_DIR}/5" in save and "head -n -3" in save and 'cp -p "$f"' in save
    assert f"> {generations.HEALTHY}.tmp" in save and f"> {generations.HEALTHY}.tmp" not in generations.save_script(5, 3, False)


def test_a_failed_batch_puts_back_what_it_changed_with_the_declared_modes_and_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch changed instance a, removed b and added c: the restore writes back a's changed files with the modes
    and owners their entries declare, brings b back as it was kept, stops c and removes its files, and restarts a
    and b, nothing else (what each file restarts comes from the declaration)."""
    before_data = {"vllm_instances": [{"name": "a"}, {"name": "b"}]}
    sim = SimHost()
    deploy(monkeypatch, plan(before_data, sim), sim)
    kept = generations.serving_hashes(plan(before_data, sim).report.file_hashes)
    after = plan({"vllm_instances": [{"name": "a", "args": {"max-num-seqs": 64}}, {"name": "c"}]}, sim)
    script = apply.restore(after.desired, 7, kept)
    source = f"{paths.GENERATIONS_DIR}/7/files"
    a_unit, b_unit, c_unit = (paths.unit_path(paths.vllm_unit(n)) for n in "abc")
    changed = [f for f in after.desired.files if f.path in kept and f.content is not None and f.sha256 != kept[f.path]]
    assert [f.path for f in changed] == [a_unit]  # the flag is in the unit's argv; a's env file is as it was
    assert f"install -D -m {changed[0].mode} -o {changed[0].owner} -g {changed[0].group} {source}{a_unit} {a_unit}" in script
    assert f"cp -p {source}{b_unit} {b_unit}" in script and f"cp -p {source}{paths.unit_env_path('vllm-b')} " in script
    assert "systemctl disable --now vllm-c.service" in script and f"rm -f {c_unit}" in script
    assert f"rm -f {paths.unit_env_path('vllm-c')}" in script
    restarted = re.findall(r"systemctl restart ([^\s;]+)", script)
    assert restarted == ["vllm-a.service", "vllm-b.service"]
    assert paths.unit_env_path("vllm-a") not in script  # unchanged files are left alone
    # One chain of steps joined by &&, so that it stops at its first failure (the tolerated stop is braced, so its
    # `|| true` rescues that step alone), the generation's presence checked first.
    assert script.startswith(f"if [ ! -d {source} ]; then printf ") and "; exit 1; fi && " in script
    tokens = list(shlex.shlex(script, posix=True, punctuation_chars=True))
    depth, outside = 0, []
    for token in tokens[tokens.index("fi") + 1 :]:
        depth += {"{": 1, "}": -1}.get(token, 0)
        if depth == 0 and token in (";", "&&", "||", "&"):
            outside.append(token)
    assert set(outside) == {"&&"}, outside
    assert paths.ROLL_MARKER in script and script.index("daemon-reload") < script.index("restart")
    # The rollback marks itself on the marker first (the watch counts it for the boards), and removes the marker last.
    said = f"printf '%s\\n' 'rolled back to generation 7' >> {paths.ROLL_MARKER}"
    assert said in script and script.index(said) < script.index("install -D") < script.index(f"rm -f {paths.ROLL_MARKER}")


def test_the_fact_reads_back_the_generation_a_rollback_asks_for() -> None:
    text = f"numbers: 1 2\nhealthy: 2\nrestore: 1\nfile: {UNIT}\ndW5pdCB2MQ==\nfile: {ENV}\n\n"
    found = generations.parse(text)
    assert (found.restore, found.restore_files) == (1, {UNIT: b"unit v1", ENV: b""})
    assert "-lt" in generations.probe_command("previous") and "t=3;" in generations.probe_command("3")
    assert "restore:" not in generations.probe_command()
