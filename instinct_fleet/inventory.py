"""Load a pyinfra inventory and resolve each host's data the way pyinfra does.

pyinfra's own loader is used (host data over group_data over all), so ``plan``
sees exactly the data ``pyinfra INVENTORY deploy.py`` will see.
"""

from __future__ import annotations

import fnmatch
import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from instinct_fleet.rules import Finding
from instinct_fleet.spec import HostSpec, resolve_host
from instinct_fleet.validate import validate_clusters, validate_host, validate_rolling


class InventoryError(Exception):
    """The inventory cannot be read; the message says why."""


@dataclass(frozen=True)
class HostData:
    name: str
    groups: tuple[str, ...]
    data: dict[str, Any]


def load_inventory(path: str, project_dir: str | None = None) -> list[HostData]:
    """Every host of ``path`` with its merged data. ``project_dir`` holds group_data/."""
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    inventory_file = Path(path)
    if not inventory_file.is_file():
        raise InventoryError(f"inventory file {path!r} does not exist")
    cwd = project_dir or str(inventory_file.resolve().parent.parent)
    sink = io.StringIO()
    try:
        with ctx_state.use(State(check_for_changes=False)), redirect_stdout(sink), redirect_stderr(sink):
            inventory = make_inventory(str(inventory_file), cwd=cwd)
    except Exception as exc:  # pyinfra raises many kinds for a broken inventory file
        inner = getattr(exc, "exception", exc)  # pyinfra wraps errors raised by the file itself
        raise InventoryError(f"cannot load inventory {path!r}: {type(inner).__name__}: {inner}") from exc
    return [HostData(h.name, tuple(h.groups), dict(h.data.dict())) for h in inventory]


def select(hosts: list[HostData], limit: str | None) -> list[HostData]:
    """Hosts whose name or one of whose groups matches ``limit`` (a glob)."""
    if limit is None:
        return hosts
    return [h for h in hosts if fnmatch.fnmatch(h.name, limit) or any(fnmatch.fnmatch(g, limit) for g in h.groups)]


def plan_hosts(hosts: list[HostData]) -> list[tuple[HostSpec, list[Finding]]]:
    """Resolve and validate every host; one host's errors never hide another's."""
    planned = []
    for host in hosts:
        spec, findings = resolve_host(host.name, host.data)
        findings = [*findings, *validate_host(spec)]
        planned.append((spec, findings))
    across = [*validate_clusters([spec for spec, _ in planned]), *validate_rolling([spec for spec, _ in planned])]
    return [(spec, [*findings, *[f for f in across if f.host == spec.host]]) for spec, findings in planned]
