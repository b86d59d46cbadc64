"""Load a pyinfra inventory and resolve each host's data the way pyinfra does.

pyinfra's own loader is used (host data over group_data over all), so ``plan``
sees exactly the data ``pyinfra INVENTORY deploy.py`` will see.
"""

from __future__ import annotations

import fnmatch
import io
import os
import traceback
from collections import defaultdict
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from instinct_fleet.model import router
from instinct_fleet.model.crosscheck import port_map
from instinct_fleet.model.defaults import DEFAULTS
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.spec import HostSpec, resolve_host
from instinct_fleet.model.validate import validate_clusters, validate_host, validate_rolling


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


def hosts_of(inventory: Any) -> list[HostData]:
    """Every host of a pyinfra Inventory, with its merged data and any conflicts behind it."""
    return [HostData(h.name, tuple(h.groups), dict(h.data.dict()), _conflicts(inventory, h.name, tuple(h.groups))) for h in inventory]


def project_of(deploy_file: str) -> Path:
    """The project a deploy file belongs to: its own directory, as pyinfra's user runs it from there. A linked
    deploy file (the repository's deploy.py) stays in the link's directory; only the directory is resolved."""
    return Path(deploy_file).absolute().parent.resolve()


def load_inventory(path: str, project_dir: str | None = None) -> list[HostData]:
    """Every host of ``path`` with its merged data. ``project_dir`` (default: the current directory) holds group_data/."""
    return hosts_of(pyinfra_inventory(path, project_dir))


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


def plan_hosts(hosts: list[HostData]) -> list[tuple[HostSpec, list[Finding]]]:
    """Resolve and validate every host; one host's errors never hide another's."""
    planned = []
    for host in hosts:
        spec, findings = resolve_host(host.name, host.data)
        findings = [*conflict_findings(host), *findings, *validate_host(spec)]
        planned.append((spec, findings))
    specs, routing = router.attach([spec for spec, _ in planned])
    across = [*validate_clusters(specs), *validate_rolling(specs), *routing, *(f for s in specs if s.pools for f in port_map(s, "router"))]
    return [(spec, [*findings, *[f for f in across if f.host == spec.host]]) for spec, (_, findings) in zip(specs, planned, strict=True)]


def with_cluster_peers(planned: list[tuple[HostSpec, list[Finding]]], chosen: set[str]) -> set[str]:
    """``chosen`` and every member of a Ray cluster one of them is in.

    A run limited to one member still reads its peers (their addresses, their
    GPUs), so a peer's invalid data must stop the run as the member's own would.
    """
    clusters = {spec.cluster.name for spec, _ in planned if spec.host in chosen and spec.cluster is not None}
    return chosen | {str(spec.host) for spec, _ in planned if spec.cluster is not None and spec.cluster.name in clusters}
