"""The one applier: the steps a planner made (:mod:`instinct_fleet.converge.steps`) turned into what runs.

Two emitters, one per way a change reaches a host:

- :func:`operations`: pyinfra operations, for every stage of :mod:`instinct_fleet.deploys` and the roll's batch
  (:func:`converge` plans a stage and emits it); each operation runs only while the caller's gate says yes and,
  for a step that waits on others, only when one of them changed;
- :func:`shell`: one shell script, for ``instinct-fleet tune``'s trials and a failed batch's rollback (:func:`restore`),
  run as one command under the run's privileges.

What to write, with which mode and owner, and what a change restarts is read from the declared entries by the
planners, never written a second time here.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable, Collection, Mapping
from io import BytesIO
from typing import Any

from pyinfra.operations import files as pyinfra_files
from pyinfra.operations import server, systemd
from pyinfra.operations.util import any_changed

from instinct_fleet.converge import operations as ops
from instinct_fleet.converge import steps as st
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.state import Desired, Stage
from instinct_fleet.model import paths

Gate = Callable[[], bool]


def always() -> bool:
    return True


def label(step: st.Step) -> str:
    """The name a step's operation shows (the declared entry's label, where it has one)."""
    match step:
        case st.Write(file=f):
            return f.label
        case st.Remove() | st.Mark():
            return step.label
        case st.MakeDirectory(directory=d):
            return d.label
        case st.CopyBack():
            return f"Put {step.path} back"
        case st.Group():
            return f"{step.name} group"
        case st.EnsureUser():
            return f"Service user {step.user.name}"
        case st.SetSysctl():
            return step.sysctl.label
        case st.Pull():
            return step.image.label
        case st.CopyWeights():
            return f"Copy {step.weights.model} into the Hugging Face cache"
        case st.Verify():
            return f"{step.unit} passes systemd-analyze verify"
        case st.DaemonReload():
            return f"Reload systemd ({step.title})" if step.title else "Reload systemd"
        case st.Command() | st.RebootHost():
            return step.action.label
        case st.Stop():
            return f"Stop {step.unit} ({step.why})"
        case st.RestartUnit():
            return f"Restart {step.unit} for its new configuration"
        case st.ReloadUnit():
            return f"Reload {step.unit}"
        case st.EnsureUnit():
            return f"{step.unit.name} running and enabled" if step.unit.running else f"{step.unit.name} enabled"
        case st.Refuse():
            return f"{step.path} is there"
        case st.PoolLeave() | st.PoolJoin() | st.PoolSync():
            return step.why
        case st.Say():
            return step.text


def _sysctl_value(value: str) -> int | str:
    return int(value) if value.isdigit() else value  # pyinfra's sysctl fact reads numbers as int


def _operation(step: st.Step, when: list[Any]) -> Any:
    """The pyinfra operation of one step, running ``when`` all of its conditions hold."""
    name = label(step)
    if isinstance(step, st.Write):
        f = step.file
        assert f.content is not None, f"{f.path}: a file declared absent is a Remove step"
        if f.secret:  # never readable by another user, never in a diff (operations.secret_written)
            return ops.secret_written(name=name, path=f.path, content=f.content, owner=f.owner, group=f.group, _if=when)
        return pyinfra_files.put(name=name, src=BytesIO(f.content), dest=f.path, mode=f.mode, user=f.owner, group=f.group, _if=when)
    if isinstance(step, st.Remove):
        return pyinfra_files.file(name=name, path=step.path, present=False, _if=when)
    if isinstance(step, st.MakeDirectory):
        d = step.directory
        return pyinfra_files.directory(name=name, path=d.path, mode=d.mode, user=d.owner, group=d.group, _if=when)
    if isinstance(step, st.Mark) and not step.append:
        return pyinfra_files.put(name=name, src=BytesIO(f"{step.text}\n".encode()), dest=paths.ROLL_MARKER, _if=when)
    if isinstance(step, st.Group):
        return server.group(name=name, group=step.name, system=True, _if=when)
    if isinstance(step, st.EnsureUser):
        u = step.user
        return server.user(
            name=name, user=u.name, system=True, groups=list(u.groups), shell=u.shell, home=u.home, create_home=False, _if=when
        )
    if isinstance(step, st.SetSysctl):
        return server.sysctl(name=name, key=step.sysctl.key, value=_sysctl_value(step.sysctl.value), _if=when)
    if isinstance(step, st.Pull):
        return ops.image_present(name=name, image=step.image.ref, _if=when, _timeout=step.timeout)
    if isinstance(step, st.CopyWeights):
        w = step.weights
        return ops.weights_staged(name=name, model=w.model, source=w.source, local=w.local, owner=w.owner, _if=when, _timeout=step.timeout)
    if isinstance(step, st.Verify):
        return ops.unit_verified(name=name, path=step.path, _if=when)
    if isinstance(step, st.DaemonReload):
        return systemd.daemon_reload(name=name, _if=when)
    if isinstance(step, st.Command):
        return server.shell(name=name, commands=[step.action.command], _if=when)
    if isinstance(step, st.RebootHost):
        return server.reboot(name=name, _if=when)
    if isinstance(step, st.PoolLeave):
        return ops.router_pools_left(name=name, members=step.members, _if=when)
    if isinstance(step, st.PoolJoin):
        return ops.router_pools_joined(name=name, members=step.members, fresh=step.fresh, _if=when)
    if isinstance(step, st.PoolSync):
        return ops.router_pool_synced(name=name, command=step.command, _if=when)
    if isinstance(step, st.Stop):
        return systemd.service(name=name, service=paths.service(step.unit), running=False, enabled=False, _if=when)
    limit: dict[str, Any] = {}
    if isinstance(step, st.RestartUnit | st.EnsureUnit) and step.timeout is not None:
        limit["_timeout"] = step.timeout
    if isinstance(step, st.RestartUnit) and not step.enable:
        how = {"command": "restart"} if step.conditional else {"restarted": True}
        return systemd.service(name=name, service=paths.service(step.unit), running=None, _if=when, **how, **limit)
    if isinstance(step, st.ReloadUnit):
        return systemd.service(name=name, service=paths.service(step.unit), running=None, reloaded=True, _if=when)
    if isinstance(step, st.EnsureUnit):
        want = step.unit
        return systemd.service(name=name, service=paths.service(want.name), running=want.running, enabled=want.enabled, _if=when, **limit)
    raise ValueError(f"{type(step).__name__} ({name}) runs only in a script on the host (apply.shell)")


def operations(planned: tuple[st.Planned, ...], gate: Gate = always) -> list[Any]:
    """The steps as pyinfra operations, in order; returns them (index-aligned with the steps, for ``after``)."""
    emitted: list[Any] = []
    for p in planned:
        when: list[Any] = [gate] if p.gated else []
        if p.after is not None:
            when.append(any_changed(*(emitted[i] for i in p.after)))
        emitted.append(_operation(p.step, when))
    return emitted


def step(one: st.Step, gate: Gate = always) -> Any:
    """One step as its pyinfra operation (the roll's marker)."""
    return operations((st.Planned(one),), gate)[0]


def converge(
    plan: HostPlan,
    stage: Stage,
    gate: Gate = always,
    units: Collection[str] | None = None,
    force: bool = False,
    timeout: int | None = None,
) -> list[Any]:
    """Emit the operations that bring ``stage`` in line on this host (:func:`instinct_fleet.converge.steps.stage`);
    returns the file and directory writes (for ``_if``). ``gate``: every operation runs only while it says yes (the
    roll's batch)."""
    planned = st.stage(plan, stage, units, force, timeout)
    emitted = operations(planned, gate)
    return [op for p, op in zip(planned, emitted, strict=True) if isinstance(p.step, st.Write | st.Remove | st.MakeDirectory)]


def _command(step: st.Step) -> str:
    """One step as a shell command."""
    q = shlex.quote
    if isinstance(step, st.Write):
        f = step.file
        assert f.content is not None and not f.secret, f"{f.path}: a secret never goes through a command line"
        tmp = f"{f.path}.instinct-fleet-tmp"
        data = base64.b64encode(f.content).decode()
        return f"printf %s {q(data)} | base64 -d > {q(tmp)} && chmod {f.mode} {q(tmp)} && chown {f.owner}:{f.group} {q(tmp)} && mv -f {q(tmp)} {q(f.path)}"
    if isinstance(step, st.Remove):
        return f"rm -f {q(step.path)}"
    if isinstance(step, st.Mark):
        return f"printf '%s\\n' {q(step.text)} {'>>' if step.append else '>'} {paths.ROLL_MARKER}"
    if isinstance(step, st.CopyBack):
        if step.mode is None:
            return f"mkdir -p {q(step.path.rsplit('/', 1)[0])} && cp -p {q(step.source)} {q(step.path)}"
        return f"install -D -m {step.mode} -o {step.owner} -g {step.group} {q(step.source)} {q(step.path)}"
    if isinstance(step, st.DaemonReload):
        return "systemctl daemon-reload"
    if isinstance(step, st.Stop):
        return f"{{ systemctl disable --now {q(paths.service(step.unit))} >/dev/null 2>&1 || true; }}"
    if isinstance(step, st.RestartUnit):
        restart = f"systemctl restart {q(paths.service(step.unit))}"
        return f"systemctl enable --quiet {q(paths.service(step.unit))} && {restart}" if step.enable else restart
    if isinstance(step, st.Refuse):
        return f"if [ ! -d {q(step.path)} ]; then printf '%s\\n' {q(step.message)} >&2; exit 1; fi"
    if isinstance(step, st.Say):
        return f"echo {q(step.text)}"
    if isinstance(step, st.Command):
        return step.action.command
    if isinstance(step, st.PoolLeave):
        return f"{{ {ops.worker_calls('remove', step.members)}; }}"
    if isinstance(step, st.PoolJoin):
        return f"{{ {ops.worker_calls('add', step.members, step.fresh)}; }}"
    raise ValueError(f"{type(step).__name__} ({label(step)}) runs only as a pyinfra operation (apply.operations)")


def shell(planned: tuple[st.Planned, ...]) -> str:
    """The steps as one shell command line that stops at the first step that fails. Every step runs: a script is
    made for the files it writes, whose change is known when it is made."""
    assert all(p.after is None for p in planned), "a script runs every step; one that waits on another's change is a pyinfra step"
    return " && ".join(_command(p.step) for p in planned)


def restore(want: Desired, number: int, kept: Mapping[str, str]) -> str:
    """Generation ``number`` back on a host whose batch failed, as one script (:func:`instinct_fleet.converge.steps.restore`)."""
    return shell(st.restore(want, number, kept))
