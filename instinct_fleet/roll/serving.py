"""The operations of one host's turn in the roll: what the serving stage (:func:`instinct_fleet.deploys.serving`) runs inside the host's batch.

Everything whose change takes an instance down happens here, in this order:
the pre-stop hook, stale units stopped, docker's new settings (when they were
held back for the batch), the Ray unit, the vLLM units, the health gate, the
post-start hook. Every operation runs only while the roll lets the batch go on
(``gate``), so a host whose batch never runs keeps its old units and env files.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from pyinfra.api.state import State
from pyinfra.operations.util import any_changed

from instinct_fleet.converge import apply, health, operations, steps
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.live import accuracy, bench, canary
from instinct_fleet.model import paths, probe, workload
from instinct_fleet.model.defaults import Hook
from instinct_fleet.roll import measure, spread
from instinct_fleet.roll.plan import FleetPlan


def _hooks(plan: HostPlan, fleet: FleetPlan, which: str, hook: Hook | None, gate: Callable[[], bool]) -> None:
    if hook is None or not (hook.host or hook.control):  # a hook with no command in either place is no hook
        return
    env = {
        "INSTINCT_FLEET_HOST": str(plan.spec.host),
        "INSTINCT_FLEET_UNITS": " ".join(e.unit for e in plan.desired.endpoints),
        "INSTINCT_FLEET_PORTS": " ".join(str(e.port) for e in plan.desired.endpoints),
    }
    for where, command in (("host", hook.host), ("control", hook.control)):
        if command is not None:
            operations.hook(
                name=f"Roll: {which} hook ({where})", command=command, where=where, env=env, record=fleet.journal.note, _if=gate
            )


def healthy(
    plan: HostPlan,
    gate: Callable[[], bool] = apply.always,
    record: Callable[[str, str], None] | None = None,
    units: set[str] | None = None,
    hold: Callable[[str, str], None] | None = None,
    started: Callable[[str, str, health.Startup], None] | None = None,
) -> None:
    """The health gate: each instance of ``units`` (default: those that were not healthy at preflight) becomes
    healthy (health.serving: /health, its model listed, one token generated) within health_timeout; ``started``
    gets each one's start-up phases."""
    timeout = plan.spec.vars.health_timeout
    table = plan.spec.table
    formats = table.startup_log if table is not None else {}
    for endpoint in plan.desired.endpoints:
        name = endpoint.unit
        if (units is not None and name not in units) or (units is None and endpoint.port in plan.report.healthy_ports):
            continue
        operations.healthy(
            name=f"{name} healthy",
            unit=paths.service(name),
            port=endpoint.port,
            served_model=endpoint.served,
            timeout=timeout,
            key_path=plan.spec.vars.vllm_api_key_path,
            record=record,
            generates=endpoint.generates,
            hold=hold,
            started=started,
            log_formats=formats,
            _if=gate,
            _timeout=timeout + 60,  # the wait ends itself at health_timeout; this bounds a hung host
        )


def _canary(plan: HostPlan, fleet: FleetPlan, phase: str, gate: Callable[[], bool], hold: Callable[[str, str], None] | None) -> None:
    """Benchmark the canary's instances with ``canary_profile`` (instinct_fleet/live/canary.py)."""
    profile = plan.spec.vars.canary_profile
    assert profile is not None  # validate_canary and plan_roll: a canary host has a profile
    runs = [run for svc in plan.serves for run in canary.runs(plan.spec, svc, profile)]
    v = plan.spec.vars
    items, source, _ = probe.of(plan.spec)  # validated
    asks = [(svc.name, bench.probe_command(plan.spec, svc, items, canary.stamp(phase))) for svc in plan.serves] if v.canary_accuracy else []
    measure.canary_measured(
        name=f"Canary: {profile} {phase} the change" + (", and the accuracy probe" if asks else ""),
        phase=phase,
        runs=runs,
        measure=fleet.journal.measure,
        hold=hold,
        asks=asks,
        items=items,
        probe=fleet.journal.probe,
        source=source,
        max_tokens=v.canary_probe_max_tokens,
        _if=gate,
        _timeout=workload.time_limit([job for job, _ in runs]) * len(runs) + accuracy.time_limit(len(items)) * len(asks),
    )


def _rollback(plan: HostPlan, fleet: FleetPlan, batch: int, failed: Callable[[], set[str]], timeout: int) -> None:
    """When the batch failed: every host of it puts back its last healthy generation and gates the instances
    that answered at preflight again (the post-start hook and the host's failure follow, in converge)."""
    host = str(plan.spec.host)

    def back() -> bool:
        return fleet.journal.rolls_back(batch, failed())

    generation = fleet.roll.turns[host].generation
    target = generation.target
    if target is None:
        operations.fail(
            name="Roll: roll back",
            message="this batch failed and the host has no generation that passed the health gate to go back to "
            f"({paths.GENERATIONS_DIR}): fix the inventory and deploy again",
            _if=back,
        )
        return
    fleet.journal.targets[host] = target
    operations.generation_restored(
        name=f"Roll: back to generation {target}",
        number=target,
        script=apply.restore(plan.desired, target, generation.target_files),
        _if=back,
        _timeout=timeout,
    )
    answered = {e.unit for e in plan.desired.endpoints if e.port in plan.report.healthy_ports}
    healthy(plan, back, fleet.journal.note, units=answered)


def converge_batch(plan: HostPlan, fleet: FleetPlan, batch: int, state: State) -> None:
    """Emit this host's operations for ``batch``; each runs only while the roll proceeds (``state``: pyinfra's, whose
    failed hosts say, when an operation runs, which batches failed)."""

    host = str(plan.spec.host)

    def failed() -> set[str]:
        return {h.name for h in state.failed_hosts}

    def gate() -> bool:  # a host whose gate failed in a batch that rolls back does nothing more but roll back
        return fleet.journal.proceeds(batch, failed()) and host not in fleet.journal.unhealthy

    me = fleet.roll.turns[host]
    rolling, stale, pending = me.rolling, me.stale, me.pending
    v = plan.spec.vars
    generation = me.generation
    if me.busy:  # instinct-fleet bench refuses a host while this marker is there
        started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # The watch counts the roll's events from it (its boards' annotations): this batch, its canary.
        apply.step(steps.mark(f"roll batch {batch} started {started}" + ("\ncanary" if me.measured else "")), gate)
    if (pending or stale) and generation.keep is not None:  # before any serving file changes
        kept = "healthy" if generation.keep_healthy else "not healthy at preflight"
        operations.generation_saved(
            name=f"Roll: keep the serving files as generation {generation.keep} ({kept})",
            number=generation.keep,
            keep=v.rolling_keep_generations,
            healthy=generation.keep_healthy,
            _if=gate,
        )
    # Out of every router pool before anything stops (docker's restart stops every container), and before a
    # canary's first measurement, so that the router's clients add nothing to either side of it; the joins
    # follow the health gate, or the rollback's. A router that cannot be reached fails the host here.
    stopping = me.defers_docker or me.force
    left = tuple(m for m in plan.spec.memberships if (stopping or m.unit in pending) and m.unit in plan.report.active_units)
    joins = tuple(m for m in plan.spec.memberships if stopping or m.unit in pending)
    if left:
        apply.step(steps.PoolLeave(left, "Roll: out of the router pools"), gate)
    if me.measured:
        _canary(plan, fleet, "before", gate, None)
    if rolling and plan.desired.endpoints:
        _hooks(plan, fleet, "pre-stop", v.rolling_pre_stop, gate)

    if me.defers_docker:  # dockerd restarts with its new settings, stopping every container, in this batch
        apply.converge(plan, "docker", gate)
        apply.converge(plan, "pull", gate)
    cluster = plan.spec.cluster
    # The operation's budget, not the unit's TimeoutStartSec (render.start_seconds): a command's, plus the Ray wait.
    start_timeout = v.command_timeout + (cluster.ready_timeout if cluster else 0)
    # The others' files match, they run, and their instances answered at preflight.
    all_files = apply.converge(plan, "roll", gate, units=[*stale, *pending], force=me.force, timeout=start_timeout)

    rollback = rolling and v.rolling_on_failure == "rollback"
    healthy(
        plan, gate, fleet.journal.note, units=set(pending), hold=fleet.journal.hold if rollback else None, started=fleet.journal.started
    )
    if me.measured:
        _canary(plan, fleet, "after", gate, fleet.journal.hold if rollback else None)

    def passed() -> bool:
        return gate() and not fleet.journal.rolls_back(batch, failed())

    if joins:
        apply.step(steps.PoolJoin(joins, "Roll: back into the router pools", frozenset(pending)), passed)
    # The caches this host built for hosts of later batches: sent once its instances passed their gate.
    spread.emit_sends(fleet.roll.spreads, host, batch, fleet.journal.carried, passed, v.image_pull_timeout)
    if rollback:
        _rollback(plan, fleet, batch, failed, start_timeout * max(1, len(pending)))
        if left:  # healthy again on the old files (the rollback's gate fails the host otherwise)
            apply.step(
                steps.PoolJoin(left, "Roll: back into the router pools after the rollback"),
                lambda: fleet.journal.rolls_back(batch, failed()),
            )
    if all_files:
        operations.generation_saved(
            name=f"Roll: keep the new serving files as generation {generation.after} (healthy)",
            number=generation.after,
            keep=v.rolling_keep_generations,
            healthy=True,
            _if=[passed, any_changed(*all_files)],
        )
    if rolling and plan.desired.endpoints:  # after a rollback too: the units answer again
        _hooks(plan, fleet, "post-start", v.rolling_post_start, lambda: gate() or fleet.journal.rolls_back(batch, failed()))
    if rollback:  # a host whose own gate failed fails now, back on its old files, so that the run exits non-zero
        operations.fail(
            name="Roll: rolled back",
            message=lambda: f"rolled back to generation {generation.target} after: {fleet.journal.unhealthy.get(host, '')}",
            _if=[lambda: fleet.journal.rolls_back(batch, failed()), lambda: fleet.journal.back(host)],
        )
    if me.busy or me.marker_left:  # a marker left by a roll that failed goes once the host is whole
        apply.step(steps.unmark(), gate)
