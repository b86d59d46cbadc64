"""The pyinfra run: its plan made once from the run's inputs, and what the run adds to pyinfra's own process.

Every deploy function (:mod:`instinct_fleet.deploys`) calls :func:`plan_for` (or :func:`fleet_plan`). The first
host to ask reads every needed host's preflight fact at once and makes the plan (instinct_fleet/roll/plan.py);
every other host waits for that answer. Stages branch only on it, and it does not change during the run.

The run's mode (rollback, warm, quarantine, admit, the JSON summary) is its one ``--data`` argument
(instinct_fleet/roll/mode.py). Here the process that pyinfra started gets its handlers: the roll summary at
its end, the watchdog, and SIGINT and SIGTERM.
"""

from __future__ import annotations

import atexit
import dataclasses
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyinfra.api.state import BaseStateCallback

from instinct_fleet.converge import evaluate, watchdog
from instinct_fleet.converge.facts import HostReport as HostReportFact
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.preflight import HostReport
from instinct_fleet.model import gate
from instinct_fleet.model.inventory import RUN_MODE_KEY, hosts_of, project_of
from instinct_fleet.model.origins import Sources
from instinct_fleet.model.spec import HostSpec
from instinct_fleet.roll.mode import RunMode
from instinct_fleet.roll.plan import FleetPlan, plan_inventory
from instinct_fleet.roll.roll import Journal, dump_summary, format_summary


def summary_rows(fleet: FleetPlan, hosts: list[str], failed: set[str], ran: bool = True) -> list[dict[str, Any]]:
    """The roll's rows for ``hosts``, with preflight errors and unreachable hosts explained; ``ran`` False: a dry run."""
    for name in hosts:
        plan = fleet.plans.get(name)
        if plan is None:
            fleet.journal.note(name, "not reachable: no preflight facts (see the connection error above)")
        elif not plan.ok:
            fleet.journal.note(name, "preflight: " + "; ".join(e.brief for e in plan.errors))
    instances = {}
    for name in hosts:
        plan = fleet.plans.get(name)
        instances[name] = plan.desired.serving if plan is not None and plan.ok else ()
    rows = fleet.journal.summary(instances, failed, ran)
    for name in hosts:  # held out by the GPU health verdict: not rolled, stopped, and why
        held = plan.quarantine if (plan := fleet.plans.get(name)) is not None and plan.ok else None
        if held is None:
            continue
        for unit in sorted(held.units):
            why = f"quarantined (GPU health): {held.reason(unit)}"
            rows.append(
                {
                    **dict.fromkeys(("serving_unit", "batch", "start")),
                    **{"host": name, "instance": unit, "status": "quarantined", "why": why, "canary": [], "accuracy": [], "cache": []},
                }
            )
    return rows


class RollReporter(BaseStateCallback):
    """The end-of-run roll summary, per host and instance: pyinfra has no end-of-deploy hook, so a state
    callback prints it when the run's last operation ends (``instinct-fleet deploy --json`` also asks for
    it as JSON: the run mode's ``summary`` names the file)."""

    def __init__(self, state: Any, fleet: FleetPlan, target: str | None) -> None:
        self.fleet = fleet
        self.target = target
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
            if lost.name in self.fleet.plans and not self.fleet.journal.reasons.get(lost.name) and not watchdog.connected(lost):
                self.fleet.journal.note(lost.name, "lost its SSH connection during the run (host down, killed or rebooted)")
        # No operation started: pyinfra's --dry (or no host left, whose rows say why): what would have rolled.
        rows = summary_rows(self.fleet, hosts, {h.name for h in state.failed_hosts}, ran=self.last is not None)
        print(format_summary(rows), file=sys.stderr, flush=True)
        if self.target:
            Path(self.target).write_text(dump_summary(rows) + "\n")


def interrupt_handler(journal: Journal) -> Callable[[int, Any], None]:
    """SIGINT and SIGTERM during a run. Inside a roll batch the batch finishes, health gate included, and no
    other batch opens; the hosts it did not reach fail as ``interrupted``, so the run exits non-zero. Outside a
    batch (or at a second signal) the run stops at once, non-zero, after the summary. pyinfra's own handler
    exits 0, which a pipeline would read as a deploy that succeeded."""

    def handle(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if journal.interrupted is not None or journal.current is None:
            journal.interrupted = journal.interrupted or name
            print(f"\n{name}: stopping now (no roll batch is half done)", file=sys.stderr, flush=True)
            sys.exit(128 + signum)  # the roll summary prints at exit
        journal.interrupted = name
        print(
            f"\n{name}: finishing roll batch {journal.current} (its health gate included), then stopping; {name} again stops at once",
            file=sys.stderr,
            flush=True,
        )

    return handle


# One plan per pyinfra run, kept on the run's State itself, made by the first host that asks;
# pyinfra loads the deploy file for every host at once in greenlets, so the others wait for it.
_PLAN_ATTRIBUTE = "instinct_fleet_plan"


def run_mode(state: Any) -> RunMode:
    """The mode the run was started with (its ``--data`` argument); a wrong one ends the run before any connection."""
    from pyinfra.api.exceptions import PyinfraError

    try:
        return RunMode.of_data(state.inventory.get_override_data().get(RUN_MODE_KEY))
    except ValueError as exc:
        raise PyinfraError(f"{exc}; nothing was deployed") from exc


def _plan_run(state: Any, mode: RunMode) -> FleetPlan:
    """Plan the inventory: one preflight fact per host needed, all read at once."""
    import gevent
    from pyinfra.api.exceptions import ConnectError
    from pyinfra.context import ctx_host

    everyone = {h.name: h for h in state.inventory}
    data = hosts_of(state.inventory, Sources.of_run(state))
    active = {h.name for h in state.inventory.iter_activated_hosts()}

    def read(name: str, spec: HostSpec) -> HostReport | None:
        timeout = spec.vars.command_timeout
        timer = watchdog.guarded(everyone[name], timeout, "preflight", lambda _host, _why: None)
        with ctx_host.use(everyone[name]):
            try:
                probe = dataclasses.replace(evaluate.probe(spec), restore=mode.restore)
                report: HostReport | None = everyone[name].get_fact(
                    HostReportFact, token_path=spec.vars.hf_token_path, probe=probe, _timeout=timeout
                )
                return report
            except ConnectError:  # an unreachable member: its cluster peers fail with a message instead
                return None
            finally:
                timer.kill()

    def read_all(specs: dict[str, HostSpec]) -> dict[str, HostReport | None]:
        jobs = {name: gevent.spawn(read, name, spec) for name, spec in specs.items()}
        gevent.joinall(list(jobs.values()), raise_error=True)
        # A read the watchdog ended holds GreenletExit: no facts from that host.
        return {name: job.value if isinstance(job.value, HostReport) else None for name, job in jobs.items()}

    plans = plan_inventory(data, active, read_all, mode.restore, gate.catalog(state), mode.ask)
    return FleetPlan.of(plans, warm=mode.warm)


def _refuse_unchecked(state: Any) -> None:
    """End the run before its first operation when pyinfra skipped the project's files or an input is invalid.

    pyinfra reads ``config.py`` and ``group_data/`` from the directory it is started in; started
    elsewhere, it deploys without them (the defaults, the wrong recipe) and without the gate. The
    inventory is then validated here, when no gate ran before the first connection.
    """
    from pyinfra.api.exceptions import PyinfraError

    deploy_file = getattr(state, "current_deploy_filename", None)
    if deploy_file:
        project = project_of(deploy_file)
        skipped = [p for p in (project / "group_data", project / "config.py") if p.exists()]
        if skipped and project != Path(state.cwd).resolve():
            raise PyinfraError(
                f"pyinfra was started in {state.cwd}, so it did not read {' or '.join(map(str, skipped))}; "
                f"nothing was deployed. Run it from {project} (cd {project}), or pass --chdir {project}"
            )
    if not gate.check(state, "nothing was deployed: no operation ran on any host"):
        raise PyinfraError("the inventory is invalid (the findings are above); nothing was deployed")


def _attach(state: Any, fleet: FleetPlan, mode: RunMode) -> None:
    """What the run adds to the process pyinfra started, once its plan is made: the roll summary at its end, the
    watchdog that cuts a hung host (and the pool that keeps a host's failure its own), and SIGINT and SIGTERM, which
    finish an open roll batch before the run stops."""
    state.add_callback_handler(RollReporter(state, fleet, mode.summary))
    state.add_callback_handler(watchdog.Watchdog(fleet.journal.note))
    state.pool = watchdog.ContainedPool(state.pool.size, fleet.journal.note)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, interrupt_handler(fleet.journal))


def fleet_plan(state: Any) -> FleetPlan:
    """The plan of this pyinfra run (its State), made once."""
    from gevent.event import AsyncResult

    pending = getattr(state, _PLAN_ATTRIBUTE, None)
    if pending is None:
        pending = AsyncResult()
        setattr(state, _PLAN_ATTRIBUTE, pending)
        try:
            mode = run_mode(state)
            _refuse_unchecked(state)
            fleet = _plan_run(state, mode)
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        _attach(state, fleet, mode)
        pending.set(fleet)
    result: FleetPlan = pending.get()
    return result


def plan_for(host: Any) -> HostPlan:
    """The plan of a pyinfra host in this run."""
    return fleet_plan(host.state).plans[host.name]
