"""Stage 3, container runtime and image: docker from the distribution, its settings, the pinned image pre-pulled.

The image is pulled here, on every host at once, before any batch of the roll
stops anything. New docker settings on a host that is serving wait for its
batch instead (restarting dockerd stops its containers): see instinct_fleet/serving.py.
"""

from pyinfra.context import host
from pyinfra.operations import apt, files

from instinct_fleet import serving
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
settings = plan.spec.settings

if plan.missing_packages:
    apt.packages(name="Install missing packages", packages=plan.missing_packages, update=True, no_recommends=True)

for registry, ca_file in sorted(settings.registry_ca_certs.items()):
    files.put(name=f"CA certificate for {registry}", src=ca_file, dest=f"/etc/docker/certs.d/{registry}/ca.crt", mode="644")
if settings.credentials_file:
    files.put(name="Registry credentials", src=settings.credentials_file, dest="/root/.docker/config.json", mode="600")

if not plan.defers_docker:
    serving.docker_settings(plan)
    serving.image(plan)
