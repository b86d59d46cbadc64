"""The Hugging Face token as a managed secret: read on the control machine, written root's alone, never in argv, a unit or
a message; the stand-in Hub answers 401 or 200 as the real one does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from instinct_fleet import scaffold
from instinct_fleet.cli import main
from instinct_fleet.converge import content, entries, operations
from instinct_fleet.model import paths, secrets
from instinct_fleet.model.catalog import Catalog
from instinct_fleet.model.inventory import HostData, plan_hosts
from tests.unit.stages import SimHost, deploy, drifted, emitted, plan, run_stage

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_secretTOKENforTESTS0123456789"
ENV = "INSTINCT_FLEET_TEST_HF_TOKEN"


def _spec(data: dict[str, Any], project: Path | None = None) -> Any:
    ((spec, findings),) = plan_hosts([HostData("h1", ("all",), data)], Catalog.of(project))
    return spec, findings


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (None, f"the environment variable {ENV} is not set for this command"),
        ("", f"the environment variable {ENV} is empty"),
        ("  \n", f"the environment variable {ENV} is empty"),
        ("hf_a hf_b", "holds more than one token"),
        (f"{TOKEN}\n", None),
    ],
)
def test_an_environment_variable_holds_one_token(value: str | None, says: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    spec, findings = _spec({"hf_token_source": f"env:{ENV}"})
    token, wrong = secrets.hf_token(spec)
    if says is None:
        assert (token, wrong) == (TOKEN, None) and "hf-token-source" not in {f.rule for f in findings}
    else:
        assert token is None and wrong is not None and says in wrong
        (hit,) = [f for f in findings if f.rule == "hf-token-source"]
        assert hit.key == "hf_token_source" and says in hit.message
        assert not (value or "").strip() or value.strip() not in hit.message  # type: ignore[union-attr]


def test_a_file_source_is_the_projects_wherever_the_command_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "infra"
    scaffold.init(project)
    (project / "secrets").mkdir()
    (project / "secrets" / "hf-token").write_text(TOKEN + "\n")
    monkeypatch.chdir(tmp_path)  # not the project: the relative path is still the project's
    spec, findings = _spec({"hf_token_source": "secrets/hf-token", "docker_credentials_file": "secrets/hf-token"}, project)
    assert secrets.hf_token(spec) == (TOKEN, None) and [f for f in findings if f.severity == "error"] == []
    spec, findings = _spec({"hf_token_source": "secrets/none", "docker_credentials_file": "secrets/none"}, project)
    assert {(f.rule, f.key) for f in findings if f.severity == "error"} == {
        ("hf-token-source", "hf_token_source"),
        ("local-file", "docker_credentials_file"),
    }
    assert f"cannot read {project / 'secrets' / 'none'}" in secrets.hf_token(spec)[1]  # type: ignore[operator]
    (project / "secrets" / "bad").write_text("env:NOT A NAME")
    _, wrong = secrets.hf_token(_spec({"hf_token_source": "env:NOT A NAME"}, project)[0])
    assert wrong is not None and "after env: comes the name of an environment variable" in wrong


def test_plan_refuses_a_missing_token_before_any_host_and_never_prints_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "infra"
    scaffold.init(project)
    (project / "inventories" / "t.py").write_text(f"gpu = [('gpu-1', {{'hf_token_source': 'env:{ENV}'}})]\n")
    monkeypatch.delenv(ENV, raising=False)
    done = subprocess.run([sys.executable, "-m", "instinct_fleet", "plan", "inventories/t.py"], cwd=project, capture_output=True, text=True)
    assert done.returncode == 1 and f"gpu-1: hf_token_source: the environment variable {ENV} is not set" in done.stderr
    for argv in (["--json"], ["--explain"]):
        shown = subprocess.run(
            [sys.executable, "-m", "instinct_fleet", "plan", "inventories/t.py", *argv],
            cwd=project,
            capture_output=True,
            text=True,
            env={**os.environ, ENV: TOKEN},
        )
        assert shown.returncode == 0, shown.stderr
        assert TOKEN not in shown.stdout + shown.stderr


def test_the_deploy_writes_the_token_once_root_alone_and_mounts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh host: the runtime stage writes hf_token_path with mode 0600 through operations.secret_written, the units
    mount it from the first run (the fact said no token yet), and a second run writes nothing."""
    monkeypatch.setenv(ENV, TOKEN)
    data = {"hf_token_source": f"env:{ENV}"}
    sim = SimHost()
    sim_plan = plan(data, sim, hf_token="")  # no token on the host yet, as preflight reads it
    assert not sim_plan.report.hf_token
    ops = run_stage(monkeypatch, "runtime", sim_plan)
    (written,) = [op for op in ops if op.op == "secret_written"]
    assert written.kwargs["path"] == "/etc/instinct-fleet/hf-token" and written.kwargs["content"] == f"{TOKEN}\n".encode()
    assert not [op for op in ops if op.op == "put" and op.kwargs.get("dest") == "/etc/instinct-fleet/hf-token"]
    svc = sim_plan.spec.services[0]
    assert paths.TOKEN_IN_CONTAINER in " ".join(content.vllm_argv(sim_plan, svc))
    assert TOKEN not in " ".join(content.vllm_argv(sim_plan, svc)) + content.env_text(sim_plan, svc)
    deploy(monkeypatch, sim_plan, sim)
    assert sim.files["/etc/instinct-fleet/hf-token"][1:] == ("600", "root", "root")
    again = plan(data, sim)
    assert drifted(again) == [] and emitted(monkeypatch, "runtime", again) == []
    monkeypatch.setenv(ENV, TOKEN + "rotated")  # a new token: written again, nothing else
    assert emitted(monkeypatch, "runtime", plan(data, sim)) == ["Hugging Face token (hf_token_source)"]


def test_without_a_source_the_token_file_is_the_operators(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = run_stage(monkeypatch, "runtime", plan({}, SimHost()))
    assert not [op for op in ops if op.op == "secret_written" and op.kwargs["path"] == "/etc/instinct-fleet/hf-token"]


def test_a_secret_is_never_in_a_command_line_and_lands_with_its_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operation's commands: a 0700 directory and an SFTP upload as the SSH user, then install -m 600 and one
    rename; the content rides the upload alone."""
    from pyinfra.api.command import FileUploadCommand, StringCommand

    inner = operations.secret_written._inner  # type: ignore[attr-defined]
    commands = list(inner(path="/etc/instinct-fleet/hf-token", content=f"{TOKEN}\n".encode(), owner="root", group="root"))
    upload = [c for c in commands if isinstance(c, FileUploadCommand)]
    texts = [str(c) for c in commands if not isinstance(c, FileUploadCommand)]
    assert len(upload) == 1 and upload[0].src.getvalue() == f"{TOKEN}\n".encode() and upload[0].connector_arguments == {"_sudo": False}
    assert isinstance(commands[0], StringCommand) and commands[0].connector_arguments == {"_sudo": False}
    assert "chmod 700 .instinct-fleet-incoming" in texts[0]
    assert "install -D -m 600 -o root -g root" in texts[-1] and "mv -f /etc/instinct-fleet/hf-token.instinct-fleet-new" in texts[-1]
    assert all(TOKEN not in text for text in texts)


def test_the_secret_write_works_in_a_real_shell(tmp_path: Path) -> None:
    """The last command, run by sh as the run runs it: the file appears with mode 0600 in one rename, the upload goes."""
    inner = operations.secret_written._inner  # type: ignore[attr-defined]
    dest = tmp_path / "etc" / "hf-token"
    owner = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    *_, last = list(inner(path=str(dest), content=b"x", owner=owner, group=group))
    home = tmp_path / "home"
    (home / operations.INCOMING).mkdir(parents=True)
    (home / operations.INCOMING / "hf-token").write_text(TOKEN + "\n")
    done = subprocess.run(["sh", "-c", str(last)], capture_output=True, text=True, env={**os.environ, "HOME": str(home), "SUDO_USER": ""})
    assert done.returncode == 0, done.stderr
    assert dest.read_text() == TOKEN + "\n" and oct(dest.stat().st_mode & 0o777) == "0o600"
    assert not (home / operations.INCOMING / "hf-token").exists()


@pytest.mark.parametrize(("token", "answer"), [(None, "401"), ("hf_wrong", "401"), (TOKEN, "200")])
def test_the_stand_in_hub_answers_a_gated_repo_as_the_hub_does(token: str | None, answer: str, tmp_path: Path) -> None:
    """The fleet's stand-in huggingface_hub (tests/fleet/standin): Meta's Llama repos need the accepted token."""
    hub = ROOT / "tests" / "fleet" / "standin" / "vllm"
    accepted = tmp_path / "hub-token"
    accepted.write_text(TOKEN + "\n")
    script = (
        "import sys, huggingface_hub as h\n"
        f"h.ACCEPTED = {str(accepted)!r}\n"
        "try:\n"
        f"    h.snapshot_download('meta-llama/Llama-3.1-70B-Instruct', cache_dir={str(tmp_path / 'cache')!r}, token={token!r})\n"
        "    print('200')\n"
        "except h.GatedRepoError as exc:\n"
        "    print(str(exc)[:3])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=hub, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(hub)}
    )
    assert done.stdout.strip().splitlines()[-1] == answer, done.stderr
    free = subprocess.run(
        [sys.executable, "-c", script.replace("meta-llama/Llama-3.1-70B-Instruct", "openai/gpt-oss-120b")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(hub)},
    )
    assert free.stdout.strip().splitlines()[-1] == "200", free.stderr  # not gated: no token needed


def test_the_json_plan_of_a_managed_token_names_only_its_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "infra"
    scaffold.init(project)
    (project / "inventories" / "t.py").write_text(f"gpu = [('gpu-1', {{'hf_token_source': 'env:{ENV}'}})]\n")
    monkeypatch.setenv(ENV, TOKEN)
    assert main(["plan", str(project / "inventories" / "t.py"), "--json"]) == 0
    out = capsys.readouterr().out
    assert TOKEN not in out and json.loads(out)["errors"] == []


def test_only_declared_secrets_take_the_secret_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """An env file is 0600 too, but no secret: it is put as any file (and tune may write it); a secret declared with
    another mode is a declaration bug."""

    monkeypatch.setenv(ENV, TOKEN)
    host_plan = plan({"hf_token_source": f"env:{ENV}", "docker_credentials_file": str(ROOT / "pyproject.toml")}, SimHost())
    ops = [op for stage in ("runtime", "services") for op in run_stage(monkeypatch, stage, host_plan)]
    secret = {op.kwargs["path"] for op in ops if op.op == "secret_written"}
    assert secret == {"/etc/instinct-fleet/hf-token", paths.CREDENTIALS}
    assert paths.unit_env_path("vllm-main") in {op.kwargs["dest"] for op in ops if op.op == "put"}
    with pytest.raises(ValueError, match="a secret is declared with mode 600"):
        entries.FileEntry("/etc/x", "runtime", "x", lambda _r: b"", mode="640", secret=True)
