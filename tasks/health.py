"""Stage 7, health: each instance answers /health and lists its model, within health_timeout.

Instances that rolled passed this gate in their batch already; this is the
final word for every host, those the roll left alone included.
"""

from pyinfra.context import host

from instinct_fleet import operations, render
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
for svc in plan.serves:
    operations.healthy(
        name=f"{render.unit_name(svc)} healthy",
        unit=f"{render.unit_name(svc)}.service",
        port=svc.port,
        served_model=render.served_model(svc),
        timeout=plan.spec.settings.health_timeout,
    )
