"""The end-of-run roll summary: per host and instance, rolled, started, unchanged, failed (why) or not rolled.

pyinfra has no end-of-deploy hook, so a state callback prints the summary when
the run's last operation ends. ``instinct-fleet deploy --json`` asks for it as
JSON too (INSTINCT_FLEET_ROLL_JSON names the file) and adds it to its output.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyinfra.api.state import BaseStateCallback

from instinct_fleet.roll import SUMMARY_ENV, dump_summary, format_summary
from instinct_fleet.watchdog import connected

if TYPE_CHECKING:
    from instinct_fleet.hostplan import FleetPlan


def summary_rows(fleet: FleetPlan, hosts: list[str], failed: set[str]) -> list[dict[str, Any]]:
    """The roll's rows for ``hosts``, with preflight errors and unreachable hosts explained."""
    for name in hosts:
        plan = fleet.plans.get(name)
        if plan is None:
            fleet.roll.note(name, "not reachable: no preflight facts (see the connection error above)")
        elif not plan.ok:
            fleet.roll.note(name, "preflight: " + "; ".join(e.brief for e in plan.errors))
    instances = {}
    for name in hosts:
        plan = fleet.plans.get(name)
        instances[name] = tuple(plan.unit_files) if plan is not None and plan.ok else ()
    return fleet.roll.summary(instances, failed)


class RollReporter(BaseStateCallback):
    def __init__(self, state: Any, fleet: FleetPlan) -> None:
        self.fleet = fleet
        self.last: str | None = None
        self.done = False
        # pyinfra ends the run early when no host is left ("No hosts remaining"): report then too.
        atexit.register(self.report, state)

    def operation_start(self, state: Any, op_hash: str) -> None:  # type: ignore[override]  # pyinfra calls it on the instance
        if self.last is None:
            self.last = state.get_op_order()[-1]

    def operation_end(self, state: Any, op_hash: str) -> None:  # type: ignore[override]
        if op_hash == self.last:
            self.report(state)

    def report(self, state: Any) -> None:
        if self.done:
            return
        self.done = True
        hosts = sorted(h.name for h in state.inventory if state.is_host_in_limit(h))
        for lost in state.failed_hosts:
            if lost.name in self.fleet.plans and not self.fleet.roll.reasons.get(lost.name) and not connected(lost):
                self.fleet.roll.note(lost.name, "lost its SSH connection during the run (host down, killed or rebooted)")
        rows = summary_rows(self.fleet, hosts, {h.name for h in state.failed_hosts})
        print(format_summary(rows), file=sys.stderr, flush=True)
        target = os.environ.get(SUMMARY_ENV)
        if target:
            Path(target).write_text(dump_summary(rows) + "\n")
