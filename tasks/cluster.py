"""Stage 5, Ray cluster (multi-node hosts only): what the Ray units need that does not restart them.

The ray-head / ray-worker units themselves roll with the vLLM units (tasks/services.py).
"""

from pyinfra.context import host

from instinct_fleet.converge import apply
from instinct_fleet.fleet.run import plan_for

apply.converge(plan_for(host), "cluster")
