"""Stage 8, the roll: Ray and vLLM units, restarted batch by batch behind a health gate.

Every host walks the same batches; each batch starts with a barrier that every
host shares, so pyinfra finishes one batch (health gate included) before the
next begins. A host acts only in its own batch (instinct_fleet/roll.py says
which); instinct_fleet/serving.py holds what it does there.
"""

from pyinfra.context import host
from pyinfra.operations import files

from instinct_fleet import operations, render, serving
from instinct_fleet.hostplan import fleet_plan

fleet = fleet_plan(host.state)
plan = fleet.plans[host.name]
settings = plan.spec.settings

if plan.drifted(render.CONFIG_DIR):
    files.directory(name="Config directory", path=render.CONFIG_DIR, mode="755")
if plan.drifted(settings.hf_cache_dir):
    files.directory(
        name="Hugging Face cache", path=settings.hf_cache_dir, user=settings.service_user, group=settings.service_user, mode="750"
    )


def failed() -> set[str]:
    return {h.name for h in host.state.failed_hosts}


mine = fleet.roll.batch_of(host.name) or 0  # an unchanged host checks its units in batch 0
for batch in host.loop(range(len(fleet.roll.batches))):
    operations.barrier(name=f"Roll: batch {batch}", note=f"roll batch {batch}")
    if batch == mine:
        serving.converge(plan, fleet, batch, failed)
