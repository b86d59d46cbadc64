"""Stage 1, preflight: read-only. One fact gathers the host; a host that cannot serve fails here, alone."""

from pyinfra import logger
from pyinfra.context import host

from instinct_fleet.converge import operations
from instinct_fleet.fleet.run import plan_for

plan = plan_for(host)
logger.info(f"{host.name}: {plan.summary()}")
for warning in plan.warnings:
    logger.warning(f"{host.name}: {warning.brief}")
if not plan.ok:
    operations.fail(name="Preflight", message=f"{host.name} cannot serve: " + "; ".join(e.brief for e in plan.errors))
