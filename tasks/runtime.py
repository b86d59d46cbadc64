"""Stage 3, container runtime and image: docker's settings and the pinned image pre-pulled (docker itself comes from the distribution, in stage 2).

The image is pulled here, on every host at once, before any batch of the roll
stops anything. New docker settings on a host that is serving wait for its
batch instead (restarting dockerd stops its containers): see instinct_fleet/fleet/serving.py.
Like every stage, it acts only where the host differs from instinct_fleet/converge/managed.py.
"""

from pyinfra.context import host

from instinct_fleet.converge import apply, operations
from instinct_fleet.fleet import roll
from instinct_fleet.fleet.run import fleet_plan

fleet = fleet_plan(host.state)
plan = fleet.plans[host.name]

apply.converge(plan, "runtime")  # registry CA certificates and credentials

if not roll.defers_docker(plan):
    apply.converge(plan, "docker")
    # One host per missing image pulls first (filling a pull-through cache), then the rest pull from the cache.
    # pyinfra finishes an operation on every host before the next, so the barrier orders the two waves.
    if plan.pulls_image:
        if fleet.seeds_image(host.name):
            apply.converge(plan, "pull")
        operations.barrier(name="Image: the first pull of each image is done", note="seed pulls done")
        if not fleet.seeds_image(host.name):
            apply.converge(plan, "pull")
