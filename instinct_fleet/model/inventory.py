"""Load a pyinfra inventory and resolve each host's data the way pyinfra does.

pyinfra's own loader is used (host data over group_data over all), so ``plan``
sees exactly the data ``pyinfra INVENTORY deploy.py`` will see.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import io
import os
import re
import traceback
from collections import defaultdict
from collections.abc import Collection, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from instinct_fleet.model import router
from instinct_fleet.model.catalog import Catalog
from instinct_fleet.model.crosscheck import port_map
from instinct_fleet.model.defaults import DEFAULTS
from instinct_fleet.model.origins import Sources, origins, shadowed, sibling_groups
from instinct_fleet.model.rules import Finding, distinct, finding
from instinct_fleet.model.spec import HostSpec, canonical_arg, resolve_host
from instinct_fleet.model.validate import validate_clusters, validate_host, validate_rolling, validate_slo_fleet


class InventoryError(Exception):
    """The inventory cannot be read; the message says why."""


@dataclass(frozen=True)
class HostData:
    """One host as pyinfra resolved it, and the values pyinfra silently chose between.

    ``conflicts`` maps a variable to the (group, value) pairs that disagree on it:
    a host listed in two groups with its own data in each, or in two groups whose
    group data differ. pyinfra keeps one of them without a word.
    """

    name: str
    groups: tuple[str, ...]
    data: dict[str, Any]
    conflicts: dict[str, tuple[tuple[str, Any], ...]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # variable -> where the inventory set it (model/origins.py)
    # mapping variable -> the broader layers whose keys the value in force drops: (where, {key: value}) (origins.shadowed)
    shadowed: dict[str, tuple[tuple[str, dict[str, Any]], ...]] = field(default_factory=dict)


def record_groups() -> None:
    """Keep each pyinfra Inventory's groups as written, host data per group included.

    pyinfra merges a host's data from every group that lists it, so the merged data
    cannot show that two groups disagree; the raw groups can. Idempotent.
    """
    from pyinfra.api.inventory import Inventory

    make = Inventory.make_hosts_and_groups
    if getattr(make, "records_groups", False):
        return

    def make_and_record(self: Any, names: Any, groups: dict[str, Any]) -> None:
        self.instinct_fleet_groups = groups
        make(self, names, groups)

    make_and_record.records_groups = True  # type: ignore[attr-defined]
    Inventory.make_hosts_and_groups = make_and_record  # type: ignore[method-assign]


def _conflicts(inventory: Any, name: str, groups: tuple[str, ...]) -> dict[str, tuple[tuple[str, Any], ...]]:
    raw = getattr(inventory, "instinct_fleet_groups", {})
    own: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    shared: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for group in groups:
        members = raw.get(group, ((), {}))[0]
        for member in members:
            if isinstance(member, tuple) and member[0] == name:
                for key, value in member[1].items():
                    own[key].append((group, value))
        for key, value in inventory.get_group_data(group).items():
            shared[key].append((group, value))
    found = {}
    for key in DEFAULTS:
        pairs = own.get(key) or shared.get(key, [])
        if len({repr(value) for _, value in pairs}) > 1:
            found[key] = tuple(pairs)
    return found


# The one pyinfra ``--data`` key the run reads its mode from (instinct_fleet/roll/mode.py): pyinfra puts it in every
# host's data, but it is an argument of the run, never a variable, so no host's data holds it here.
RUN_MODE_KEY = "instinct_fleet_run"


def hosts_of(inventory: Any, sources: Sources) -> list[HostData]:
    """Every host of a pyinfra Inventory, with its merged data, any conflicts behind it and where each value was set."""
    hosts = []
    for h in inventory:
        groups, data = tuple(h.groups), {k: v for k, v in h.data.dict().items() if k != RUN_MODE_KEY}
        where = origins(inventory, h.name, groups, data, sources)
        hosts.append(
            HostData(h.name, groups, data, _conflicts(inventory, h.name, groups), where, shadowed(inventory, h.name, groups, data, sources))
        )
    return hosts


def unread_group_data(inventory: Any, sources: Sources) -> list[Finding]:
    """A group_data file for a group no host of the inventory is in (``gpus.py`` beside a group ``gpu``): its values reach
    no host, silently. pyinfra keeps such a file's data as a group without hosts."""
    found = []
    elsewhere = sibling_groups(sources)
    groups = sorted({g for h in inventory for g in h.groups} - {"all"})
    for group, (members, data) in sorted(getattr(inventory, "instinct_fleet_groups", {}).items()):
        if members or not data or group in elsewhere:
            continue
        files = [directory / f"{group}.py" for directory in sources.group_dirs if (directory / f"{group}.py").is_file()]
        for path in files:
            close = difflib.get_close_matches(group, groups, n=1)
            hint = f"; did you mean group_data/{close[0]}.py?" if close else f"; its groups are {', '.join(groups)}"
            found.append(
                finding(
                    "group-data-unread",
                    None,
                    sources.shown(path),
                    f"no host of {sources.inventory_text} is in a group {group!r}, so no host reads {', '.join(sorted(data))}{hint}",
                )
            )
    return found


def project_of(deploy_file: str) -> Path:
    """The project a deploy file belongs to: its own directory, as pyinfra's user runs it from there. A linked
    deploy file (the repository's deploy.py) stays in the link's directory; only the directory is resolved."""
    return Path(deploy_file).absolute().parent.resolve()


def find_project(inventory: str, cwd: Path) -> Path:
    """The project an inventory belongs to, when no deploy file or ``--project-dir`` names it.

    The nearest directory at or above the inventory's that holds ``deploy.py`` (what ``init``
    writes), else the current directory when it holds one (an inventory kept outside the
    project, run from the project as pyinfra is); failing both, the same search for
    ``group_data/``. Otherwise there is no project, and reading the inventory without its group
    data would give every host the defaults: refused.
    """
    if not Path(inventory).is_file():
        return cwd.resolve()  # the loader says what is wrong with the path itself
    start = Path(inventory).absolute().parent
    found = nearest_project([start, *start.parents, cwd])
    if found is not None:
        return found
    raise InventoryError(
        f"no project for {inventory}: neither its directory, any directory above it, nor the current one ({cwd}) holds "
        "deploy.py or group_data/, so its group data could not be read. Run this from your project's directory, give "
        "--project-dir, or write a project with `instinct-fleet init DIR`"
    )


def nearest_project(places: Sequence[Path]) -> Path | None:
    """The first of ``places`` that holds deploy.py (what ``init`` writes), else the first that holds group_data/."""
    for marker, is_there in (("deploy.py", Path.is_file), ("group_data", Path.is_dir)):
        for directory in places:
            if is_there(directory / marker):
                return directory.resolve()
    return None


def load_inventory(path: str, project_dir: str | None = None) -> list[HostData]:
    """Every host of ``path`` with its merged data. ``project_dir`` (default: the current directory) holds group_data/."""
    return read_inventory(path, project_dir)[0]


def read_inventory(path: str, project_dir: str | None = None) -> tuple[list[HostData], list[Finding]]:
    """:func:`load_inventory`, and the findings about the project's files rather than a host (group data no host reads)."""
    inventory = pyinfra_inventory(path, project_dir)
    sources = Sources.of(Path(project_dir or os.getcwd()), Path(path))
    return hosts_of(inventory, sources), unread_group_data(inventory, sources)


def pyinfra_inventory(path: str, project_dir: str | None = None) -> Any:
    """pyinfra's own Inventory of ``path`` (group_data from ``project_dir``), its output kept quiet."""
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    inventory_file = Path(path)
    if inventory_file.is_dir():
        raise InventoryError(f"inventory {path!r} is a directory; name the inventory file in it, such as {path.rstrip('/')}/prod.py")
    if not inventory_file.is_file():
        raise InventoryError(f"inventory file {path!r} does not exist")
    if project_dir is not None and not Path(project_dir).is_dir():
        raise InventoryError(f"--project-dir {project_dir!r} is not a directory; it must hold group_data/ (and deploy.py)")
    cwd = project_dir or os.getcwd()  # where pyinfra reads group_data/, as it does (and the inventory's own directory)
    sink = io.StringIO()
    record_groups()
    try:
        with ctx_state.use(State(check_for_changes=False)), redirect_stdout(sink), redirect_stderr(sink):
            inventory = make_inventory(str(inventory_file), cwd=cwd)
    except Exception as exc:  # pyinfra raises many kinds for a broken inventory or group_data file
        inner = getattr(exc, "exception", exc)  # pyinfra wraps errors raised by the file itself
        raise InventoryError(f"cannot load {_blamed(inner, inventory_file, Path(cwd))}: {type(inner).__name__}: {inner}") from exc
    variables = sorted(set(getattr(inventory, "instinct_fleet_groups", {})) & set(DEFAULTS))
    if variables:
        raise InventoryError(
            f"inventory {path!r} defines {', '.join(variables)} at its top level, which pyinfra reads as a group of hosts; "
            "set variables in group_data/*.py or in a host's data"
        )
    return inventory


def _blamed(error: BaseException, inventory: Path, project: Path) -> str:
    """The inventory or group_data file (and line) an error was raised in, by the deepest frame in one of them."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.endswith(".py")]
    ours = [
        f
        for f in frames
        if Path(f.filename).resolve() == inventory.resolve() or Path(f.filename).resolve().parent == (project / "group_data").resolve()
    ]
    if not ours:
        return f"inventory {str(inventory)!r}"
    where = ours[-1]
    kind = "inventory" if Path(where.filename).resolve() == inventory.resolve() else "group data"
    return f"{kind} {where.filename!r} (line {where.lineno})"


def select(hosts: list[HostData], limits: Sequence[str] | None) -> list[HostData]:
    """The hosts ``--limit`` chooses, as pyinfra chooses them: for each pattern, the hosts of the group of that
    name, or else the hosts whose name matches it as a glob; several patterns add up. None: every host."""
    if not limits:
        return hosts
    groups = {g for h in hosts for g in h.groups}
    return [h for h in hosts if any((p in h.groups) if p in groups else fnmatch.fnmatch(h.name, p) for p in limits)]


def conflict_findings(host: HostData) -> list[Finding]:
    return [
        finding(
            "inventory-conflict",
            host.name,
            key,
            f"groups give different values: {', '.join(f'{group}: {value!r}' for group, value in pairs)}; "
            f"pyinfra keeps {host.data.get(key)!r} without a word. List the host once, or set the key in one place",
        )
        for key, pairs in sorted(host.conflicts.items())
    ]


PARALLEL = ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size")


def shadow_findings(host: HostData, spec: HostSpec) -> list[Finding]:
    """A mapping a more specific layer replaced, dropping keys a broader one set: a warning naming both files and the
    keys; an error when a dropped parallel size is not the one in force, since it changes which GPUs an instance gets."""
    found = []
    table = spec.services[0].table if spec.services else None
    for variable, layers in sorted(host.shadowed.items()):
        for where, lost in layers:
            keys = ", ".join(lost)
            said = (
                f"replaces the whole mapping set in {where}, dropping {keys}: pyinfra takes a mapping from the most specific "
                f"level that sets it and never merges it (as Ansible by default); repeat {keys} beside the others"
            )
            changed = [
                name
                for raw, value in lost.items()
                if variable == "vllm_args"
                and (name := canonical_arg(raw, table)) in PARALLEL
                and any(str(svc.args.get(name)) != str(value) for svc in spec.services)
            ]
            if changed:
                found.append(
                    finding(
                        "mapping-replaced-parallel",
                        host.name,
                        variable,
                        f"{said}; {', '.join(changed)} decides how many GPUs each instance takes, and the value in force is not the dropped one",
                    )
                )
            else:
                found.append(finding("mapping-replaced", host.name, variable, said))
    return found


def plan_hosts(hosts: list[HostData], catalog: Catalog | None = None) -> list[tuple[HostSpec, list[Finding]]]:
    """Resolve and validate every host with the project's ``catalog`` (default: the package's recipes and tables); one
    host's errors never hide another's. Each finding names where its value was set."""
    catalog = catalog or Catalog()
    planned = []
    for host in hosts:
        spec, findings = resolve_host(host.name, host.data, catalog, host.origins)
        findings = [*conflict_findings(host), *shadow_findings(host, spec), *findings, *validate_host(spec)]
        planned.append((spec, findings))
    specs, routing = router.attach([spec for spec, _ in planned])
    across = [
        *validate_clusters(specs),
        *validate_rolling(specs),
        *validate_slo_fleet(specs),
        *routing,
        *(f for s in specs if s.pools for f in port_map(s, "router")),
    ]
    return [
        (spec, [located(spec, host.origins, leveled(spec, f)) for f in distinct([*findings, *[f for f in across if f.host == spec.host]])])
        for spec, host, (_, findings) in zip(specs, hosts, planned, strict=True)
    ]


def leveled(spec: HostSpec, f: Finding) -> Finding:
    """The finding at the severity the host's ``validation_levels`` gives its rule (only the rules of what vLLM starts
    with, though not as meant, can be named there)."""
    level = spec.vars.validation_levels.get(f.rule)
    return f if level is None or level == f.severity else dataclasses.replace(f, severity=level)


def variable_of(spec: HostSpec, key: str, written: Collection[str]) -> str | None:
    """The variable of the inventory a finding's key comes from: the key's own head (``vllm_args.tp``, or a key the
    inventory ``written`` that is no variable at all), or for an instance's resolved env var or flag (``main.args.--tp``),
    the layer that gave it (vllm_args, vllm_instances or the recipe); None for what no variable sets (a probe of the host)."""
    head = re.split(r"[.\[]", key, maxsplit=1)[0]
    if head in DEFAULTS or head in written:
        return head
    svc = next((s for s in spec.services if s.name == head), None)
    if svc is None:
        return None
    rest = key[len(head) + 1 :]
    reason = svc.reasons.get(rest.removeprefix("args.").removeprefix("env."), "")
    if reason.startswith("recipe "):
        return "vllm_recipe"
    layer = re.match(r"group_data: (\w+)", reason)
    return layer.group(1) if layer else "vllm_instances"


def located(spec: HostSpec, where: dict[str, str], f: Finding) -> Finding:
    """The finding with the file and line that set its value, when the inventory set it (a default has none)."""
    variable = variable_of(spec, f.key, where)
    said = (
        []
        if variable is None or variable not in where
        else [f"{'' if f.key.startswith(variable) else f'{variable}, '}set in {where[variable]}"]
    )
    said += [f"{other} set in {where[other]}" for other in f.also if other in where]  # a default is set nowhere
    return dataclasses.replace(f, origin="; ".join(said)) if said else f


def with_cluster_peers(planned: list[tuple[HostSpec, list[Finding]]], chosen: set[str]) -> set[str]:
    """``chosen`` and every member of a Ray cluster one of them is in.

    A run limited to one member still reads its peers (their addresses, their
    GPUs), so a peer's invalid data must stop the run as the member's own would.
    """
    clusters = {spec.cluster.name for spec, _ in planned if spec.host in chosen and spec.cluster is not None}
    return chosen | {str(spec.host) for spec, _ in planned if spec.cluster is not None and spec.cluster.name in clusters}
