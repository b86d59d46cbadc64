"""The pyinfra run's wiring: one plan for the whole run, made once, and the roll summary at its end.

Every deploy function (:mod:`instinct_fleet.deploys`) calls :func:`plan_for` (or
:func:`fleet_plan`). The first host to ask reads every needed host's preflight
fact at once, validates, builds each host's plan and desired state, and
classifies the roll; every other host waits for that answer. Stages branch only
on it, and it does not change during the run.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pyinfra.api.state import BaseStateCallback

from instinct_fleet.converge import gpuhealth, hostchecks, managed, preflight, routerwheel, watchdog
from instinct_fleet.converge.facts import HostReport as HostReportFact
from instinct_fleet.converge.hostfacts import ClusterView, HostFacts
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.managed import UNTOUCHED
from instinct_fleet.converge.preflight import HostReport
from instinct_fleet.fleet.roll import ROLLBACK_ENV, SUMMARY_ENV, Journal, RollPlan, dump_summary, format_summary, plan_roll
from instinct_fleet.fleet.spread import WARM_ENV
from instinct_fleet.model import gate
from instinct_fleet.model.catalog import Catalog
from instinct_fleet.model.inventory import HostData, hosts_of, plan_hosts, project_of
from instinct_fleet.model.origins import Sources
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.spec import HostSpec


def _checked(spec: HostSpec, findings: list[Finding], report: HostReport, restore: str | None) -> Checked:
    """Validation findings and preflight problems for one host, each with its rule; ``restore``: the
    generation ``instinct-fleet rollback`` puts back, whose files then replace the rendered serving files."""
    errors = [f for f in findings if f.severity == "error"]
    warnings = [f for f in findings if f.severity == "warning"]
    if not errors and spec.pools:  # read once for the fleet; a router host without its files fails alone
        try:
            routerwheel.members(spec.vars.router_version, spec.vars.router_wheel)
        except routerwheel.WheelError as error:
            errors.append(finding("router-wheel", spec.host, "router_version", str(error)))
    if not errors:
        errors += hostchecks.hard_problems(report, spec)
    if not errors and restore is not None and spec.serving_units:
        errors += hostchecks.restore_problems(report, spec, restore)
    kept = report.generations
    restoring = kept.restore_files if restore is not None and kept.restore is not None and not errors else None
    return Checked(spec, report, errors, warnings + hostchecks.host_findings(report, spec), restoring)


@dataclass(frozen=True)
class Checked:
    """One host before its plan: validated, its facts read (``reached``), its cluster not yet joined."""

    spec: HostSpec
    report: HostReport
    errors: list[Finding]
    warnings: list[Finding]
    restoring: dict[str, bytes] | None = None
    reached: bool = True


def join_cluster(host: Checked, members: dict[str, Checked | None]) -> tuple[ClusterView | None, list[Finding]]:
    """A cluster member's node IP, the head's IP and every member's IP, all read from facts; or why not."""
    cluster = host.spec.cluster
    if cluster is None or cluster.nic is None:
        return None, []
    ips: dict[str, str] = {}
    head_ip = None
    errors = []
    for name, member in sorted(members.items()):
        if member is None or not member.reached:
            why = f"cluster member {name} could not be reached for its preflight facts"
            errors.append(finding("host-cluster-member", host.spec.host, "ray_cluster", why))
            continue
        ip = member.report.addresses.get(cluster.nic)
        if ip is None:
            why = f"cluster member {name} has no IPv4 address on cluster_nic {cluster.nic}"
            errors.append(finding("host-cluster-nic", host.spec.host, "cluster_nic", why))
            continue
        ips[name] = ip
        if member.spec.cluster is not None and member.spec.cluster.role == "head":
            head_ip = ip
    node_ip = ips.get(str(host.spec.host))
    if node_ip is None or head_ip is None or errors or host.errors:
        return None, errors
    return ClusterView(node_ip, head_ip, tuple(sorted(set(ips.values())))), errors


def _plan(
    host: Checked, cluster: ClusterView | None, more: list[Finding], majority: gpuhealth.Majority, ask: gpuhealth.Ask, now: float
) -> HostPlan:
    """The host's plan, whole: a host that failed preflight renders nothing (its facts may not fit its spec).

    The GPU health verdict's errors quarantine the instances they touch; on a Ray cluster member they fail the host
    instead, as an unreachable member does: the cluster's one instance cannot serve without it."""
    name = str(host.spec.host)
    judged = gpuhealth.judge(host.report, host.spec, majority) if host.reached and not host.errors else []
    warnings = (*host.warnings, *(j.finding for j in judged if j.finding.severity == "warning"))
    wrong = tuple(j.finding for j in judged if j.finding.severity == "error")
    held = None
    if host.spec.cluster is not None:
        cut = f"the Ray cluster {host.spec.cluster.name} cannot serve without this member"
        more = [*more, *(dataclasses.replace(f, message=f"{f.message}; {cut}") for f in wrong)]
        wrong = ()
    else:
        if name in ask.admit and wrong:
            why = "the evidence still shows " + "; ".join(f.brief for f in wrong) + ": fix it first (reset, reboot or replace the GPU)"
            more = [*more, finding("quarantine-admit", name, "admit", why)]
        held = gpuhealth.quarantine(host.spec, judged, host.report.quarantine, ask, now)
    errors = (*host.errors, *more)
    facts = HostFacts(host.spec, host.report, cluster, host.restoring, held)
    desired = UNTOUCHED if errors else managed.desired(facts)
    return HostPlan(
        host.spec,
        host.report,
        cluster,
        host.restoring,
        held,
        errors=errors,
        warnings=warnings,
        desired=desired,
        reached=host.reached,
        health=wrong,
    )


Reader = Callable[[dict[str, HostSpec]], dict[str, HostReport | None]]


def plan_inventory(
    hosts: list[HostData],
    active: set[str],
    read_reports: Reader,
    restore: str | None = None,
    catalog: Catalog | None = None,
    ask: gpuhealth.Ask | None = None,
    now: float | None = None,
) -> dict[str, HostPlan]:
    """Plans for the ``active`` hosts and the members of their clusters (a member needs its peers' addresses).

    Specs and cross-host validation come from every host of the inventory; facts
    come from ``read_reports``, called once with the specs of the hosts needed
    (None for a host that cannot be reached). ``ask``: an operator's quarantine or admit; ``now``: the run's time,
    which the quarantine record's re-admissions are counted from.
    """
    ask = ask or gpuhealth.Ask()
    now = time.time() if now is None else now
    planned = {str(spec.host): (spec, findings) for spec, findings in plan_hosts(hosts, catalog)}
    clusters: dict[str, list[str]] = {}
    for name, (spec, _) in planned.items():
        if spec.cluster is not None:
            clusters.setdefault(spec.cluster.name, []).append(name)
    needed = set(active) & set(planned)
    for names in clusters.values():
        if needed & set(names):
            needed |= set(names)
    reports = read_reports({name: planned[name][0] for name in sorted(needed)})
    checked: dict[str, Checked] = {}
    for name in sorted(needed):
        spec, findings = planned[name]
        report = reports.get(name)
        if report is None:
            why = f"no preflight facts: the host could not be reached, or did not answer within command_timeout ({spec.vars.command_timeout}s)"
            unreached = [finding("host-unreachable", spec.host, "preflight", why)]
            checked[name] = Checked(spec, preflight.parse_report(""), unreached, [], reached=False)
        else:
            checked[name] = _checked(spec, findings, report, restore)
    # The fleet's agreement (firmware, driver, partitions) is judged against every host read in this run.
    majority = gpuhealth.majority(c.report for c in checked.values() if c.reached and not c.errors)
    plans = {}
    for name, host in checked.items():
        cluster = host.spec.cluster
        members = {n: checked.get(n) for n in clusters[cluster.name]} if cluster is not None else {}
        view, errors = join_cluster(host, members)
        plans[name] = _plan(host, view, errors, majority, ask, now)
    return plans


@dataclass(frozen=True)
class FleetPlan:
    """What one pyinfra run decided before executing anything: every host's plan, the roll, and who fetches first.

    ``pulls``: per host that lacks its image, ``seed`` (it pulls first, filling a pull-through cache) or ``after``
    (:func:`image_seeds`); ``weight_seeds``: per model repository missing from ``weights_source``, the one host that
    downloads it there (:func:`weight_seeds`).
    """

    plans: dict[str, HostPlan]
    roll: RollPlan
    pulls: dict[str, Literal["seed", "after"]]
    weight_seeds: dict[str, str]
    journal: Journal  # what the run's roll did: the one part of this object the run appends to

    @classmethod
    def of(cls, plans: dict[str, HostPlan], warm: bool = False) -> FleetPlan:
        """The run's plan, made whole from the hosts' plans (``warm``: an ``instinct-fleet warm`` run)."""
        seeds = image_seeds(plans)
        pulls: dict[str, Literal["seed", "after"]] = {
            name: "seed" if name in seeds else "after" for name, plan in plans.items() if plan.ok and plan.pulls_image
        }
        roll = plan_roll(plans, warm)
        return cls(plans, roll, pulls, weight_seeds(plans), Journal(roll))


def image_seeds(plans: dict[str, HostPlan]) -> set[str]:
    """One host per image that is missing somewhere: the first, by name, of those that need to pull it.

    A pull-through cache fetches a layer from upstream for every request it cannot answer yet,
    so N hosts pulling at once can cost N upstream fetches of a 20+ GB image. The seed pulls
    first and fills the cache; the rest pull after it, from the cache.
    """
    missing: dict[str, list[str]] = {}
    for name, plan in sorted(plans.items()):
        if plan.ok and plan.pulls_image:
            missing.setdefault(plan.image, []).append(name)
    return {hosts[0] for hosts in missing.values()}


def weight_seeds(plans: dict[str, HostPlan]) -> dict[str, str]:
    """For each model missing from ``weights_source``, the first host by name that needs it: that host
    downloads it into the source once, and every host copies it from there after a barrier."""
    seeds: dict[str, str] = {}
    for name, plan in sorted(plans.items()):
        if plan.ok:
            for w in plan.desired.weights:
                if not plan.source_has(w):
                    seeds.setdefault(w.source, name)
    return seeds


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
    it as JSON: INSTINCT_FLEET_ROLL_JSON names the file)."""

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
            if lost.name in self.fleet.plans and not self.fleet.journal.reasons.get(lost.name) and not watchdog.connected(lost):
                self.fleet.journal.note(lost.name, "lost its SSH connection during the run (host down, killed or rebooted)")
        # No operation started: pyinfra's --dry (or no host left, whose rows say why): what would have rolled.
        rows = summary_rows(self.fleet, hosts, {h.name for h in state.failed_hosts}, ran=self.last is not None)
        print(format_summary(rows), file=sys.stderr, flush=True)
        target = os.environ.get(SUMMARY_ENV)
        if target:
            Path(target).write_text(dump_summary(rows) + "\n")


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


def _plan_run(state: Any) -> FleetPlan:
    """Plan the inventory: one preflight fact per host needed, all read at once."""
    import gevent
    from pyinfra.api.exceptions import ConnectError
    from pyinfra.context import ctx_host

    everyone = {h.name: h for h in state.inventory}
    data = hosts_of(state.inventory, Sources.of_run(state))
    restore = os.environ.get(ROLLBACK_ENV) or None  # instinct-fleet rollback: the serving files come from a generation
    active = {h.name for h in state.inventory.iter_activated_hosts()}

    def read(name: str, spec: HostSpec) -> HostReport | None:
        timeout = spec.vars.command_timeout
        timer = watchdog.guarded(everyone[name], timeout, "preflight", lambda _host, _why: None)
        with ctx_host.use(everyone[name]):
            try:
                probe = dataclasses.replace(managed.probe(spec), restore=restore)
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

    try:
        ask = gpuhealth.Ask.of_env(os.environ.get(gpuhealth.ASK_ENV))  # instinct-fleet quarantine and admit
    except ValueError as exc:
        from pyinfra.api.exceptions import PyinfraError

        raise PyinfraError(f"{exc}; nothing was deployed") from exc
    plans = plan_inventory(data, active, read_all, restore, gate.catalog(state), ask)
    return FleetPlan.of(plans, warm=os.environ.get(WARM_ENV) == "1")


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


def fleet_plan(state: Any) -> FleetPlan:
    """The plan of this pyinfra run (its State), made once."""
    from gevent.event import AsyncResult

    pending = getattr(state, _PLAN_ATTRIBUTE, None)
    if pending is None:
        pending = AsyncResult()
        setattr(state, _PLAN_ATTRIBUTE, pending)
        try:
            _refuse_unchecked(state)
            fleet = _plan_run(state)
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        state.add_callback_handler(RollReporter(state, fleet))
        state.add_callback_handler(watchdog.Watchdog(fleet.journal.note))
        state.pool = watchdog.ContainedPool(state.pool.size, fleet.journal.note)
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, interrupt_handler(fleet.journal))
        pending.set(fleet)
    result: FleetPlan = pending.get()
    return result


def plan_for(host: Any) -> HostPlan:
    """The plan of a pyinfra host in this run."""
    return fleet_plan(host.state).plans[host.name]
