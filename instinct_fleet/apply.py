"""Operations that bring declared entries in line: one for each entry that drifted, none for the rest.

The stages keep only their side effects (reloads, restarts, the roll); what a
file or directory holds, its mode and its owner come from the declaration in
:mod:`instinct_fleet.managed`, as the host plan evaluated it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from io import BytesIO
from typing import Any

from pyinfra.operations import files as pyinfra_files

from instinct_fleet import state
from instinct_fleet.hostplan import HostPlan
from instinct_fleet.state import File, Stage

Gate = Callable[[], bool] | None


def files(plan: HostPlan, entries: Iterable[File], gate: Gate = None) -> list[Any]:
    """Write (or remove) each of ``entries`` that differs on the host; returns the operations, for ``_if``."""
    ops = []
    for f in entries:
        if not state.file_drifts(f, plan.report):
            continue
        if f.content is None:
            ops.append(pyinfra_files.file(name=f.label, path=f.path, present=False, _if=gate))
        else:
            ops.append(
                pyinfra_files.put(name=f.label, src=BytesIO(f.content), dest=f.path, mode=f.mode, user=f.owner, group=f.group, _if=gate)
            )
    return ops


def stage(plan: HostPlan, name: Stage, gate: Gate = None) -> list[Any]:
    """Every directory, then every file, of one stage that differs on the host."""
    ops = []
    for d in plan.desired.directories:
        if d.stage == name and state.directory_drifts(d, plan.report):
            ops.append(pyinfra_files.directory(name=d.label, path=d.path, mode=d.mode, user=d.owner, group=d.group, _if=gate))
    return ops + files(plan, plan.desired.stage(name), gate)
