"""The declaration read: what each reader of the one table (instinct_fleet/converge/managed.py) takes from it.

- the preflight fact reads the state of exactly the declared things (:func:`probe`, the table's spec-only
  projection);
- the host plan's desired state is the table evaluated, with what an earlier deploy left that is no longer
  declared (:func:`desired`);
- ``plan --explain`` lists the entries (:func:`explain`).
"""

from __future__ import annotations

import fnmatch
import posixpath

from instinct_fleet.converge import managed
from instinct_fleet.converge.entries import (
    FileEntry,
    ImageEntry,
    Off,
    Rendered,
    SysctlEntry,
    TableEntry,
    UnitEntry,
    UserEntry,
    WeightsEntry,
    _Skip,
)
from instinct_fleet.converge.hostfacts import HostFacts
from instinct_fleet.converge.probe import Probe
from instinct_fleet.converge.state import (
    Action,
    Desired,
    Directory,
    Endpoint,
    File,
    Image,
    Reload,
    Restart,
    Roll,
    Sysctl,
    Table,
    Unit,
    Weights,
)
from instinct_fleet.model import paths, render
from instinct_fleet.model.spec import HostSpec


def _then(actions: tuple[Action, ...]) -> str:
    said = []
    for a in actions:
        if isinstance(a, Restart | Reload):
            said.append(f"{type(a).__name__.lower()}s {a.unit}")
        elif isinstance(a, Roll):
            said.append(f"restarts {a.unit} in its roll batch")
        else:
            said.append(f"runs: {a.label}")
    return f", a change {'; '.join(said)}" if said else ""


def explain(spec: HostSpec) -> list[str]:
    """One line per entry the host manages, for ``instinct-fleet plan --explain``; then the ones whose feature is off
    here (:class:`Off`), which a deploy removes or stops only where an earlier one left them."""
    lines = []
    entries = managed.declare(spec)
    off = [(e.path, e.make.why) for e in entries if isinstance(e, FileEntry) and isinstance(e.make, Off) and e.make.left is not None]
    off += [(paths.service(e.name), e.off) for e in entries if isinstance(e, UnitEntry) and e.off is not None]
    for e in entries:
        if (isinstance(e, FileEntry) and isinstance(e.make, Off)) or (isinstance(e, UnitEntry) and e.off is not None):
            continue
        if isinstance(e, FileEntry):
            what = "dir " if e.directory else "file"
            lines.append(f"{what} {e.path}  {e.mode or '-'} {e.owner}:{e.group}  stage {e.stage}{_then(e.then)}")
        elif isinstance(e, UnitEntry):
            lines.append(f"unit {paths.service(e.name)}  stage {e.stage}")
        elif isinstance(e, SysctlEntry):
            lines.append(f"sysctl {e.key}  stage {e.stage}")
        elif isinstance(e, UserEntry):
            lines.append(f"user {e.user.name} in {', '.join(e.user.groups)}  stage {e.user.stage}")
        elif isinstance(e, TableEntry):
            lines.append(f"nftables table {e.name}  stage {e.stage}{_then(e.then)}")
        elif isinstance(e, WeightsEntry):
            lines.append(f"weights {e.weights.model}@{e.weights.revision} -> {e.weights.local}  stage {e.weights.stage}")
        else:
            lines.append(f"image {e.ref}  stage {e.stage}{_then(e.then)}")
    for what, why in off:
        lines.append(f"off ({why}): {what}, removed or stopped where an earlier deploy left it")
    return lines


def probe(spec: HostSpec) -> Probe:
    """What the preflight fact reads besides the hardware: the declared things, before any fact."""
    entries = managed.declare(spec)
    (user,) = (e.user for e in entries if isinstance(e, UserEntry))
    return Probe(
        paths=tuple(dict.fromkeys(e.path for e in entries if isinstance(e, FileEntry))),
        units=tuple(paths.service(e.name) for e in entries if isinstance(e, UnitEntry)),
        user=user.name,
        images=tuple(e.ref for e in entries if isinstance(e, ImageEntry)),
        endpoints=tuple((svc.port, render.served_model(svc), render.generates(svc)) for svc in spec.serves),
        weights=tuple((e.weights.source, e.weights.local) for e in entries if isinstance(e, WeightsEntry)),
        tables=tuple(e.name for e in entries if isinstance(e, TableEntry)),
        sysctls=tuple(e.key for e in entries if isinstance(e, SysctlEntry)),
        api_key_path=spec.vars.vllm_api_key_path,
        router_ports=tuple((pool.port, pool.admin_port) for pool in spec.pools),
    )


def _stale(facts: HostFacts, wanted: set[str]) -> tuple[list[File], list[Unit]]:
    """Units an earlier deploy wrote for instances or a role no longer here (the fact globs for them)."""
    files, units = [], []
    for stale in facts.stale_units:
        units.append(Unit(stale, "roll", enabled=False, running=False, why="no longer in the inventory"))
        for path in (paths.unit_path(stale), paths.unit_env_path(stale)):
            if path not in wanted:
                label = f"Remove {stale}" if path.endswith(".service") else f"Remove {stale} env"
                files.append(File(path, None, "roll", label, actions=(Roll(stale),)))
    return files, units


def _stale_routers(facts: HostFacts, wanted: set[str]) -> tuple[list[File], list[Unit]]:
    """Router units and worker lists an earlier deploy wrote for a pool this host no longer has (router off, a model
    gone, another router_port): the unit stopped and disabled, both files removed, in the router stage."""
    files, units = [], []
    for path in sorted(facts.report.stats):
        if path in wanted or not any(fnmatch.fnmatch(path, g) for g in paths.ROUTER_GLOBS):
            continue
        if path.endswith(".service"):
            name = posixpath.basename(path).removesuffix(".service")
            units.append(Unit(name, "router", enabled=False, running=False, why="no longer a pool of this host"))
        files.append(File(path, None, "router", f"Remove {path}"))
    return files, units


def desired(facts: HostFacts) -> Desired:
    """The declaration evaluated for this host: everything it should have, and what it must no longer have."""
    declared = managed.declare(facts.spec)
    rendered = Rendered(facts, declared)
    files: list[File] = []
    directories: list[Directory] = []
    units: list[Unit] = []
    sysctls: list[Sysctl] = []
    tables: list[Table] = []
    images: list[Image] = []
    weights: list[Weights] = []
    user = None
    for e in declared:
        if isinstance(e, FileEntry):
            made = e.make(rendered)
            if isinstance(made, _Skip):
                continue
            if e.directory:
                directories.append(Directory(e.path, e.mode, e.stage, e.label, e.owner, e.group))
            else:
                files.append(File(e.path, made, e.stage, e.label, e.mode or "644", e.owner, e.group, e.then, e.secret))
        elif isinstance(e, UnitEntry):
            if (unit := e.want(rendered)) is not None:
                units.append(unit)
        elif isinstance(e, SysctlEntry):
            if (value := e.want(rendered)) is not None:
                sysctls.append(Sysctl(e.key, value, e.stage, e.label))
        elif isinstance(e, TableEntry):
            if e.want(rendered):
                tables.append(Table(e.name, e.stage, e.label, e.then))
        elif isinstance(e, ImageEntry):
            images.append(Image(e.ref, e.stage, e.label, e.then))
        elif isinstance(e, WeightsEntry):
            weights.append(e.weights)
        else:
            user = e.user
    stale_files, stale_units = _stale(facts, {f.path for f in files})
    old_files, old_units = _stale_routers(facts, {f.path for f in files})
    return Desired(
        files=(*files, *stale_files, *old_files),
        directories=tuple(directories),
        units=(*units, *stale_units, *old_units),
        user=user,
        sysctls=tuple(sysctls),
        tables=tuple(tables),
        images=tuple(images),
        serving=tuple(rendered.units),
        endpoints=tuple(
            Endpoint(paths.vllm_unit(s.name), s.port, render.served_model(s), render.generates(s))
            for s in facts.serves
            if not facts.quarantined(paths.vllm_unit(s.name))
        ),
        weights=tuple(weights),
    )


# The desired state of a host that failed preflight: the run manages nothing on it (its stages do not run).
UNTOUCHED = Desired(files=(), directories=(), units=())
