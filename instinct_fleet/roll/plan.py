"""The run's plan, made whole before any operation: every host's plan from its facts, then the fleet's (the roll,
the image and weight seeds).

:func:`plan_inventory` takes the facts from a reader it is given, so the deploy (instinct_fleet/roll/run.py: the
preflight fact of every host at once), ``tune`` and verify make plans the same way; nothing here touches pyinfra's
state.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from instinct_fleet.converge import evaluate, gpuhealth, hostchecks, preflight, routerwheel
from instinct_fleet.converge.evaluate import UNTOUCHED
from instinct_fleet.converge.hostfacts import ClusterView, HostFacts
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.preflight import HostReport
from instinct_fleet.model import paths, router
from instinct_fleet.model.catalog import Catalog
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.spec import HostSpec
from instinct_fleet.roll.roll import Journal, RollPlan, plan_roll


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


@dataclass(frozen=True)
class Standing:
    """A host's verdict before its desired state: its errors, warnings and GPU health, and the units it holds out.

    Nothing here depends on another host's plan, so every router's pools can be decided on every member's standing
    before any desired state is made (:func:`leave_out`)."""

    errors: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    health: tuple[Finding, ...]
    held: gpuhealth.Quarantine | None


def _judge(host: Checked, more: list[Finding], majority: gpuhealth.Majority, ask: gpuhealth.Ask, now: float) -> Standing:
    """The host's standing: a host that failed preflight renders nothing (its facts may not fit its spec).

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
    return Standing((*host.errors, *more), warnings, wrong, held)


def leave_out(checked: dict[str, Checked], standing: dict[str, Standing]) -> frozenset[str]:
    """The worker URLs no router's pool may list in this run: every instance of a host that failed preflight, could
    not be reached or failed its checks (nothing of ours serves there, and an unprivileged user there who opens the
    port would get the clients' requests and keys). A router's members are always read with it
    (:func:`plan_inventory`), so none is judged on an older run's outcome. An instance the GPU health verdict or an
    operator holds out stays listed: its host serves, its watch and the quarantine take it out of the running pool and
    the pool sync leaves it out (router-sync.py), so that a quarantine changes no router host's files."""
    out: set[str] = set()
    for name, host in checked.items():
        if standing[name].errors or not host.reached:
            out.update(router.worker_url(host.spec, svc.port) for svc in host.spec.serves)
    return frozenset(out)


def joining(checked: dict[str, Checked], standing: dict[str, Standing]) -> frozenset[str]:
    """The worker URLs whose unit was not running on its host at this run's preflight (a host that failed halfway
    through its last deploy, a unit that crashed or was stopped by hand): nothing of ours holds the port, so the pool
    sync must not add what answers there. The host's own roll starts the unit and adds it after its health gate. A
    quarantined unit is not one of them: it is stopped on purpose, and the sync already leaves it out (its watch
    holds it out), so a quarantine changes nothing on a router host at every run."""

    def held(name: str, unit: str) -> bool:
        quarantine = standing[name].held
        return quarantine is not None and unit in quarantine.units

    return frozenset(
        router.worker_url(host.spec, svc.port)
        for name, host in checked.items()
        if host.reached
        for svc in host.spec.serves
        if (unit := paths.vllm_unit(svc.name)) not in host.report.active_units and not held(name, unit)
    )


def _plan(host: Checked, cluster: ClusterView | None, verdict: Standing, out: frozenset[str], waiting: frozenset[str]) -> HostPlan:
    """The host's plan, whole: its pools without the workers ``out`` names and with those ``waiting`` to join after their
    gate, then its desired state."""
    spec = router.without(host.spec, out, waiting)
    facts = HostFacts(spec, host.report, cluster, host.restoring, verdict.held)
    desired = UNTOUCHED if verdict.errors else evaluate.desired(facts)
    return HostPlan(
        spec,
        host.report,
        cluster,
        host.restoring,
        verdict.held,
        errors=verdict.errors,
        warnings=verdict.warnings,
        desired=desired,
        reached=host.reached,
        health=verdict.health,
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
    come from ``read_reports``, called once with the specs of the hosts needed and of their routers' pool members
    (judged to decide the pools, never planned; None for a host that cannot be reached). ``ask``: an operator's quarantine or admit; ``now``: the run's time,
    which the quarantine record's re-admissions are counted from.
    """
    ask = ask or gpuhealth.Ask()
    now = time.time() if now is None else now
    planned = {str(spec.host): (spec, findings) for spec, findings in plan_hosts(hosts, catalog)}
    clusters: dict[str, list[str]] = {}
    for name, (spec, _) in planned.items():
        if spec.cluster is not None:
            clusters.setdefault(spec.cluster.name, []).append(name)

    def with_clusters(names: set[str]) -> set[str]:
        for members in clusters.values():
            if names & set(members):
                names = names | set(members)
        return names

    needed = with_clusters(set(active) & set(planned))
    # A router's pools are decided on every member's facts of this run: they are read and judged, not planned.
    judged = with_clusters(needed | {w.host for name in needed for pool in planned[name][0].pools for w in pool.workers})
    reports = read_reports({name: planned[name][0] for name in sorted(judged)})
    checked: dict[str, Checked] = {}
    for name in sorted(judged):
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
    views, standing = {}, {}
    for name, host in checked.items():
        cluster = host.spec.cluster
        members = {n: checked.get(n) for n in clusters[cluster.name]} if cluster is not None else {}
        views[name], errors = join_cluster(host, members)
        standing[name] = _judge(host, errors, majority, ask, now)
    out, waiting = leave_out(checked, standing), joining(checked, standing)
    return {name: _plan(host, views[name], standing[name], out, waiting) for name, host in checked.items() if name in needed}


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
