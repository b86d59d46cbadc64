"""Stage 5, Ray cluster (multi-node hosts only): what the Ray units need that does not restart them.

The ray-head / ray-worker units themselves roll with the vLLM units (tasks/services.py).
"""

from pyinfra.context import host
from pyinfra.operations import files

from instinct_fleet import paths
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
if plan.role is not None:
    if plan.drifted(paths.RAY_TMP):
        files.directory(name="Shared Ray session directory", path=paths.RAY_TMP)  # Ray sets its own mode (1777)
    if plan.drifted(paths.RAY_READY_SCRIPT):
        files.put(name="Ray readiness script", src="templates/ray-ready.py", dest=paths.RAY_READY_SCRIPT, mode="644")
