"""Stage 3, container runtime and image: docker from the distribution, daemon.json, the pinned image."""

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import apt, files, systemd
from pyinfra.operations.util import any_changed

from instinct_fleet import operations, render
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
settings = plan.spec.settings

if plan.missing_packages:
    apt.packages(name="Install missing packages", packages=plan.missing_packages, update=True, no_recommends=True)

daemon = files.put(name="docker daemon.json", src=StringIO(render.daemon_json(settings)), dest="/etc/docker/daemon.json", mode="644")
for registry, ca_file in sorted(settings.registry_ca_certs.items()):
    files.put(name=f"CA certificate for {registry}", src=ca_file, dest=f"/etc/docker/certs.d/{registry}/ca.crt", mode="644")
memlock = render.memlock_systemd(settings.tune_memlock)
if memlock:
    limits = files.template(
        name="dockerd memlock limit", src="templates/docker-limits.conf.j2", dest=render.DOCKER_DROP_IN, mode="644", memlock=memlock
    )
else:
    limits = files.file(name="No dockerd memlock override", path=render.DOCKER_DROP_IN, present=False)
systemd.daemon_reload(name="Reload systemd (dockerd limits)", _if=limits.did_change)
systemd.service(name="docker running and enabled", service="docker.service", running=True, enabled=True)
systemd.service(name="Restart docker for its new settings", service="docker.service", restarted=True, _if=any_changed(daemon, limits))

if settings.credentials_file:
    files.put(name="Registry credentials", src=settings.credentials_file, dest="/root/.docker/config.json", mode="600")

plan.changes["image"] = operations.image_present(name="vLLM image present", image=plan.image)
