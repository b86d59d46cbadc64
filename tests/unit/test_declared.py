"""Every path a run writes or removes on a host is a declared entry (instinct_fleet/converge/managed.py).

The stages run on the fixture hosts of tests/unit/stages.py, in the situations that write the most: a fresh host,
a re-tune whose gate fails and rolls back, a router switched off, the watch switched off, a cluster's head, a
quarantine. Each operation that runs is read for what it writes: a file operation's path, and every absolute path
in any shell text it sends (a declared command, a generation's save or restore script). A tune trial's steps and
a rollback's are read likewise. A path passes when a declared entry names it, lies under a declared directory, or
matches one of the globs a deploy cleans up under (the stale serving and router files, which the fact reads).
An operation this test does not know fails it, so a new way to write cannot pass unread.
"""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from instinct_fleet.converge import apply, generations, managed, steps
from instinct_fleet.converge.entries import FileEntry
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.state import Run
from instinct_fleet.model import paths
from instinct_fleet.roll.roll import plan_roll
from tests.unit import smi
from tests.unit.conftest import CLUSTER
from tests.unit.stages import Recorded, SimHost, deploy, plan, run_stage
from tests.unit.test_secrets import ENV, TOKEN

DATA: dict[str, Any] = {"vllm_allow_from": ["10.0.0.0/8"], "metrics_exporter": True}
# Executables a command names by path (they are run, never written) and the kernel's sink.
PROGRAMS = {paths.PYTHON3, paths.NFT, paths.CPUPOWER, "/dev/null"}

# What a recorded operation writes or removes, by its arguments; the scripts it runs are read by ``shell_texts``.
WRITES: dict[tuple[str, str], Callable[[dict[str, Any]], list[str]]] = {
    ("files", "put"): lambda kw: [kw["dest"]],
    ("files", "file"): lambda kw: [kw["path"]],
    ("files", "directory"): lambda kw: [kw["path"]],
    ("operations", "secret_written"): lambda kw: [kw["path"]],
    ("operations", "weights_staged"): lambda kw: [kw["local"]],
    ("operations", "weights_downloaded"): lambda kw: [kw["local"]],
}
# Operations that send shell text: the text each sends.
SCRIPTS: dict[tuple[str, str], Callable[[dict[str, Any]], list[str]]] = {
    ("server", "shell"): lambda kw: list(kw["commands"]),
    ("operations", "generation_saved"): lambda kw: [generations.save_script(kw["number"], kw["keep"], kw["healthy"])],
    ("operations", "generation_restored"): lambda kw: [kw["script"]],
    ("operations", "router_pool_synced"): lambda kw: [kw["command"]],
}
# Of those, the ones whose whole text must be a command an entry declares.
DECLARED_COMMANDS = {("server", "shell"), ("operations", "router_pool_synced")}
# Operations that write no file: units, packages, users, kernel values, images, checks, the router's HTTP calls.
NO_FILE = {
    ("systemd", "service"),
    ("systemd", "daemon_reload"),
    ("apt", "packages"),
    ("server", "sysctl"),
    ("server", "group"),
    ("server", "user"),
    ("server", "reboot"),
    ("operations", "image_present"),
    ("operations", "barrier"),
    ("operations", "healthy"),
    ("operations", "unit_verified"),
    ("operations", "fail"),
    ("operations", "router_pools_left"),
    ("operations", "router_pools_joined"),
    ("measure", "canary_measured"),  # the canary's runs: vllm bench serve and the probe, results on the control machine
}


class Declared:
    """What one host's declaration lets a run touch."""

    def __init__(self, host_plan: HostPlan) -> None:
        entries = managed.declare(host_plan.spec)
        files = [e for e in entries if isinstance(e, FileEntry)]
        self.paths = {e.path for e in files}
        self.directories = tuple(e.path.rstrip("/") + "/" for e in files if e.directory)
        self.globs = (*paths.SERVING_FILES, *paths.ROUTER_GLOBS)
        self.commands = {a.command for e in entries for a in getattr(e, "then", ()) if isinstance(a, Run)}
        # The routers stage's own sync after it converged (a pool with joining workers waits for a router it started).
        self.commands |= {managed.sync_command(p, wait=w) for p in host_plan.spec.pools for w in (False, True)}

    def admits(self, path: str) -> bool:
        return (
            path in self.paths
            or path in self.globs
            or path.startswith(self.directories)
            or any(fnmatch.fnmatch(path, g) for g in self.globs)
        )


def absolute_paths(text: str) -> Iterator[str]:
    """Every word of shell text that is an absolute path (redirections and quotes split as sh splits them)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.wordchars += "$%{}*.-:=@+,"
    for word in lexer:
        if word.startswith("/"):
            yield word


def undeclared(host_plan: HostPlan, ops: list[Recorded]) -> list[str]:
    """What the operations write that the host's declaration does not hold, one line each."""
    declared = Declared(host_plan)
    bad: list[str] = []
    for op in ops:
        key = (op.module, op.op)
        if key in WRITES:
            bad += [f"{op.name}: {p}" for p in WRITES[key](op.kwargs) if not declared.admits(p)]
        elif key in SCRIPTS:
            for text in SCRIPTS[key](op.kwargs):
                if key in DECLARED_COMMANDS and text not in declared.commands:
                    bad.append(f"{op.name}: runs a command no entry declares: {text}")
                bad += [f"{op.name}: {p}" for p in absolute_paths(text) if p not in PROGRAMS and not declared.admits(p)]
        elif key not in NO_FILE:
            bad.append(f"{op.name}: {key} is an operation this test does not read")
    return bad


def steps_undeclared(host_plan: HostPlan, planned: tuple[steps.Planned, ...]) -> list[str]:
    declared = Declared(host_plan)
    bad = [f"{apply.label(p.step)}: {w}" for p in planned if (w := steps.written(p.step)) is not None and not declared.admits(w)]
    texts = [p.step.action.command for p in planned if isinstance(p.step, steps.Command)]
    return bad + [f"{t}: {w}" for t in texts for w in absolute_paths(t) if w not in PROGRAMS and not declared.admits(w)]


def every_stage(monkeypatch: pytest.MonkeyPatch, data: dict[str, Any], sim: SimHost, **kw: Any) -> tuple[HostPlan, list[Recorded]]:
    host_plan = plan(data, sim, **kw)
    return host_plan, deploy(monkeypatch, host_plan, sim)


def situations(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, HostPlan, list[Recorded]]]:
    """Each situation's host plan and every operation that ran in it."""
    sim = SimHost()
    monkeypatch.setenv(ENV, TOKEN)
    yield ("fresh", *every_stage(monkeypatch, {**DATA, "hf_token_source": f"env:{ENV}"}, sim, hf_token=""))
    retune = {**DATA, "vllm_args": {"max-num-seqs": 192}}
    failed = plan(retune, sim)
    yield "rolled back", failed, run_stage(monkeypatch, "services", failed, sick={"vllm-main.service": 1})
    yield ("watch off", *every_stage(monkeypatch, {**DATA, "watch": False}, sim))
    yield ("quarantined", *every_stage(monkeypatch, DATA, sim, **smi.sections({"gpus": {"0": {"uncorrectable": 3}}})))
    router = SimHost()
    yield ("router", *every_stage(monkeypatch, {"router": True}, router))
    port = plan({"router": True}, router).spec.pools[0].port
    drift = {"router-drift": f"{port} remove http://gone:8080"}  # a running pool that lists a worker no longer there
    yield ("router pool drifted", *every_stage(monkeypatch, {"router": True}, router, **drift))
    yield ("router off", *every_stage(monkeypatch, {}, router))
    head = {**CLUSTER, "vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2}
    yield ("cluster head", *every_stage(monkeypatch, {**head, "ray_role": "head"}, SimHost(), peers={"h2": {**head, "ray_role": "worker"}}))


def test_every_path_a_run_writes_is_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: set[tuple[str, str]] = set()
    for name, host_plan, ops in situations(monkeypatch):
        assert host_plan.ok, (name, host_plan.errors)
        assert undeclared(host_plan, ops) == [], name
        seen |= {(op.module, op.op) for op in ops}
    # The situations reach every way of writing this test reads (a situation that no longer writes would hide one).
    assert set(WRITES) - {("operations", "weights_staged"), ("operations", "weights_downloaded")} <= seen
    assert set(SCRIPTS) <= seen


def test_a_trial_and_a_rollback_write_only_declared_paths() -> None:
    sim = SimHost()
    host_plan = plan(DATA, sim)
    unit = "vllm-main"
    files = [host_plan.desired.file(p) for p in host_plan.desired.unit_files(unit)]
    trial = (steps.Planned(steps.mark("tune sweep s1: trial 1")), *steps.trial(files))
    assert steps_undeclared(host_plan, trial) == []
    kept = {f.path: "0" * 64 for f in files}
    restore = steps.restore(host_plan.desired, 1, kept)
    assert steps_undeclared(host_plan, restore) == []
    assert {steps.written(p.step) for p in restore} >= {*kept, paths.ROLL_MARKER}


def test_an_undeclared_write_is_caught_however_it_is_sent() -> None:
    """The check itself: a file operation, a step, a path inside a declared command's text, a command no entry
    declares, and an operation it does not know each fail it."""
    host_plan = plan(DATA, SimHost())
    command = next(iter(Declared(host_plan).commands))  # update-grub: a command of the GRUB drop-in's entry
    hidden = [
        Recorded("put", "files", "put", {"dest": "/etc/other.conf"}),
        Recorded("shell", "server", "shell", {"commands": [f"{command} && touch /etc/other.conf"]}),
        Recorded(
            "restore", "operations", "generation_restored", {"script": f"cp -p {paths.GENERATIONS_DIR}/1/x {paths.CONFIG_DIR}-other/x"}
        ),
        Recorded("new", "operations", "something_new", {}),
    ]
    assert [len(undeclared(host_plan, [op])) for op in hidden] == [1, 2, 1, 1]
    write = steps.Write(host_plan.desired.file(paths.HOST_README))
    moved = steps.Write(type(write.file)(**{**write.file.__dict__, "path": "/etc/other.conf"}))
    assert steps_undeclared(host_plan, (steps.Planned(write),)) == []
    assert steps_undeclared(host_plan, (steps.Planned(moved),)) == [f"{apply.label(moved)}: /etc/other.conf"]


def test_a_warm_roll_s_copies_land_only_where_the_declaration_allows() -> None:
    """warm (and a roll's spreading) writes on a host only a packed copy of a compile cache beside the caches, then
    merges it into that cache with the declared script: every path it names is one the receiving and the sending
    host's declaration admits."""
    from tests.unit.test_spread import MAIN, serving

    plans = serving({"a1": MAIN, "a2": MAIN, "a3": MAIN})
    roll = plan_roll(plans, warm=True)
    assert roll.spreads
    for spread in roll.spreads:
        for name in (spread.source, *spread.receivers):
            declared = Declared(plans[name])
            written = (paths.spread_bundle(spread.cache, "0" * 12), spread.cache + "/x", paths.CACHE_SPREAD)
            assert [p for p in written if not declared.admits(p)] == [], name
