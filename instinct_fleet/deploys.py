"""The deploy as pyinfra packaged deploys: one ``@deploy`` function per stage, and :func:`fleet` that runs them in order.

A user's ``deploy.py`` is the two lines ``instinct-fleet init`` writes::

    from instinct_fleet.deploys import fleet
    fleet()

and may call single stages instead (a host already prepared by another tool can skip
:func:`tuning`, say), or add operations of its own before or after. Each stage reads the run's
one plan (:func:`instinct_fleet.roll.run.fleet_plan`: every host validated and its facts read
once) and hands its entries to the one applier (:mod:`instinct_fleet.converge.apply`); what
a stage keeps for itself is only its fleet-wide order: seed pulls and downloads first, then
barriers, and the roll's batches.

Defaults are not handed to pyinfra as ``data_defaults``: the typed model resolves every
variable (:mod:`instinct_fleet.model.defaults`), and some defaults follow other variables
(``vllm_image`` follows ``vllm_version``), which a static default dict would break.

Fail closed: whichever stage runs first on a host plans the whole inventory, and when any
chosen host is invalid it ends the run before a single operation is queued
(:func:`instinct_fleet.roll.run.fleet_plan`), so a project whose ``config.py`` lacks the
gate still changes nothing anywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host
from pyinfra.operations import apt

from instinct_fleet.converge import apply, content, managed, operations, steps
from instinct_fleet.model import paths
from instinct_fleet.roll import spread
from instinct_fleet.roll.run import fleet_plan, plan_for
from instinct_fleet.roll.serving import converge_batch, healthy


def stage(name: str, after_preflight: bool = True) -> Callable[[Callable[[], None]], Callable[..., None]]:
    """pyinfra's ``@deploy(name)``, with the host's ``command_timeout`` as every operation's ``_timeout``.

    ``after_preflight``: the stage does nothing on a host that failed preflight (its preflight
    operation fails it, with the reason), so a ``deploy.py`` may call the stages one by one.

    pyinfra's deploy wrapper takes a snapshot of every global argument when the function is
    called, and its operations use that snapshot before host data; so the timeout is put in host
    data before the wrapper runs. The first call plans the whole run (:func:`plan_for`), which also
    validates every host before any operation. An image pull and a health wait set their own
    ``_timeout``; the watchdog (instinct_fleet/converge/watchdog.py) cuts a host whose operation
    outlives its timeout, so a hung host fails alone instead of stalling the run. Arguments given
    to the call (``fleet(_sudo=True)``) apply to every operation, as with any pyinfra deploy.
    """

    def decorate(func: Callable[[], None]) -> Callable[..., None]:
        wrapped = deploy(name)(func)

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> None:
            plan = plan_for(host)
            if after_preflight and not plan.ok:
                return
            host.data._timeout = plan.spec.vars.command_timeout
            wrapped(*args, **kwargs)

        run._inner = func  # type: ignore[attr-defined]  # the function itself, as pyinfra's wrapper keeps it
        return run

    return decorate


@stage("Preflight", after_preflight=False)
def preflight() -> None:
    """Stage 1, read-only: one fact gathers the host; a host that cannot serve fails here, alone."""
    plan = plan_for(host)
    logger.info(f"{host.name}: {plan.summary()}")
    for warning in plan.warnings:
        logger.warning(f"{host.name}: {warning.brief}")
    for wrong in plan.health:
        logger.error(f"{host.name}: {wrong.brief}")
    if plan.quarantine is not None and plan.quarantine.units:
        logger.error(f"{host.name}: quarantined, drained out of the router and stopped: {', '.join(sorted(plan.quarantine.units))}")
    if not plan.ok:
        operations.fail(name="Preflight", message=f"{host.name} cannot serve: " + "; ".join(e.brief for e in plan.errors))


@stage("Host tuning")
def tuning() -> None:
    """Stage 2, packages and host tuning: persistent and idempotent; each setting can be switched off in group_data.

    First the Debian packages the later stages need and the host lacks (docker, curl, nft with a
    firewall, cpupower for the CPU idle unit, which systemd-analyze verify checks before it runs).
    Then NUMA balancing off now and at boot, the kernel command line (GRUB, regenerated; a reboot
    with tune_reboot), the CPU idle unit, the service user and its groups. A tuned host gets no
    command from this stage.
    """
    plan = plan_for(host)
    missing = content.missing_packages(plan)
    if missing:
        apt.packages(name="Install missing packages", packages=missing, update=True, no_recommends=True)
    apply.converge(plan, "tuning")


@stage("Container runtime")
def runtime() -> None:
    """Stage 3: docker's settings and the pinned image pre-pulled, on every host at once, before any batch stops anything.

    New docker settings on a host that is serving wait for its roll batch instead (restarting
    dockerd stops its containers). One host per missing image pulls first (filling a pull-through
    cache), then the rest pull from the cache: pyinfra finishes an operation on every host before
    the next, so the barrier orders the two waves.
    """
    fleet = fleet_plan(host.state)
    plan = fleet.plans[host.name]
    apply.converge(plan, "runtime")  # registry CA certificates and credentials
    if fleet.roll.turns[host.name].defers_docker:
        return
    apply.converge(plan, "docker")
    pull = fleet.pulls.get(host.name)
    if pull is not None:
        if pull == "seed":
            apply.converge(plan, "pull")
        operations.barrier(name="Image: the first pull of each image is done", note="seed pulls done")
        if pull == "after":
            apply.converge(plan, "pull")


@stage("Model weights")
def weights() -> None:
    """Stage 4 (only with weights_source): each model copied into the host's HF cache before its first start.

    A model missing from weights_source is downloaded there once per fleet, by one host, with the
    instance's own image; a barrier holds the other hosts until it is there, then every host copies it.
    """
    fleet = fleet_plan(host.state)
    plan = fleet.plans[host.name]
    v = plan.spec.vars
    missing = [w for w in plan.desired.weights if not plan.source_has(w)]
    if missing and not v.weights_download:
        names = ", ".join(w.model for w in missing)
        operations.fail(
            name="Weights in weights_source",
            message=f"{names} not complete in weights_source ({v.weights_source}) and weights_download is False: "
            "copy the model there (hf download, then write its revision and commit to .instinct-fleet-complete) or set weights_download = True",
        )
        return
    for w in host.loop([w for w in missing if fleet.weight_seeds.get(w.source) == host.name]):  # type: ignore[no-untyped-call]
        operations.weights_downloaded(
            name=f"Download {w.model} into weights_source (once for the fleet)",
            model=w.model,
            revision=w.revision,
            source_root=str(v.weights_source),
            repo=w.source,
            image=plan.image,
            token_path=v.hf_token_path if plan.has_token else None,
            _timeout=v.image_pull_timeout,
        )
    if missing:
        operations.barrier(name="Weights: every missing model is in weights_source", note="weight downloads done")
    apply.converge(plan, "weights")  # each model copied into the host's cache


@stage("Ray cluster")
def cluster() -> None:
    """Stage 5 (multi-node hosts only): what the Ray units need that does not restart them; the units roll in :func:`serving`."""
    apply.converge(plan_for(host), "cluster")


@stage("Firewall")
def firewall() -> None:
    """Stage 6: Ray ports only for cluster members, vLLM ports only for vllm_allow_from (nftables).

    A new ruleset, or a table flushed by hand, reloads its unit.
    """
    apply.converge(plan_for(host), "firewall")


@stage("Metrics exporter")
def exporter() -> None:
    """Stage 7 (metrics_exporter = True): AMD's device metrics exporter as a systemd-managed container; switched off, it is removed."""
    apply.converge(plan_for(host), "exporter")


@stage("Router")
def routers() -> None:
    """Stage 8 (router hosts only): vLLM's router, one unit per pool, and each running pool converged to the inventory.

    A changed worker list never restarts the router: the sync script adds and removes
    workers through its API (an instance that does not answer yet joins after its own
    health gate, in the roll), where the preflight fact found the running pool differs;
    a changed setting or release restarts it.
    """
    plan = plan_for(host)
    apply.converge(plan, "router")
    for pool in plan.spec.pools:  # the preflight fact ran the sync script's --check on each running router
        drift = plan.report.router_drift.get(pool.port, ())
        joining = [f"{url} joins after its gate" for url in sorted(pool.joining)]
        if joining:
            # A worker whose unit was not running at preflight is taken out of the running pool, wherever it is (a
            # router this stage (re)started read it from its file); its own roll adds it back after its gate.
            apply.step(
                steps.PoolSync(managed.sync_command(pool, wait=True), f"Router pool of {pool.model}: {'; '.join([*drift, *joining])}")
            )
        elif drift and not plan.drifted(paths.router_workers(pool.port)):  # a new worker list syncs as it is written
            apply.step(steps.PoolSync(managed.sync_command(pool), f"Router pool of {pool.model}: {'; '.join(drift)}"))


@stage("Serving")
def serving() -> None:
    """Stage 9, the roll: Ray and vLLM units restarted batch by batch behind a health gate.

    Every host walks the same batches; each batch starts with a barrier that every host shares,
    so pyinfra finishes one batch (health gate included) before the next begins. A host acts
    only in its own batch (:mod:`instinct_fleet.roll.roll` says which; :mod:`instinct_fleet.roll.serving`
    holds what it does there).
    """
    fleet = fleet_plan(host.state)
    plan = fleet.plans[host.name]
    # Quarantined instances still running leave their router pools first; the services stage then stops them.
    draining = tuple(m for m in plan.spec.memberships if plan.quarantined(m.unit) and m.unit in plan.report.active_units)
    if draining:
        apply.step(steps.PoolLeave(draining, "GPU health: quarantined instances out of the router pools"))
    apply.converge(plan, "services")  # the config directory, the Hugging Face cache, the watch and the quarantine

    mine = fleet.roll.turns[host.name].batch  # an unchanged host checks its units in batch 0
    if fleet.roll.idle:  # a no-op run: batch 0 alone, with nothing to order across hosts and nothing to interrupt
        if mine == 0:
            converge_batch(plan, fleet, 0, host.state)
        return
    for batch in host.loop(range(len(fleet.roll.batches))):  # type: ignore[no-untyped-call]
        operations.barrier(name=f"Roll: batch {batch}", note=f"roll batch {batch}")
        if batch == mine:
            converge_batch(plan, fleet, batch, host.state)
        # The compile caches the batch's hosts built, into this host's before its own batch (roll/spread.py). pyinfra
        # orders operations of different hosts only through one they share: the barrier puts every send first.
        if any(s.batch == batch for s in fleet.roll.spreads):
            operations.barrier(name=f"Roll: compile caches of batch {batch} sent", note=f"caches of roll batch {batch} sent")
        spread.emit_receives(
            fleet.roll.spreads,
            host.name,
            batch,
            plan.spec.vars.compile_cache_keep,
            fleet.journal.carried,
            lambda: fleet.journal.interrupted is None,
            plan.spec.vars.image_pull_timeout,
        )
    # After the last batch (on every host at once): a host whose batch an interrupt (SIGINT, SIGTERM)
    # kept from opening fails, so that the run exits non-zero.
    operations.fail(
        name="Roll: interrupted before this host's batch",
        message="the run was interrupted before this host's roll batch: it keeps its old configuration; deploy again to roll it",
        _if=[fleet.journal.finish, lambda: fleet.journal.skipped(host.name)],
    )


@stage("Health")
def health() -> None:
    """Stage 10: each instance is healthy (/health, its model listed, one token generated) within health_timeout.

    Instances that rolled passed this gate in their batch already; this is the final word for the
    others: every instance that did not answer at preflight.
    """
    healthy(plan_for(host))


@stage("instinct-fleet", after_preflight=False)
def fleet() -> None:
    """Every stage in order: bare AMD Instinct hosts to tuned hosts serving vLLM. A host that fails preflight stops there, alone."""
    preflight()
    tuning()
    runtime()
    weights()
    cluster()
    firewall()
    exporter()
    routers()
    serving()
    health()
