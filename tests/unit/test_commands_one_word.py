"""No value from an inventory leaves its word in any shell command the deploy, its fact or verify runs.

Where test_injection.py holds the files a deploy writes to their shape, this holds the commands: the preflight fact's
script, every command the first deploy of a host emits through this project's own operations and its shell emitter,
and every command ``instinct-fleet verify`` sends over SSH. Each place of host data gets the most unusual values its
rule accepts (and hypothesis's hostile strings, where a rule lets them through); each command is split by a POSIX
shell lexer (words and the operators ``; && | > $( ...``), and must have exactly the words and operators, in the same
places, as the command a harmless value gives. A value that a missing quote let out of its word changes that: it
adds a word, an operator, or a line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instinct_fleet.converge import apply, evaluate, operations, probe
from instinct_fleet.converge import steps as stp
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.verify import test_hosts
from instinct_fleet.verify.conftest import Target
from tests.unit.stages import SimHost, deploy

from .test_injection import ACCEPTED, HARMLESS, PLACES, REPORT, hostile
from .test_preflight import plan

# This project's own operations whose commands carry host data, taken before any test replaces them with a recorder.
OURS = {
    name: getattr(operations, name)
    for name in (
        "image_present",
        "weights_downloaded",
        "weights_staged",
        "router_pool_synced",
        "router_pools_left",
        "router_pools_joined",
        "generation_saved",
        "unit_verified",
        "fail",
    )
}
# Places whose value a command carries as a word: the test fails if none of the commands has it (the place must be
# reached, or the comparison proves nothing).
CARRIED = {"hf_token_path", "hf_cache_dir", "vllm_image", "instance name", "api key path", "weights_source"}
PLACES_HERE: dict[str, Any] = {
    **PLACES,
    "api key path": lambda s: {"vllm_api_key_path": "/etc/" + s},
    "weights_source": lambda s: {"weights_source": "/mnt/" + s},
}
ACCEPTED_HERE = {**ACCEPTED, "api key path": ("a,b", "x=y@z+1"), "weights_source": ("m+1", "a@b=c,d")}
BASE = {"vllm_allow_from": ["10.0.0.0/8"], "weights_source": "/mnt/models"}
KEYED = dataclasses.replace(REPORT, api_key="600|root|40")  # a key file where vllm_api_key_path says


class _Fake:
    """What an operation's body asks of pyinfra's host while it makes its commands: nothing is there yet, and a unit
    file fails its check (so that the commands that move it aside are made too)."""

    state = SimpleNamespace(is_executing=True)

    def get_fact(self, fact: Any, **_kwargs: Any) -> list[str] | None:
        return ["rejected"] if fact.__name__ == "UnitProblems" else None

    def noop(self, _text: str) -> None:
        pass


class _Recorder:
    """A testinfra host that records each command verify runs and answers every one with success and no output."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command: str) -> SimpleNamespace:
        self.commands.append(command)
        return SimpleNamespace(rc=0, stdout="", stderr="")

    def file(self, _path: str) -> SimpleNamespace:
        return SimpleNamespace(exists=False)

    def user(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(exists=False, name=name, home="", shell="", groups=[])


def verify_commands(p: HostPlan) -> list[str]:
    """Every command each verify check sends before its first assertion on the (empty) answers."""
    host = _Recorder()
    target = Target("h1", p, host)
    for name in sorted(dir(test_hosts)):
        check = getattr(test_hosts, name)
        if name.startswith("test_") and callable(check):
            # Its answers were empty, so it stops at its first assertion: what it ran up to there is what this reads.
            with contextlib.suppress(AssertionError, ValueError, KeyError, IndexError, TypeError, pytest.fail.Exception):
                check(target)
    return host.commands


def deploy_commands(monkeypatch: pytest.MonkeyPatch, p: HostPlan) -> list[str]:
    """The commands of a first deploy of the host: its shell steps and this project's operations, with their arguments."""
    found: list[str] = []
    for op in deploy(monkeypatch, p, SimHost()):
        if op.module == "server" and op.op == "shell":
            commands = op.kwargs["commands"]
            found += [commands] if isinstance(commands, str) else list(commands)
        elif op.module == "operations" and op.op in OURS:
            with monkeypatch.context() as patched:
                patched.setattr(operations, "host", _Fake())
                arguments = {k: v for k, v in op.kwargs.items() if not k.startswith("_")}  # pyinfra's own (_timeout, _sudo)
                found += [str(c) for c in OURS[op.op]._inner(**arguments) if isinstance(c, str)]
    # The shell emitter (a restore, the generation script) says every step it can as one command.
    for stage in ("tuning", "runtime", "firewall", "router", "services", "roll"):
        for planned in stp.stage(p, stage):
            with contextlib.suppress(ValueError):  # a step that runs only as a pyinfra operation: recorded above
                found.append(apply.shell((dataclasses.replace(planned, after=None),)))
    return found


def commands(monkeypatch: pytest.MonkeyPatch, p: HostPlan) -> list[str]:
    fact = probe.script(p.spec.vars.hf_token_path, evaluate.probe(p.spec))
    return [fact, *deploy_commands(monkeypatch, p), *verify_commands(p)]


def words(command: str) -> list[tuple[str, str]]:
    """The command as a POSIX shell lexer splits it: ("op", ";"), ("op", "&&"), ... and ("word", text)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return [("op", t) if t and all(c in lexer.punctuation_chars for c in t) else ("word", t) for t in lexer]


def active(command: str) -> list[str]:
    """What the shell would expand or end a command at, outside single quotes: ``$``, ``$(``, a backtick, an unquoted
    newline. shlex's lexer splits words and operators but reads ``"$(id)"`` as one plain word; this follows the
    quoting as the shell does, a ``$(...)`` starting quotes of its own inside double quotes."""
    found: list[str] = []
    stack: list[str] = [""]  # "": unquoted; "'" and '"': inside those quotes; "(": inside $( )
    i = 0
    while i < len(command):
        c, ctx = command[i], stack[-1]
        if ctx == "'":
            if c == "'":
                stack.pop()
        elif c == "\\":
            i += 1  # the next character is literal
        elif c == "$" and command[i + 1 : i + 2] == "(":
            found.append("$(")
            stack.append("(")
            i += 1
        elif c in "$`":
            found.append(c)
        elif ctx == '"':
            if c == '"':
                stack.pop()
        elif c in "'\"":
            stack.append(c)
        elif c == ")" and ctx == "(":
            stack.pop()
        elif c == "\n":
            found.append("newline")
        i += 1
    return found


def shaped(monkeypatch: pytest.MonkeyPatch, place: str, value: str) -> bool:
    """Refused (False), or every command of the host has the words and operators of a harmless value's (True)."""
    planned = plan({**BASE, **PLACES_HERE[place](value)}, KEYED)
    if not planned.ok:
        return False
    harmless = plan({**BASE, **PLACES_HERE[place](HARMLESS.get(place, "a1"))}, KEYED)
    assert harmless.ok, [e.brief for e in harmless.errors]
    mine, theirs = commands(monkeypatch, planned), commands(monkeypatch, harmless)
    assert len(mine) == len(theirs), (place, value)
    for got, want in zip(mine, theirs, strict=True):
        a, b = words(got), words(want)
        assert len(a) == len(b), (place, value, got)
        assert [k if k == "word" else t for k, t in a] == [k if k == "word" else t for k, t in b], (place, value, got)
        assert active(got) == active(want), (place, value, got)
    if place in CARRIED:
        assert any(value in word for c in mine for kind, word in words(c) if kind == "word"), (place, "no command carries it")
    return True


@pytest.mark.parametrize("place", sorted(PLACES_HERE))
def test_every_accepted_value_stays_one_word_in_every_command(monkeypatch: pytest.MonkeyPatch, place: str) -> None:
    assert all(shaped(monkeypatch, place, value) for value in ACCEPTED_HERE[place]), place


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(place=st.sampled_from(sorted(PLACES_HERE)), value=hostile)
def test_a_hostile_value_is_refused_or_stays_one_word(monkeypatch: pytest.MonkeyPatch, place: str, value: str) -> None:
    shaped(monkeypatch, place, value)


def test_the_lexer_sees_a_value_let_out_of_its_word() -> None:
    """The floor under the comparison: the value a missing quote lets out changes the words or the operators."""
    good = f"cat {shlex.quote('/etc/a;b')}"
    assert [k for k, _ in words(good)] == ["word", "word"]
    for bad in ("cat /etc/a;b", "cat /etc/a b", "cat /etc/a|b", "cat /etc/a&&b"):
        assert len(words(bad)) != 2 or words(bad)[1][0] == "op", bad
    # Expansions: live outside single quotes (and inside a $( ) within double quotes), inert inside them.
    assert active(f"x={shlex.quote('$(id)')}") == [] and active("x='a'\\''$(id)'") == []
    for live in ('x="$(id)"', "x=$(id)", 'x="`id`"', 'x="$HOME"', "a\nb"):
        assert active(live), live
    assert active("""y="$(head '/a;$b' 2>/dev/null)" """) == ["$("]
