"""instinct-fleet as a package a team installs: the wheel holds everything a deploy reads, ``init`` writes a project
that uses only the installed package, and the gate holds wherever pyinfra is started.

Plain pyinfra runs for real here, on an inventory whose one host is a TCP listener this test
owns: the listener counts connections, so "refused before any connection" is observed, not
assumed. The end-to-end suite deploys the simulated fleet from an ``init`` project with the
built wheel (tests/e2e/test_package.py).
"""

from __future__ import annotations

import ast
import re
import shlex
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from instinct_fleet import scaffold
from instinct_fleet.cli import build_parser
from instinct_fleet.model.defaults import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "instinct_fleet"


def test_init_writes_the_project_this_repository_is_and_overwrites_nothing(tmp_path: Path) -> None:
    project = tmp_path / "infra"
    first = scaffold.init(project)
    assert {w.path.relative_to(project).as_posix() for w in first} == {
        "deploy.py",
        "config.py",
        "inventories/prod.py",
        "group_data/all.py",
        "group_data/llama405.py",
    }
    assert not any(w.kept for w in first)
    # The repository's own files are the ones init writes, as links to them (group_data/all.py there sets each default instead).
    for name in ("deploy.py", "config.py", "inventories/prod.py", "group_data/llama405.py"):
        assert (project / name).read_bytes() == (ROOT / name).read_bytes(), name
        assert (ROOT / name).resolve() == (PACKAGE / "project" / name).resolve(), f"{name} is a copy, not a link to the package's"
    (project / "deploy.py").write_text("# mine\n")
    second = scaffold.init(project)
    assert all(w.kept for w in second) and (project / "deploy.py").read_text() == "# mine\n"


def test_init_group_data_names_every_variable_with_its_meaning_and_sets_none() -> None:
    text = scaffold.group_data_all(commented=True)
    assert not [n for n in ast.parse(text).body if isinstance(n, ast.Assign)], "init must leave every default to the package"
    lines = text.splitlines()
    for name, default in DEFAULTS.items():
        line = f"# {name} = {default!r}"
        assert line in lines, name
        assert lines[lines.index(line) - 1].startswith("# "), f"{name} has no meaning above it"
    # Uncommented, it is the repository's group_data/all.py before the formatter: the same defaults.
    uncommented = ast.parse(scaffold.group_data_all(commented=False))
    assert {n.targets[0].id: ast.literal_eval(n.value) for n in uncommented.body if isinstance(n, ast.Assign)} == DEFAULTS  # type: ignore[attr-defined]


def test_init_refuses_a_file_in_the_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from instinct_fleet.cli import main

    (tmp_path / "f").write_text("x")
    assert main(["init", str(tmp_path / "f")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("instinct_fleet-*.whl")
    return built


def test_the_wheel_holds_every_file_of_the_package(wheel: Path) -> None:
    """Templates, the example project, recipes, knowledge tables, the seeds and the verify module: a file left out of
    the wheel works in a checkout and fails where users install it."""
    on_disk = {
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
    }
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(on_disk - in_wheel) == []
    assert {"instinct_fleet/verify/conftest.py", "instinct_fleet/templates/vllm.service.j2", "instinct_fleet/project/deploy.py"} <= in_wheel


class Listener:
    """A TCP port that stands for an SSH host and counts the connections made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)  # accept() wakes up to see stop: a closed socket does not end a blocked accept
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    listening = Listener()
    yield listening
    listening.close()


def _pyinfra(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pyinfra", "-y", *argv], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_plain_pyinfra_refuses_an_invalid_inventory_before_any_connection_from_any_directory(tmp_path: Path, listener: Listener) -> None:
    project = tmp_path / "infra"
    scaffold.init(project)
    inventory = project / "inventories" / "prod.py"
    gate_lines = inventory.read_text().split('"""', 2)[2].split("\n\n# Eight", 1)[0]  # init's import and gate.install()
    inventory.write_text(
        gate_lines + f'\n\nhosts = [("gpu-1", {{"ssh_hostname": "127.0.0.1", "ssh_port": {listener.port}, "vllm_instanse": []}})]\n'
    )
    for cwd in (project, tmp_path, Path("/")):
        done = _pyinfra(cwd, str(inventory), str(project / "deploy.py"))
        out = done.stdout + done.stderr
        assert done.returncode == 1 and "unknown-variable" in out and "vllm_instances" in out, (cwd, out[-3000:])
        assert "no host was contacted" in out and "Traceback" not in out, out[-3000:]
    assert listener.accepted == 0


def test_a_project_without_the_gate_fails_closed_before_its_first_operation(tmp_path: Path) -> None:
    """No config.py and an inventory of its own: pyinfra connects (to @local here), but the deploy functions validate
    every host before the first operation is queued, and the run ends with nothing run."""
    (tmp_path / "deploy.py").write_text("from instinct_fleet.deploys import fleet\n\nfleet()\n")
    (tmp_path / "inventory.py").write_text('hosts = [("@local", {"vllm_instanse": []})]\n')
    done = _pyinfra(tmp_path, "inventory.py", "deploy.py")
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "unknown-variable" in out and "nothing was deployed" in out, out[-3000:]
    assert "Traceback" not in out and "Starting operation" not in out and "Loaded fact" not in out, out[-3000:]


def test_pyinfra_started_outside_the_project_refuses_to_deploy_without_its_group_data(tmp_path: Path) -> None:
    project = tmp_path / "infra"
    scaffold.init(project)
    (project / "inventories" / "local.py").write_text('hosts = ["@local"]\n')
    done = _pyinfra(tmp_path, str(project / "inventories" / "local.py"), str(project / "deploy.py"))
    out = done.stdout + done.stderr
    assert done.returncode == 1 and f"did not read {project / 'group_data'}" in out and f"--chdir {project}" in out, out[-3000:]
    assert "Traceback" not in out and "Starting operation" not in out


def test_verify_prints_one_line_per_unreachable_host_and_fails(tmp_path: Path) -> None:
    closed = [socket.socket() for _ in range(2)]
    for s in closed:
        s.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused at once
    hosts = ", ".join(f'("gpu-{i}", {{"ssh_hostname": "127.0.0.1", "ssh_port": {s.getsockname()[1]}}})' for i, s in enumerate(closed))
    (tmp_path / "inventory.py").write_text(f"hosts = [{hosts}]\n")
    (tmp_path / "group_data").mkdir()  # a project: the inventory's own directory
    done = subprocess.run(
        [sys.executable, "-m", "instinct_fleet", "verify", "inventory.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    for s in closed:
        s.close()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 2, done.stderr[-3000:]
    assert all(line.startswith(f"gpu-{i}: not verified: cannot connect") for i, line in enumerate(lines)), lines
    assert done.stdout == "", "pytest ran with no host to verify"


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "instinct_fleet", "render", "--recipe", "gpt-oss-120b", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # `| head -0`: the reader is gone before the first line
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == ""


def _readme_commands() -> list[tuple[str, list[str]]]:
    """Each ``instinct-fleet SUBCOMMAND ...`` the README and docs/ show (in code), with the options it gives before any ``--``."""
    import re

    found = []
    pages = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
    for span in re.findall(r"`([^`\n]*instinct-fleet [a-z][^`\n]*)`|^ {4}(.*instinct-fleet [a-z].*)$", pages, re.M):
        text = next(s for s in span if s)
        for command in re.findall(r"instinct-fleet ([a-z][a-z-]*)((?:(?! \| | && |; ).)*)", text):
            sub, rest = command
            found.append((sub, re.findall(r"(?:^|(?<=[\s\[]))(--?[a-zA-Z][\w-]*)", rest.split(" -- ")[0])))
    return found


SHELL_OPERATORS = ("|", "||", "&&", ";")  # between commands; a lone & inside one is a mistake


def _shell_lines(text: str) -> list[str]:
    """Every command a reader may paste: each line of a sh block (continuations joined), and each inline code span that
    runs instinct-fleet or gives its options (``--slo ...``), its line breaks read as spaces."""
    lines = []
    for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", text, re.S):
        lines += re.sub(r"\\\n\s*", " ", block).splitlines()
    for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", text):
        span = " ".join(span.split())
        if span.startswith("instinct-fleet ") or (span.startswith("--") and " " in span):
            lines.append(span if span.startswith("instinct-fleet ") else f"instinct-fleet tune inventory.py {span}")
    return lines


def shell_mistakes(line: str) -> list[str]:
    """What a POSIX shell would take for an operator inside an instinct-fleet command: ``--slo x<=25`` unquoted is a
    redirection from a file named ``=25`` (with ``>=``, a file is written and the SLO dropped). shlex splits as the
    shell does, quotes and comments included; pipes and ``&&`` between commands are the shell's own and stay."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError as exc:  # an unclosed quote
        return [str(exc)]
    found: list[str] = []
    command: list[str] = []
    for token in [*tokens, ";"]:
        if token in SHELL_OPERATORS:
            if command[:1] == ["instinct-fleet"]:
                found += [t for t in command if set(t) <= set("<>&|;()")]
            command = []
        else:
            command.append(token)
    return found


@pytest.mark.parametrize(
    ("line", "mistakes"),
    [
        ("instinct-fleet tune inv.py --slo median_tpot_ms<=25", ["<"]),
        ("instinct-fleet tune inv.py --slo p99_ttft_ms>=2000", [">"]),
        ("instinct-fleet report results/<timestamp>", ["<", ">"]),
        ("instinct-fleet tune inv.py --slo 'median_tpot_ms<=25' --vary max-num-seqs=8,16", []),
        ("instinct-fleet plan inv.py --json | jq .errors && echo done  # a comment <here>", []),
        ("instinct-fleet plan inv.py &", ["&"]),
    ],
)
def test_the_shell_check_sees_what_a_shell_would_do(line: str, mistakes: list[str]) -> None:
    assert shell_mistakes(line) == mistakes


def test_every_command_the_docs_show_pastes_into_a_shell() -> None:
    """Each command of the README and docs/ means in a shell what the text says: no unquoted <, >, | or & inside it."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    checked = [(page.name, line) for page in pages for line in _shell_lines(page.read_text())]
    assert len(checked) > 40, "the docs' commands were not found"
    assert [(page, line, shell_mistakes(line)) for page, line in checked if shell_mistakes(line)] == []


def test_every_option_the_readme_shows_exists() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))  # argparse keeps them here
    shown = _readme_commands()
    assert len(shown) > 20, "the README's commands were not found"
    wrong = []
    for sub, options in shown:
        assert sub in subparsers.choices, f"the README shows `instinct-fleet {sub}`, which does not exist"  # type: ignore[operator]
        known = {o for a in subparsers.choices[sub]._actions for o in a.option_strings}  # type: ignore[index]
        wrong += [f"instinct-fleet {sub} {o}" for o in options if o not in known]
    assert wrong == []


def test_deploy_hands_pyinfra_its_own_flags_and_runs_where_the_deploy_file_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without -y pyinfra shows the changes and asks; --dry and repeated --limit pass through; the inventory may sit
    beside deploy.py (pyinfra's usual layout), and the project is the deploy file's directory, wherever the command runs."""
    from instinct_fleet import cli

    project = tmp_path / "infra"
    scaffold.init(project)
    (project / "hosts.py").write_text('gpu = ["gpu-1", "gpu-2"]\nother = ["cpu-1"]\n')
    calls: list[tuple[list[str], Path]] = []
    monkeypatch.setattr(cli, "_child", lambda argv, cwd, env, capture: (calls.append((argv, cwd)), (0, ""))[1])
    monkeypatch.chdir(tmp_path)
    inventory = str(project / "hosts.py")
    assert cli.main(["deploy", inventory, str(project / "deploy.py"), "--limit", "gpu", "--limit", "cpu-*", "--dry"]) == 0
    assert cli.main(["deploy", inventory, "--project-dir", str(project), "-y"]) == 0
    (first, cwd), (second, _) = calls
    assert cwd == project and first[3:5] == [str(project / "hosts.py"), "deploy.py"]
    assert "-y" not in first and "--dry" in first and first[first.index("--limit") :] == ["--limit", "gpu", "--limit", "cpu-*"]
    assert "-y" in second and "--dry" not in second and "--limit" not in second
    # A linked deploy file (the repository's deploy.py links to the package's example) runs in the link's directory.
    assert cli.main(["deploy", inventory, str(ROOT / "deploy.py"), "-y"]) == 0
    assert calls[-1][1] == ROOT and calls[-1][0][4] == "deploy.py"
    calls.pop()
    assert cli.main(["deploy", inventory, str(project / "deploy.py"), "--json"]) == 2
    assert "--json does not ask" in capsys.readouterr().err
    assert cli.main(["deploy", inventory, "--dry"]) == 0  # the project the inventory sits in, from anywhere
    assert calls[-1][1] == project and calls[-1][0][4] == "deploy.py"
    calls.pop()
    (project / "deploy.py").rename(project / "site.py")  # a project without its deploy file
    assert cli.main(["deploy", inventory]) == 2
    assert f"no deploy.py in {project}" in capsys.readouterr().err and len(calls) == 2
    (project / "site.py").rename(project / "deploy.py")
    assert cli.main(["deploy", inventory, str(project / "deploy.py"), "--limit", "nothing-*"]) == 2
    assert "matches no host name or group" in capsys.readouterr().err
