"""Rolling re-tunes: which serving units a run restarts, in which batch, and when the roll stops.

A *serving unit* is what goes down together: one single-node host with all its
instances, or one whole Ray cluster (head and workers). Each unit is classified
from the preflight facts, before anything runs:

* ``unchanged``: nothing that would restart it differs from what is deployed;
* ``start``: something differs, but nothing of it is serving now (first deploy,
  stopped units), so starting it takes nothing down;
* ``restart``: something differs and the unit is serving: it rolls.

Batch 0 holds every ``start`` unit at once; restarts follow in batches of
``rolling_batch`` units. The serving stage (:func:`instinct_fleet.deploys.serving`) emits each batch's operations
behind a barrier that every host shares, so pyinfra finishes a batch, health
gate included, before the next one begins. Each batch's operations run only
while :meth:`Journal.proceeds` says so; it reads the hosts pyinfra has failed, so
the roll stops as soon as more batches failed than ``rolling_max_failures``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from instinct_fleet.converge.generations import GenerationPlan
from instinct_fleet.converge.health import Startup
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.state import content_differs
from instinct_fleet.live import accuracy, canary
from instinct_fleet.model import paths
from instinct_fleet.model.probe import Item
from instinct_fleet.roll import spread
from instinct_fleet.roll.spread import Carried, Spread

Kind = Literal["unchanged", "start", "restart"]
SEVERITY: dict[Kind, int] = {"unchanged": 0, "start": 1, "restart": 2}
# Why ``instinct-fleet warm`` left a unit as it was: the cache it received (the row's ``cache``) serves the next deploy.
WARM_LEFT = "left for the next deploy: instinct-fleet warm restarts one instance per compile configuration"


@dataclass(frozen=True)
class ServingUnit:
    """A single-node host, or a cluster; ``hosts`` lists the head first."""

    name: str
    hosts: tuple[str, ...]
    kind: Kind


def batch_size(setting: int | str, units: int) -> int:
    """``rolling_batch`` as a count: a percentage of the fleet's serving units, rounded down, at least 1."""
    if isinstance(setting, int):
        return setting
    return max(1, math.floor(units * int(setting.rstrip("%")) / 100))


def combine(kinds: Iterable[Kind]) -> Kind:
    """A cluster's kind is its most disruptive member's: its members restart together."""
    return max(kinds, key=lambda k: SEVERITY[k], default="unchanged")


def batches(units: list[ServingUnit], size: int, canary: bool = False) -> list[list[ServingUnit]]:
    """Batch 0: every unit that starts (nothing of it serves); then the restarts, ``size`` at a time, by name.
    With a canary, the first restart batch is the smallest restarting unit alone (first by name among equals)."""
    starts = sorted((u for u in units if u.kind == "start"), key=lambda u: u.name)
    restarts = sorted((u for u in units if u.kind == "restart"), key=lambda u: u.name)
    first: list[list[ServingUnit]] = []
    if canary and restarts:
        pick = min(restarts, key=lambda u: (len(u.hosts), u.name))
        restarts.remove(pick)
        first = [[pick]]
    return [starts, *first, *[restarts[i : i + size] for i in range(0, len(restarts), size)]]


@dataclass(frozen=True)
class Turn:
    """What one host does in the serving stage, decided from its plan before anything runs (the preflight facts do
    not change during a run), so the stage only acts: :func:`instinct_fleet.roll.serving.converge_batch`."""

    # The host's batch; 0 for a host whose units are unchanged (it checks them in batch 0); None: it has changes but
    # acts in no batch of this run (``instinct-fleet warm`` restarts other hosts, the next deploy rolls it).
    batch: int | None
    rolling: bool  # its serving unit restarts something that serves now
    force: bool  # every serving unit restarts: docker's settings change, or a member of a cluster that rolls
    stale: tuple[str, ...]  # units the inventory no longer names, still there: stopped, their files removed
    pending: tuple[str, ...]  # serving units that (re)start in the batch
    defers_docker: bool  # docker's new settings wait for the batch: restarting dockerd stops every container
    measured: bool  # the canary's host: its instances are benchmarked before and after the change
    generation: GenerationPlan  # what is kept before the serving files change, and where a rollback goes back to
    busy: bool  # something of the host changes in its batch: the roll marker tells ``instinct-fleet bench`` to keep off
    marker_left: bool  # a roll marker a failed roll left behind


def turn(plan: HostPlan, roll: RollPlan, only: frozenset[str] | None = None) -> Turn:
    """One host's :class:`Turn` in ``roll`` (its batches and canary host); ``only`` (``instinct-fleet warm``): the
    instance units it may restart. A host with changes and none of them in ``only`` acts in no batch; its docker
    settings wait as well."""
    host = str(plan.spec.host)
    unit = roll.unit_of(host)
    rolling = unit is not None and unit.kind == "restart"
    # A cluster rolls as one: when any member changes, every member's units restart together.
    force = docker_changed(plan) or (rolling and plan.role is not None)
    stale = tuple(u for u in plan.stale_units if plan.unit_drifted(u) or plan.drifted(paths.unit_path(u)))
    pending = tuple(name for name in plan.desired.serving if force or not plan.serving_in_place(name))
    deferred = defers_docker(plan)
    if only is not None and (pending or stale) and not set(pending) & only:
        return Turn(None, False, False, (), (), deferred, False, plan.generations, False, False)
    if only is not None:
        pending, stale = tuple(name for name in pending if name in only), ()
    return Turn(
        batch=roll.batch_of(host) or 0,
        rolling=rolling,
        force=force,
        stale=stale,
        pending=pending,
        defers_docker=deferred,
        measured=rolling and host == roll.canary_host,
        generation=plan.generations,
        busy=bool(pending or stale or deferred),
        marker_left=plan.drifted(paths.ROLL_MARKER),
    )


@dataclass(frozen=True)
class RollPlan:
    """What one run's roll will do, decided whole from the hosts' plans before any operation (:func:`plan_roll`):
    its serving units and batches, the canary's host and rule, each host's :class:`Turn`, and the compile caches
    carried between hosts. Nothing changes it during the run; what happens is the :class:`Journal`'s."""

    units: tuple[ServingUnit, ...]
    batches: tuple[tuple[ServingUnit, ...], ...]
    max_failures: int
    on_failure: str = "stop"  # rolling_on_failure
    # The canary (canary_profile): the host it is measured on, and how it judges (canary.Rule).
    canary_host: str | None = None
    canary_rule: canary.Rule | None = None
    turns: Mapping[str, Turn] = field(default_factory=dict)  # per host that passed preflight: its part in the roll
    spreads: tuple[Spread, ...] = ()  # the compile caches carried from the first host to build them to later ones
    warm: bool = False  # instinct-fleet warm: only the batches' instances restart; the others wait, their caches filled

    @property
    def idle(self) -> bool:
        """Every serving unit of the fleet is unchanged and no cache travels: one batch (0), whose operations order
        nothing across hosts and which no interrupt can keep from a host (:meth:`Journal.skipped` needs a changed unit)."""
        return len(self.batches) <= 1 and not self.spreads and all(u.kind == "unchanged" for u in self.units)

    def batch_of(self, host: str) -> int | None:
        for index, batch in enumerate(self.batches):
            if any(host in unit.hosts for unit in batch):
                return index
        return None

    def unit_of(self, host: str) -> ServingUnit | None:
        return next((u for u in self.units if host in u.hosts), None)


@dataclass
class Journal:
    """What one run's roll did, appended to as its operations run; it lives as long as pyinfra's State, and the
    hosts pyinfra failed say which batch failed. ``plan``: the roll it follows."""

    plan: RollPlan
    # Per batch, the hosts pyinfra had already failed when the batch began: their failure is not the batch's.
    failed_at_start: dict[int, frozenset[str]] = field(default_factory=dict)
    # Per host: why it did not converge, recorded by the operation that found out (health, hooks).
    reasons: dict[str, list[str]] = field(default_factory=dict)
    # The signal (SIGINT, SIGTERM) that asked the run to stop: the open batch finishes, no other opens.
    interrupted: str | None = None
    current: int | None = None  # the batch that is open: from its first operation to the next batch or the roll's end
    # Per host whose health gate failed in a batch that rolls back: why (the host fails once it is back).
    unhealthy: dict[str, str] = field(default_factory=dict)
    rolled_back: set[int] = field(default_factory=set)  # batches whose units were put back
    targets: dict[str, int] = field(default_factory=dict)  # per host, the generation a rollback restores
    restored: set[str] = field(default_factory=set)  # hosts whose rollback and its gate passed
    # The canary's runs per host and instance and phase ("before", "after"), and its comparisons per host.
    measured: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    compared: dict[str, list[canary.Comparison]] = field(default_factory=dict)
    # The accuracy probe's answers per host and instance and phase, and its verdicts per host.
    probed: dict[tuple[str, str], dict[str, list[accuracy.Answer]]] = field(default_factory=dict)
    answered: dict[str, list[accuracy.Verdict]] = field(default_factory=dict)
    # Per host and serving unit: its start in this roll, from the health gate (how long, cold or warm, the phases).
    starts: dict[tuple[str, str], Startup] = field(default_factory=dict)
    carried: Carried = field(default_factory=Carried)  # what each copy of a compile cache did

    def failed_batches(self, failed: set[str], before: int) -> list[int]:
        """Batches before ``before`` one of whose hosts failed (or failed its gate, to be rolled back) while it ran."""
        bad = failed | set(self.unhealthy)
        return [
            index
            for index in range(min(before, len(self.plan.batches)))
            if index in self.failed_at_start
            and any(h in bad and h not in self.failed_at_start[index] for unit in self.plan.batches[index] for h in unit.hosts)
        ]

    def measure(self, host: str, phase: str, instance: str, runs: list[dict[str, Any]], comparisons: int = 1) -> str | None:
        """Record one canary measurement (``instance``: an instance, or one job of it); after the change, why the
        canary fails (None: it passes, or its inconclusive verdict lets the roll proceed, which the summary says).
        ``comparisons``: how many the canary judges, which share its alpha."""
        self.measured.setdefault((host, instance), {})[phase] = runs
        before = self.measured[(host, instance)].get("before")
        if phase != "after" or before is None or self.plan.canary_rule is None:
            return None
        found = self.plan.canary_rule.compare(instance, before, runs, comparisons)
        self.compared.setdefault(host, []).append(found)
        return self._judged(host, found)

    def probe(
        self, host: str, phase: str, instance: str, items: Sequence[Item], answers: list[accuracy.Answer], instances: int = 1
    ) -> str | None:
        """Record one instance's probe answers; after the change, why its answers fail the canary (None: they pass,
        or are inconclusive and the roll proceeds, which the summary says). ``instances``: how many the canary judges."""
        self.probed.setdefault((host, instance), {})[phase] = answers
        before = self.probed[(host, instance)].get("before")
        if phase != "after" or before is None or self.plan.canary_rule is None:
            return None
        found = self.plan.canary_rule.compare_answers(instance, items, before, answers, instances)
        self.answered.setdefault(host, []).append(found)
        return self._judged(host, found)

    def _judged(self, host: str, found: canary.Comparison | accuracy.Verdict) -> str | None:
        """Why a canary comparison fails the host's batch, or None with its line noted for the summary."""
        assert self.plan.canary_rule is not None  # the callers compared with it
        problem, line = self.plan.canary_rule.judged(found)
        if problem is None:
            self.note(host, line)
        return problem

    def started(self, host: str, unit: str, start: Startup) -> None:
        """A unit passed its health gate in this roll: how it started (the last start wins, after a rollback too)."""
        self.starts[(host, unit)] = start

    def hold(self, host: str, reason: str) -> None:
        """A health gate failed in a batch that rolls back: the host stays in the run to be put back."""
        self.note(host, reason)
        self.unhealthy[host] = reason

    def rolls_back(self, batch: int, failed: set[str]) -> bool:
        """Whether ``batch`` goes back to its last healthy generation: it restarted serving units, one of its
        hosts failed, and ``rolling_on_failure`` is rollback. Batch 0 starts units that served nothing."""
        if self.plan.on_failure != "rollback" or batch == 0 or batch not in self.failed_at_start:
            return False
        if batch in self.failed_batches(failed, batch + 1):
            self.rolled_back.add(batch)
            return True
        return False

    def back(self, host: str) -> bool:
        """The host's rollback and its gate passed (called by the operation after them): it fails now only if
        its own gate had failed, so that the run exits non-zero."""
        self.restored.add(host)
        return host in self.unhealthy

    def proceeds(self, batch: int, failed: set[str]) -> bool:
        """Whether batch ``batch`` may run, given the hosts failed so far. The first call opens the batch;
        after an interrupt, a batch that is not open yet never opens (an open one finishes, gate included)."""
        if batch not in self.failed_at_start and self.interrupted is not None:
            return False
        if len(self.failed_batches(failed, batch)) > self.plan.max_failures:
            return False
        if batch not in self.failed_at_start:
            self.failed_at_start[batch] = frozenset(failed)
            self.current = batch
        return True

    def finish(self) -> bool:
        """The roll's last batch is over (called by the operation after it, on every host)."""
        self.current = None
        return True

    def skipped(self, host: str) -> bool:
        """Whether an interrupt kept this host's batch from opening: the host keeps its old configuration."""
        unit = self.plan.unit_of(host)
        batch = self.plan.batch_of(host)
        return self.interrupted is not None and unit is not None and unit.kind != "unchanged" and batch not in self.failed_at_start

    def note(self, host: str, reason: str) -> None:
        self.reasons.setdefault(host, []).append(reason)

    def outcome(self, host: str, failed: set[str], ran: bool = True) -> tuple[str, str]:
        """(status, why) of one host at the end of the run: rolled, started, unchanged, failed, rolled-back,
        not-rolled or interrupted; ``ran`` False (``--dry``: no operation ran): would-roll or would-start."""
        unit = self.plan.unit_of(host)
        batch = self.plan.batch_of(host) if unit is not None and unit.kind != "unchanged" else None
        why = "; ".join(self.reasons.get(host, []))
        if batch is not None and batch in self.rolled_back:
            if host in self.restored:
                cause = why or "another host of its serving unit failed"
                return "rolled-back", (
                    f"{cause}; rolled back to generation {self.targets.get(host, '?')}, which answers again: "
                    "the host now differs from the inventory, and the next deploy rolls it forward again"
                )
            return "failed", f"{why or 'see the output above'}; its rollback did not complete"
        if self.skipped(host):
            return "interrupted", f"{self.interrupted} before its batch {batch}: it keeps its old configuration; the next deploy rolls it"
        if host in failed:
            if batch is not None and (batch not in self.failed_at_start or host in self.failed_at_start[batch]):
                return "not-rolled", f"failed before its batch {batch}: {why or 'see the output above'}"
            return "failed", why or "see the operation that failed above"
        if unit is None or unit.kind == "unchanged":
            return "unchanged", ""
        if batch is None and self.plan.warm:
            return "not-rolled", WARM_LEFT
        if not ran:
            return ("would-start" if unit.kind == "start" else "would-roll"), f"in batch {batch}; a dry run changed nothing"
        if batch is None or batch not in self.failed_at_start:
            stopped = self.failed_batches(failed, len(self.plan.batches))
            where = ", ".join(map(str, stopped))
            return "not-rolled", f"the roll stopped after batch {where} failed; it keeps its old configuration"
        if unit.kind == "start" and self.plan.canary_rule is not None:
            return "started", f"batch {batch}; no canary: nothing of it served before this deploy to compare with"
        return ("started" if unit.kind == "start" else "rolled"), f"batch {batch}"

    def summary(self, hosts: Mapping[str, tuple[str, ...]], failed: set[str], ran: bool = True) -> list[dict[str, Any]]:
        """One row per host and instance: the end-of-run report (also in ``instinct-fleet deploy --json``)."""
        rows = []
        for host in sorted(hosts):
            status, why = self.outcome(host, failed, ran)
            unit = self.plan.unit_of(host)
            for instance in hosts[host] or ("-",):
                left = self.plan.warm and status == "rolled" and instance not in self.plan.turns[host].pending  # another host built it
                rows.append(
                    {
                        "host": host,
                        "instance": instance,
                        "serving_unit": unit.name if unit else None,
                        "batch": self.plan.batch_of(host) if unit is not None and unit.kind != "unchanged" else None,
                        "status": "not-rolled" if left else status,
                        "why": WARM_LEFT if left else why,
                        "canary": [c.as_json() for c in self.compared.get(host, [])],
                        "accuracy": [v.as_json() for v in self.answered.get(host, [])],
                        "start": start.as_json() if (start := self.starts.get((host, paths.service(instance)))) else None,
                        "cache": self.carried.notes.get(host, []),
                    }
                )
        return rows


def format_summary(rows: list[dict[str, Any]]) -> str:
    """The summary as a table for the terminal; a unit that started in the roll says how (its start-up phases)."""
    head = ("host", "instance", "status", "why")
    table = [head, *[(r["host"], r["instance"], r["status"], _why(r)) for r in rows]]
    widths = [max(len(str(row[i])) for row in table) for i in range(3)]
    lines = ["  ".join(str(cell).ljust(widths[i]) if i < 3 else str(cell) for i, cell in enumerate(row)).rstrip() for row in table]
    return "\n".join(["Roll summary:", *("  " + line for line in lines)])


def _why(row: dict[str, Any]) -> str:
    why = row["why"].splitlines()[0] if row["why"] else ""
    start = Startup(**row["start"]).describe() if row.get("start") else ""
    return "; ".join(part for part in (why, start, *row.get("cache", ())) if part)


def dump_summary(rows: list[dict[str, Any]]) -> str:
    return json.dumps({"roll": rows}, indent=2)


def changed_units(plan: HostPlan) -> set[str]:
    """The serving units whose unit or env file's content differs on the host (mode and owner restart nothing)."""
    want = plan.desired
    return {
        f.restarts for f in want.stage("roll") if f.restarts is not None and f.restarts in want.serving and content_differs(f, plan.report)
    }


def docker_changed(plan: HostPlan) -> bool:
    """Whether dockerd's settings differ: restarting dockerd stops every container on the host."""
    return any(content_differs(f, plan.report) for f in plan.desired.stage("docker"))


def kind(plan: HostPlan) -> Kind:
    """``restart`` when a change would take down something serving now; ``start`` when nothing of it serves."""
    disrupted = changed_units(plan) | set(plan.stale_units)
    if docker_changed(plan):
        disrupted |= set(plan.desired.serving) | set(plan.report.managed_units)
    if not disrupted:
        return "unchanged"
    return "restart" if disrupted & set(plan.report.active_units) else "start"


def defers_docker(plan: HostPlan) -> bool:
    """New docker settings on a serving host wait for its batch: restarting dockerd stops every container."""
    return docker_changed(plan) and kind(plan) == "restart"


def plan_roll(plans: Mapping[str, HostPlan], warm: bool = False) -> RollPlan:
    """The run's serving units, their kind and their batches, from every planned host that passed preflight, and
    the compile caches carried between them. ``warm`` (``instinct-fleet warm``): the batches restart one instance
    per compile configuration (spread.warm_sources), and every other host that serves it receives its cache."""
    ready = {name: plan for name, plan in plans.items() if plan.ok and plan.desired.serving}
    clusters: dict[str, list[HostPlan]] = {}
    units = []
    for name, plan in sorted(ready.items()):
        cluster = plan.spec.cluster
        if cluster is None:
            units.append(ServingUnit(name, (name,), kind(plan)))
        else:
            clusters.setdefault(cluster.name, []).append(plan)
    for cluster_name, members in sorted(clusters.items()):
        members.sort(key=lambda p: (p.role != "head", str(p.spec.host)))
        hosts = tuple(str(p.spec.host) for p in members)
        units.append(ServingUnit(f"cluster {cluster_name}", hosts, combine(kind(p) for p in members)))
    passed = {name: plan for name, plan in sorted(plans.items()) if plan.ok}
    if not ready:
        empty = RollPlan((), ((),), 0)
        return dataclasses.replace(empty, turns={name: turn(plan, empty) for name, plan in passed.items()})
    # validate_rolling has checked that every host carries the same rolling settings.
    v = next(iter(ready.values())).spec.vars
    canaried = v.canary_profile is not None and not warm

    def layout(rolled: list[ServingUnit]) -> RollPlan:
        """The batches of ``rolled`` and the canary's host (the head of a cluster, where its instance answers)."""
        laid = tuple(map(tuple, batches(rolled, batch_size(v.rolling_batch, len(rolled)), canary=canaried)))
        host = laid[1][0].hosts[0] if canaried and len(laid) > 1 and laid[1] else None
        rule = canary.Rule.of(v) if canaried else None
        return RollPlan(tuple(units), laid, v.rolling_max_failures, v.rolling_on_failure, host, rule, warm=warm)

    laid = layout(units)
    turns = {name: turn(plan, laid) for name, plan in passed.items()}
    if not warm:
        spreads = spread.plan(spread.groups(plans, turns)) if v.compile_cache_spread else ()
        return dataclasses.replace(laid, turns=turns, spreads=spreads)
    building = spread.groups(plans, turns)
    sources = spread.warm_sources(building, turns)
    laid = layout([u for u in units if u.hosts[0] in sources])
    return dataclasses.replace(
        laid,
        turns={name: turn(plan, laid, sources.get(name, frozenset())) for name, plan in passed.items()},
        spreads=spread.plan(building, sources, laid.batch_of),
    )
