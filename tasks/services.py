"""Stage 6, vLLM services: one systemd unit per instance; a unit restarts only when its unit, env or image changed."""

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from instinct_fleet import operations, render
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
settings = plan.spec.settings

files.directory(name="Config directory", path=render.CONFIG_DIR, mode="755")
files.directory(name="Hugging Face cache", path=settings.hf_cache_dir, user=settings.service_user, group=settings.service_user, mode="750")

unit_ops = []
for unit in plan.stale_units:
    systemd.service(name=f"Stop {unit} (no longer in the inventory)", service=f"{unit}.service", running=False, enabled=False)
    unit_ops.append(files.file(name=f"Remove {unit}", path=render.unit_path(unit), present=False))
    files.file(name=f"Remove {unit} env", path=f"{render.CONFIG_DIR}/{unit}.env", present=False)

written = []
for svc in plan.serves:
    unit = render.unit_name(svc)
    env = files.put(name=f"{unit} env file", src=StringIO(plan.env_text(svc)), dest=render.env_path(svc), mode="600")
    unit_file = files.template(
        name=f"{unit} unit",
        src="templates/vllm.service.j2",
        dest=render.unit_path(unit),
        mode="644",
        **plan.unit_vars(svc),
    )
    operations.unit_verified(name=f"{unit} passes systemd-analyze verify", path=render.unit_path(unit), _if=unit_file.did_change)
    written.append((svc, env, unit_file))
    unit_ops.append(unit_file)

if unit_ops:
    systemd.daemon_reload(name="Reload systemd (vLLM units)", _if=any_changed(*unit_ops))
for svc, env, unit_file in written:
    operations.service_converged(render.unit_name(svc), [unit_file, env, plan.changes["image"]])
