"""Stage 3, container runtime and image: docker from the distribution, its settings, the pinned image pre-pulled.

The image is pulled here, on every host at once, before any batch of the roll
stops anything. New docker settings on a host that is serving wait for its
batch instead (restarting dockerd stops its containers): see instinct_fleet/serving.py.
Like every stage, it acts only where the host differs from instinct_fleet/desired.py.
"""

from pyinfra.context import host
from pyinfra.operations import apt, files

from instinct_fleet import desired, operations, serving
from instinct_fleet.hostplan import fleet_plan

fleet = fleet_plan(host.state)
plan = fleet.plans[host.name]
settings = plan.spec.settings

if plan.missing_packages:
    apt.packages(name="Install missing packages", packages=plan.missing_packages, update=True, no_recommends=True)

for registry, ca_file in sorted(settings.registry_ca_certs.items()):
    dest = f"{desired.CA_DIR}/{registry}/ca.crt"
    if plan.drifted(dest):
        files.put(name=f"CA certificate for {registry}", src=ca_file, dest=dest, mode="644")
if settings.credentials_file and plan.drifted(desired.CREDENTIALS):
    files.put(name="Registry credentials", src=settings.credentials_file, dest=desired.CREDENTIALS, mode="600")

if not plan.defers_docker:
    serving.docker_settings(plan)
    # One host per missing image pulls first (filling a pull-through cache), then the rest pull from the cache.
    # pyinfra finishes an operation on every host before the next, so the barrier orders the two waves.
    if plan.report.image_id is None:
        if fleet.seeds_image(host.name):
            serving.image(plan)
        operations.barrier(name="Image: the first pull of each image is done", note="seed pulls done")
        if not fleet.seeds_image(host.name):
            serving.image(plan)
