"""Stage 8, the roll: Ray and vLLM units, restarted batch by batch behind a health gate.

Every host walks the same batches; each batch starts with a barrier that every
host shares, so pyinfra finishes one batch (health gate included) before the
next begins. A host acts only in its own batch (instinct_fleet/fleet/roll.py says
which); instinct_fleet/fleet/serving.py holds what it does there.
"""

from pyinfra.context import host

from instinct_fleet.converge import apply, operations
from instinct_fleet.fleet import serving
from instinct_fleet.fleet.run import fleet_plan

fleet = fleet_plan(host.state)
plan = fleet.plans[host.name]

apply.converge(plan, "services")  # the config directory and the Hugging Face cache


def failed() -> set[str]:
    return {h.name for h in host.state.failed_hosts}


mine = fleet.roll.batch_of(host.name) or 0  # an unchanged host checks its units in batch 0
for batch in host.loop(range(len(fleet.roll.batches))):
    operations.barrier(name=f"Roll: batch {batch}", note=f"roll batch {batch}")
    if batch == mine:
        serving.converge(plan, fleet, batch, failed)
# After the last batch (on every host at once): the roll is over; a host whose batch an interrupt
# (SIGINT, SIGTERM) kept from opening fails, so that the run exits non-zero (instinct_fleet/fleet/run.py).
operations.fail(
    name="Roll: interrupted before this host's batch",
    message="the run was interrupted before this host's roll batch: it keeps its old configuration; deploy again to roll it",
    _if=[fleet.roll.finish, lambda: fleet.roll.skipped(host.name)],
)
