"""Stage 4, Ray cluster (multi-node hosts only): ray-head or ray-worker, with every port pinned."""

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import files, systemd

from instinct_fleet import operations, render
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
if plan.role is not None:
    unit = render.ray_unit(plan.role)
    files.directory(name="Shared Ray session directory", path=render.RAY_TMP)  # Ray sets its own mode (1777)
    env = files.put(name="Ray env file", src=StringIO(plan.env_text(plan.spec.services[0])), dest=render.RAY_ENV, mode="600")
    ready = files.put(name="Ray readiness script", src="templates/ray-ready.py", dest=render.RAY_READY_SCRIPT, mode="644")
    unit_file = files.template(
        name=f"{unit} unit", src="templates/ray.service.j2", dest=render.unit_path(unit), mode="644", **plan.ray_unit_vars()
    )
    operations.unit_verified(name=f"{unit} passes systemd-analyze verify", path=render.unit_path(unit), _if=unit_file.did_change)
    systemd.daemon_reload(name="Reload systemd (Ray unit)", _if=unit_file.did_change)
    operations.service_converged(unit, [unit_file, env, plan.changes["image"]])
