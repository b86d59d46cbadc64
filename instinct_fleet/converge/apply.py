"""The one applier: what drifted of a stage's declared entries is brought in line, then the actions its change asks for run.

Every stage of :mod:`instinct_fleet.deploys` hands its stage to :func:`converge`; the roll
hands it the serving units of a batch; ``instinct-fleet tune`` writes a trial's
files through :func:`script`, the same entries as a shell script. Modes,
owners and what a change restarts are read from the entries
(:mod:`instinct_fleet.converge.managed`), never written a second time.

The order is the same for every stage:

1. units that must no longer run are stopped (before their files go);
2. the service user and its groups, kernel settings, directories, files, images and model weights that drifted;
3. each unit file written is checked with ``systemd-analyze verify``, and systemd reloads once;
4. the deduplicated actions: commands and reboots, then per unit its restart or reload and its wanted state.

An action runs only when an entry asking for it changed (its operation did
change, or, for a table that is not loaded, the drift itself); a unit's state
is asserted only when it drifted or one of its entries did. A converged host
gets no operation at all.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from io import BytesIO
from typing import Any

from pyinfra.operations import files as pyinfra_files
from pyinfra.operations import server, systemd
from pyinfra.operations.util import any_changed

from instinct_fleet.converge import operations, state
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.state import Action, Desired, File, Reboot, Reload, Restart, Roll, Run, Stage, Unit
from instinct_fleet.model import paths

Gate = Callable[[], bool]

# What "Reload systemd (...)" names for each stage's unit files.
TITLES: dict[Stage, str] = {
    "tuning": "host tuning",
    "runtime": "container runtime",
    "docker": "dockerd settings",
    "pull": "images",
    "weights": "model weights",
    "cluster": "Ray cluster",
    "firewall": "firewall",
    "exporter": "metrics exporter",
    "router": "router",
    "services": "services",
    "roll": "serving units",
}


def always() -> bool:
    return True


@dataclass(frozen=True)
class Selection:
    """The entries of one stage (the roll: of some serving units) out of a host's desired state."""

    stage: Stage
    files: tuple[File, ...]
    directories: tuple[state.Directory, ...]
    units: tuple[Unit, ...]
    sysctls: tuple[state.Sysctl, ...]
    tables: tuple[state.Table, ...]
    images: tuple[state.Image, ...]
    weights: tuple[state.Weights, ...]
    user: state.User | None


def select(want: Desired, stage: Stage, units: Collection[str] | None = None) -> Selection:
    """A stage's entries; ``units``: only the files and units of these serving units (the roll's batch)."""

    def mine(f: File) -> bool:
        return units is None or f.restarts in units

    return Selection(
        stage,
        tuple(f for f in want.files if f.stage == stage and mine(f)),
        tuple(d for d in want.directories if d.stage == stage and units is None),
        tuple(u for u in want.units if u.stage == stage and (units is None or u.name in units)),
        tuple(s for s in want.sysctls if s.stage == stage),
        tuple(t for t in want.tables if t.stage == stage),
        tuple(i for i in want.images if i.stage == stage),
        tuple(w for w in want.weights if w.stage == stage),
        want.user if want.user is not None and want.user.stage == stage and units is None else None,
    )


def _sysctl_value(value: str) -> int | str:
    return int(value) if value.isdigit() else value  # pyinfra's sysctl fact reads numbers as int


def _systemd_reads(path: str) -> bool:
    """Whether systemd reads the file (a unit or a drop-in): a change of it needs a daemon-reload."""
    return path.startswith(paths.SYSTEMD_DIR + "/")


def _unit_name(path: str) -> str | None:
    """The unit a unit file defines (None for a drop-in or any other file)."""
    if _systemd_reads(path) and path.endswith(".service") and path.count("/") == paths.SYSTEMD_DIR.count("/") + 1:
        return path.rsplit("/", 1)[-1].removesuffix(".service")
    return None


def converge(
    plan: HostPlan,
    stage: Stage,
    gate: Gate = always,
    units: Collection[str] | None = None,
    force: bool = False,
    timeout: int | None = None,
) -> list[Any]:
    """Emit the operations that bring ``stage`` in line on this host; returns the file and directory writes (for ``_if``).

    ``gate``: every operation runs only while it says yes (the roll's batch);
    ``units``: only these serving units' entries; ``force``: restart those units
    whatever changed (a cluster rolls as one, new docker settings stopped every
    container); ``timeout``: for the restarts and starts (a Ray head's start waits
    for its cluster). :class:`~instinct_fleet.converge.state.Roll` actions run only here in
    the roll (stage ``roll``); elsewhere they are the roll's to run.
    """
    report = plan.report
    sel = select(plan.desired, stage, units)
    limit: dict[str, Any] = {} if timeout is None else {"_timeout": timeout}
    triggers: dict[Action, list[Any]] = {}  # action -> the operations that ask for it (None: a drift with no operation)
    touched: set[str] = set()  # units one of whose entries drifted

    def wants(actions: tuple[Action, ...], op: Any) -> None:
        for action in actions:
            triggers.setdefault(action, []).append(op)
            if isinstance(action, Restart | Reload | Roll):
                touched.add(action.unit)

    for u in sel.units:
        if u.running is False and state.unit_drifts(u, report):
            systemd.service(name=f"Stop {u.name} ({u.why})", service=paths.service(u.name), running=False, enabled=False, _if=gate)

    if sel.user is not None and state.user_drifts(sel.user, report):
        for group in sel.user.groups:
            server.group(name=f"{group} group", group=group, system=True, _if=gate)
        server.user(
            name=f"Service user {sel.user.name}",
            user=sel.user.name,
            system=True,
            groups=list(sel.user.groups),
            shell=sel.user.shell,
            home=sel.user.home,
            create_home=False,
            _if=gate,
        )
    for s in sel.sysctls:
        if state.sysctl_drifts(s, report):
            server.sysctl(name=s.label, key=s.key, value=_sysctl_value(s.value), _if=gate)

    written: list[Any] = []
    for d in sel.directories:
        if state.directory_drifts(d, report):
            written.append(pyinfra_files.directory(name=d.label, path=d.path, mode=d.mode, user=d.owner, group=d.group, _if=gate))
    unit_files: list[tuple[str, str, Any]] = []  # unit, its file, the operation that wrote it
    systemd_ops: list[Any] = []
    for f in sel.files:
        if not state.file_drifts(f, report):
            continue
        if f.content is None:
            op = pyinfra_files.file(name=f.label, path=f.path, present=False, _if=gate)
        elif f.secret:  # never readable by another user, never in a diff (operations.secret_written)
            op = operations.secret_written(name=f.label, path=f.path, content=f.content, owner=f.owner, group=f.group, _if=gate)
        else:
            op = pyinfra_files.put(name=f.label, src=BytesIO(f.content), dest=f.path, mode=f.mode, user=f.owner, group=f.group, _if=gate)
        written.append(op)
        wants(f.actions, op)
        if _systemd_reads(f.path):
            systemd_ops.append(op)
        unit = _unit_name(f.path)
        if unit is not None:
            touched.add(unit)
            if f.content is not None:
                unit_files.append((unit, f.path, op))
    for image in sel.images:
        if state.image_drifts(image, report):
            pulled = operations.image_present(name=image.label, image=image.ref, _if=gate, _timeout=plan.spec.vars.image_pull_timeout)
            wants(image.actions, pulled)
    for w in sel.weights:
        if state.weights_drift(w, report):
            operations.weights_staged(
                name=f"Copy {w.model} into the Hugging Face cache",
                model=w.model,
                source=w.source,
                local=w.local,
                owner=w.owner,
                _if=gate,
                _timeout=plan.spec.vars.image_pull_timeout,
            )
    for table in sel.tables:
        if state.table_drifts(table, report):
            wants(table.actions, None)

    for unit, path, op in unit_files:
        operations.unit_verified(name=f"{unit} passes systemd-analyze verify", path=path, _if=[gate, any_changed(op)])
    if systemd_ops:
        systemd.daemon_reload(name=f"Reload systemd ({TITLES[stage]})", _if=any_changed(*systemd_ops))

    def when(action: Action) -> Any:
        ops = triggers.get(action, [])
        return [gate] if None in ops else [gate, any_changed(*ops)]

    for action in triggers:
        if isinstance(action, Run):
            server.shell(name=action.label, commands=[action.command], _if=when(action))
        elif isinstance(action, Reboot):
            server.reboot(name=action.label, _if=when(action))

    wanted = {u.name: u for u in sel.units}
    for name in dict.fromkeys([*wanted, *(a.unit for a in triggers if isinstance(a, Restart | Reload | Roll))]):
        want = wanted.get(name)
        if want is not None and want.running is False:
            continue  # stopped above
        service = paths.service(name)
        restart = next((a for a in triggers if isinstance(a, Restart) or (isinstance(a, Roll) and stage == "roll") if a.unit == name), None)
        forced = force and want is not None
        if restart is not None or forced:
            how = {"command": "restart"} if want is not None and want.running is None else {"restarted": True}
            why = [gate] if forced or restart is None else when(restart)
            systemd.service(name=f"Restart {name} for its new configuration", service=service, running=None, _if=why, **how, **limit)
        reload = next((a for a in triggers if isinstance(a, Reload) and a.unit == name), None)
        if reload is not None:
            systemd.service(name=f"Reload {name}", service=service, running=None, reloaded=True, _if=when(reload))
        if want is not None and (name in touched or forced or state.unit_drifts(want, report)):
            label = f"{name} running and enabled" if want.running else f"{name} enabled"
            systemd.service(name=label, service=service, running=want.running, enabled=want.enabled, _if=gate, **limit)
    return written


def script(files: list[File]) -> str:
    """The same entries as one shell script, for ``instinct-fleet tune``: each file written whole (base64, so any
    byte survives) with its declared mode and owner and moved into place, systemd reloaded when a unit file
    changed, then each unit a change restarts (its Restart or Roll action) restarted, in the files' order."""
    q = shlex.quote
    steps = []
    for f in files:
        assert f.content is not None, f"{f.path}: a file to remove has no place in a trial"
        assert not f.secret, f"{f.path}: a secret never goes through a command line"
        tmp = f"{f.path}.instinct-fleet-tmp"
        data = base64.b64encode(f.content).decode()
        steps.append(
            f"printf %s {q(data)} | base64 -d > {q(tmp)} && chmod {f.mode} {q(tmp)} && chown {f.owner}:{f.group} {q(tmp)} && mv -f {q(tmp)} {q(f.path)}"
        )
    if any(_systemd_reads(f.path) for f in files):
        steps.append("systemctl daemon-reload")
    restarts = dict.fromkeys(a.unit for f in files for a in f.actions if isinstance(a, Restart | Roll))
    steps += [f"systemctl restart {q(paths.service(unit))}" for unit in restarts]
    return " && ".join(steps)


def restore(want: Desired, number: int, kept: Mapping[str, str]) -> str:
    """Generation ``number`` back on a host whose batch failed, as one shell script that runs only then.

    ``kept``: the sha256 by path of that generation's files, read at preflight. Which serving files
    the batch changed is known now, from those and the desired state; the script writes back only
    those, with the mode and owner their entries declare, removes the ones the generation lacks (their
    units stopped first), reloads systemd, and restarts each unit one of them restarts (its entries'
    actions; a unit file the batch removed brings its unit back), Ray first. The content comes from the
    generation on the host: it is the one copy of what ran before the batch.
    """
    q = shlex.quote
    source = f"{paths.GENERATIONS_DIR}/{number}/files"
    missing = q(f"instinct-fleet: generation {number} is not on this host ({paths.GENERATIONS_DIR}); nothing to roll back to")
    serving = {f.path: f for f in want.files if f.restarts in want.serving}
    steps = [f"if [ ! -d {source} ]; then printf '%s\\n' {missing} >&2; exit 1; fi"]
    steps.append(f"printf 'rolled back to generation %s\\n' {number} >> {paths.ROLL_MARKER}")  # the watch counts it
    units: dict[str, None] = {}
    for path, f in serving.items():
        if path in kept or f.content is None:
            continue
        # A file the batch added: its unit (an instance new in the inventory) stops, the file goes.
        if (unit := _unit_name(path)) is not None:
            steps.append(f"systemctl disable --now {q(paths.service(unit))} >/dev/null 2>&1 || true")
        steps.append(f"rm -f {q(path)}")
    for path, digest in kept.items():
        entry = serving.get(path)
        if entry is not None and entry.sha256 == digest:
            continue  # the batch did not change it
        if entry is not None and entry.content is not None:
            steps.append(f"install -D -m {entry.mode} -o {entry.owner} -g {entry.group} {q(source + path)} {q(path)}")
        else:  # the batch removed it (a stale unit, an instance gone from the inventory): back as it was kept
            steps.append(f"mkdir -p {q(path.rsplit('/', 1)[0])} && cp -p {q(source + path)} {q(path)}")
        units |= dict.fromkeys(u for u in (entry.restarts if entry is not None else None, _unit_name(path)) if u is not None)
    steps.append("systemctl daemon-reload")
    kept_units = {u for p in kept if (u := _unit_name(p)) is not None}
    ray_first = sorted((u for u in units if u in kept_units), key=lambda u: not u.startswith(paths.ray_unit("")))
    steps += [f"systemctl enable --quiet {q(paths.service(u))} && systemctl restart {q(paths.service(u))}" for u in ray_first]
    steps.append(f"rm -f {paths.ROLL_MARKER}")
    steps.append(f"echo {q(f'restored generation {number}; restarted: ' + (' '.join(ray_first) or 'nothing'))}")
    return "set -e; " + "; ".join(steps)
