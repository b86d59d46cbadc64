"""What the applier does to a host, as data: typed steps computed from the declaration and the facts.

Every change instinct-fleet makes to a host's managed things is one of the steps below. They are made here, by
three planners that read the declared entries (:mod:`instinct_fleet.converge.managed`) and the preflight fact:

- :func:`stage` -- what brings one stage in line (every deploy stage, and the roll's batch of serving units);
- :func:`trial` -- a tune trial's files written and their units restarted;
- :func:`restore` -- a failed batch's serving files back from a generation kept on the host;

and the roll marker's :func:`mark` and :func:`unmark`; the router pools' leave, join and sync are steps too
(:class:`PoolLeave`, :class:`PoolJoin`, :class:`PoolSync`). Two emitters in :mod:`instinct_fleet.converge.apply` turn
steps into what runs: pyinfra operations for the stages, one shell script for ``tune`` and a rollback. A step writes
or removes only the path it names (:func:`written`), so which paths a run may touch is read from the steps alone
(tests/unit/test_declared.py holds them to the declaration).

A :class:`Planned` step may run only after others: ``after`` names the earlier steps of which one must have changed
something (None: it runs whenever its gate lets it). Order is the list's order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from instinct_fleet.converge import state
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.state import Action, Desired, File, Reboot, Reload, Restart, Roll, Run, Stage, Unit
from instinct_fleet.model import paths
from instinct_fleet.model.pools import Membership

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


@dataclass(frozen=True)
class Write:
    """``file`` written whole with its declared mode and owner (a secret: so that no other user can read it)."""

    file: File


@dataclass(frozen=True)
class Remove:
    """``path`` removed."""

    path: str
    label: str


@dataclass(frozen=True)
class MakeDirectory:
    """A directory made, with its declared mode and owner."""

    directory: state.Directory


@dataclass(frozen=True)
class Mark:
    """The roll marker (paths.ROLL_MARKER) says ``text``: written, or appended to (a rollback's line)."""

    text: str
    label: str
    append: bool = False


@dataclass(frozen=True)
class CopyBack:
    """``path`` put back from ``source``, a generation's copy on the host; ``mode`` None keeps the copy's own."""

    source: str
    path: str
    mode: str | None = None
    owner: str = "root"
    group: str = "root"


@dataclass(frozen=True)
class Group:
    """A system group the service user needs (a device group)."""

    name: str


@dataclass(frozen=True)
class EnsureUser:
    """The service user, in its groups, with its home and shell."""

    user: state.User


@dataclass(frozen=True)
class SetSysctl:
    """A kernel setting's live value."""

    sysctl: state.Sysctl


@dataclass(frozen=True)
class Pull:
    """A pinned image pulled when the host lacks it, within ``timeout`` seconds."""

    image: state.Image
    timeout: int


@dataclass(frozen=True)
class CopyWeights:
    """A model copied from ``weights_source`` into the host's cache, within ``timeout`` seconds."""

    weights: state.Weights
    timeout: int


@dataclass(frozen=True)
class Verify:
    """A unit file just written passes ``systemd-analyze verify``."""

    unit: str
    path: str


@dataclass(frozen=True)
class DaemonReload:
    """systemd reads its unit files again (``title``: the stage's, in the operation's name)."""

    title: str


@dataclass(frozen=True)
class Command:
    """A declared entry's :class:`~instinct_fleet.converge.state.Run` action."""

    action: Run


@dataclass(frozen=True)
class RebootHost:
    """A declared entry's :class:`~instinct_fleet.converge.state.Reboot` action."""

    action: Reboot


@dataclass(frozen=True)
class Stop:
    """``unit`` stopped and disabled (``why``: its operation's name says it)."""

    unit: str
    why: str


@dataclass(frozen=True)
class RestartUnit:
    """``unit`` restarted; ``conditional``: a unit whose own conditions decide whether it runs (systemctl restart,
    whatever it was); ``enable``: enabled first (a rollback's unit that came back)."""

    unit: str
    conditional: bool = False
    enable: bool = False
    timeout: int | None = None


@dataclass(frozen=True)
class ReloadUnit:
    """``unit`` reloaded, if it runs."""

    unit: str


@dataclass(frozen=True)
class EnsureUnit:
    """``unit`` in its wanted state (running or not, enabled)."""

    unit: Unit
    timeout: int | None = None


@dataclass(frozen=True)
class Refuse:
    """Stop here, with ``message``, unless the directory ``path`` is there (a generation a rollback needs)."""

    path: str
    message: str


@dataclass(frozen=True)
class PoolLeave:
    """These instances out of every router pool that lists them, before they stop (``why``: the operation's name)."""

    members: tuple[Membership, ...]
    why: str


@dataclass(frozen=True)
class PoolJoin:
    """These instances back into every router pool that lists them, after their gate; ``fresh``: the units restarted
    with new serving files, whose watch record is cleared first (the rest stay out while their watch holds them)."""

    members: tuple[Membership, ...]
    why: str
    fresh: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PoolSync:
    """A running router's pool converged to its worker file by the declared sync script (``command``)."""

    command: str
    why: str


@dataclass(frozen=True)
class Say:
    """A line on the script's output (what a rollback did)."""

    text: str


Step = (
    Write
    | Remove
    | MakeDirectory
    | Mark
    | CopyBack
    | Group
    | EnsureUser
    | SetSysctl
    | Pull
    | CopyWeights
    | Verify
    | DaemonReload
    | Command
    | RebootHost
    | Stop
    | RestartUnit
    | ReloadUnit
    | EnsureUnit
    | Refuse
    | PoolLeave
    | PoolJoin
    | PoolSync
    | Say
)


@dataclass(frozen=True)
class Planned:
    """A step, when it runs: only if one of the steps ``after`` (their indices) changed something, None: always;
    ``gated`` False: also when the caller's gate has closed since (systemd reloads the unit files already written)."""

    step: Step
    after: tuple[int, ...] | None = None
    gated: bool = True


def written(step: Step) -> str | None:
    """The path a step writes or removes (None: it writes none)."""
    if isinstance(step, Write):
        return step.file.path
    if isinstance(step, Remove | CopyBack):
        return step.path
    if isinstance(step, MakeDirectory):
        return step.directory.path
    if isinstance(step, Mark):
        return paths.ROLL_MARKER
    return None


class _Steps:
    """The list a planner builds; :meth:`add` returns the step's index, for the steps that run after it."""

    def __init__(self) -> None:
        self.items: list[Planned] = []

    def add(self, step: Step, after: tuple[int, ...] | None = None, gated: bool = True) -> int:
        self.items.append(Planned(step, after, gated))
        return len(self.items) - 1


def systemd_reads(path: str) -> bool:
    """Whether systemd reads the file (a unit or a drop-in): a change of it needs a daemon-reload."""
    return path.startswith(paths.SYSTEMD_DIR + "/")


def unit_name(path: str) -> str | None:
    """The unit a unit file defines (None for a drop-in or any other file)."""
    if systemd_reads(path) and path.endswith(".service") and path.count("/") == paths.SYSTEMD_DIR.count("/") + 1:
        return path.rsplit("/", 1)[-1].removesuffix(".service")
    return None


def stage(
    plan: HostPlan, stage: Stage, units: Collection[str] | None = None, force: bool = False, timeout: int | None = None
) -> tuple[Planned, ...]:
    """The steps that bring ``stage`` in line on this host, from what drifted of its entries.

    ``units``: only these serving units' entries; ``force``: restart those units whatever changed (a cluster rolls
    as one, new docker settings stopped every container); ``timeout``: for the restarts and starts (a Ray head's
    start waits for its cluster). :class:`~instinct_fleet.converge.state.Roll` actions restart only here in the roll
    (stage ``roll``); elsewhere they are the roll's to run. The order is the same for every stage:

    1. units that must no longer run are stopped (before their files go);
    2. the service user and its groups, kernel settings, directories, files, images and model weights that drifted;
    3. each unit file written is checked with ``systemd-analyze verify``, and systemd reloads once;
    4. the deduplicated actions: commands and reboots, then per unit its restart or reload and its wanted state.

    An action runs only when an entry asking for it changed (its step did change, or, for a table that is not
    loaded, the drift itself); a unit's state is asserted only when it drifted or one of its entries did. A
    converged host gets no step at all.
    """
    report = plan.report
    sel = state.select(plan.desired, stage, units)
    pull_timeout = plan.spec.vars.image_pull_timeout
    s = _Steps()
    triggers: dict[Action, list[int | None]] = {}  # action -> the steps that ask for it (None: a drift with no step)
    touched: set[str] = set()  # units one of whose entries drifted

    def wants(actions: tuple[Action, ...], index: int | None) -> None:
        for action in actions:
            triggers.setdefault(action, []).append(index)
            if isinstance(action, Restart | Reload | Roll):
                touched.add(action.unit)

    for u in sel.units:
        if u.running is False and state.unit_drifts(u, report):
            s.add(Stop(u.name, u.why))
    if sel.user is not None and state.user_drifts(sel.user, report):
        for group in sel.user.groups:
            s.add(Group(group))
        s.add(EnsureUser(sel.user))
    for sysctl in sel.sysctls:
        if state.sysctl_drifts(sysctl, report):
            s.add(SetSysctl(sysctl))
    for d in sel.directories:
        if state.directory_drifts(d, report):
            s.add(MakeDirectory(d))
    unit_files: list[tuple[str, str, int]] = []  # unit, its file, the step that wrote it
    systemd_steps: list[int] = []
    for f in sel.files:
        if not state.file_drifts(f, report):
            continue
        index = s.add(Write(f) if f.content is not None else Remove(f.path, f.label))
        wants(f.actions, index)
        if systemd_reads(f.path):
            systemd_steps.append(index)
        unit = unit_name(f.path)
        if unit is not None:
            touched.add(unit)
            if f.content is not None:
                unit_files.append((unit, f.path, index))
    for image in sel.images:
        if state.image_drifts(image, report):
            wants(image.actions, s.add(Pull(image, pull_timeout)))
    for w in sel.weights:
        if state.weights_drift(w, report):
            s.add(CopyWeights(w, pull_timeout))
    for table in sel.tables:
        if state.table_drifts(table, report):
            wants(table.actions, None)

    for unit, path, index in unit_files:
        s.add(Verify(unit, path), after=(index,))
    if systemd_steps:
        s.add(DaemonReload(TITLES[stage]), after=tuple(systemd_steps), gated=False)

    def when(action: Action) -> tuple[int, ...] | None:
        asked = triggers.get(action, [])
        return None if None in asked else tuple(i for i in asked if i is not None)

    for action in triggers:
        if isinstance(action, Run):
            s.add(Command(action), after=when(action))
        elif isinstance(action, Reboot):
            s.add(RebootHost(action), after=when(action))

    wanted = {u.name: u for u in sel.units}
    for name in dict.fromkeys([*wanted, *(a.unit for a in triggers if isinstance(a, Restart | Reload | Roll))]):
        want = wanted.get(name)
        if want is not None and want.running is False:
            continue  # stopped above
        restart = next((a for a in triggers if isinstance(a, Restart) or (isinstance(a, Roll) and stage == "roll") if a.unit == name), None)
        forced = force and want is not None
        if restart is not None or forced:
            conditional = want is not None and want.running is None
            s.add(RestartUnit(name, conditional=conditional, timeout=timeout), after=None if forced or restart is None else when(restart))
        reload = next((a for a in triggers if isinstance(a, Reload) and a.unit == name), None)
        if reload is not None:
            s.add(ReloadUnit(name), after=when(reload))
        if want is not None and (name in touched or forced or state.unit_drifts(want, report)):
            s.add(EnsureUnit(want, timeout))
    return tuple(s.items)


def trial(files: list[File]) -> tuple[Planned, ...]:
    """A tune trial's files: each written whole, systemd reloaded when a unit file is among them, then each unit a
    change restarts (its Restart or Roll action) restarted, in the files' order."""
    s = _Steps()
    for f in files:
        s.add(Write(f))
    if any(systemd_reads(f.path) for f in files):
        s.add(DaemonReload(""))
    for unit in dict.fromkeys(a.unit for f in files for a in f.actions if isinstance(a, Restart | Roll)):
        s.add(RestartUnit(unit))
    return tuple(s.items)


def restore(want: Desired, number: int, kept: Mapping[str, str]) -> tuple[Planned, ...]:
    """Generation ``number`` back on a host whose batch failed.

    ``kept``: the sha256 by path of that generation's files, read at preflight. Which serving files
    the batch changed is known now, from those and the desired state; only those are put back, with the mode and
    owner their entries declare, the ones the generation lacks removed (their units stopped first), systemd
    reloaded, and each unit one of them restarts (its entries' actions; a unit file the batch removed brings its
    unit back) restarted, Ray first. The content comes from the generation on the host: it is the one copy of what
    ran before the batch. The roll marker gets the rollback's line (the watch counts it), then goes.
    """
    source = f"{paths.GENERATIONS_DIR}/{number}/files"
    serving = {f.path: f for f in want.files if f.restarts in want.serving}
    s = _Steps()
    s.add(Refuse(source, f"instinct-fleet: generation {number} is not on this host ({paths.GENERATIONS_DIR}); nothing to roll back to"))
    s.add(Mark(f"rolled back to generation {number}", "Roll: say the rollback on the marker", append=True))
    units: dict[str, None] = {}
    for path, f in serving.items():
        if path in kept or f.content is None:
            continue
        # A file the batch added: its unit (an instance new in the inventory) stops, the file goes.
        if (unit := unit_name(path)) is not None:
            s.add(Stop(unit, "not in the generation"))
        s.add(Remove(path, f"Remove {path}"))
    for path, digest in kept.items():
        entry = serving.get(path)
        if entry is not None and entry.sha256 == digest:
            continue  # the batch did not change it
        if entry is not None and entry.content is not None:
            s.add(CopyBack(source + path, path, entry.mode, entry.owner, entry.group))
        else:  # the batch removed it (a stale unit, an instance gone from the inventory): back as it was kept
            s.add(CopyBack(source + path, path))
        units |= dict.fromkeys(u for u in (entry.restarts if entry is not None else None, unit_name(path)) if u is not None)
    s.add(DaemonReload(""))
    kept_units = {u for p in kept if (u := unit_name(p)) is not None}
    ray_first = sorted((u for u in units if u in kept_units), key=lambda u: not u.startswith(paths.ray_unit("")))
    for unit in ray_first:
        s.add(RestartUnit(unit, enable=True))
    s.add(unmark())
    s.add(Say(f"restored generation {number}; restarted: " + (" ".join(ray_first) or "nothing")))
    return tuple(s.items)


def mark(text: str) -> Mark:
    """The roll marker written: ``instinct-fleet bench`` and ``tune`` refuse the host while it is there."""
    return Mark(text, "Roll: mark the host as rolling")


def unmark() -> Remove:
    """The roll marker gone: the host is whole (its declared entry: absent)."""
    return Remove(paths.ROLL_MARKER, "Roll: done on this host")
