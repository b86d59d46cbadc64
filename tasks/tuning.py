"""Stage 2, host tuning: persistent and idempotent; each setting can be switched off in group_data.

Every operation here runs only where the host differs from instinct_fleet/desired.py,
as the preflight fact read it; a tuned host gets no command from this stage.
"""

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import files, server, systemd

from instinct_fleet import paths, render
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
settings = plan.spec.settings
want = plan.desired

if want.sysctl and plan.report.numa_balancing != want.sysctl["kernel.numa_balancing"]:
    server.sysctl(name="NUMA balancing off now", key="kernel.numa_balancing", value=0)
if plan.drifted(paths.SYSCTL_FILE):
    files.put(name="NUMA balancing off at boot", src=StringIO(render.sysctl_file()), dest=paths.SYSCTL_FILE, mode="644")

if plan.drifted(paths.GRUB_DROP_IN):
    grub = files.put(
        name="GRUB drop-in: iommu=pt pci=realloc=off", src=StringIO(render.grub_drop_in()), dest=paths.GRUB_DROP_IN, mode="644"
    )
    server.shell(name="Regenerate the GRUB configuration", commands=["update-grub"], _if=grub.did_change)
    if settings.tune_reboot:
        server.reboot(name="Reboot for the new kernel command line", _if=grub.did_change)
if plan.drifted(paths.REBOOT_MARKER):
    files.file(name="Report: reboot required", path=paths.REBOOT_MARKER, present=True, create_remote_dir=True)

idle_unit = render.unit_path(paths.CPU_IDLE_UNIT)
if settings.tune_cpu_idle and (plan.drifted(idle_unit) or plan.unit_drifted(paths.CPU_IDLE_UNIT)):
    idle = files.put(name="CPU idle unit", src=StringIO(render.cpu_idle_unit()), dest=idle_unit, mode="644")
    systemd.daemon_reload(name="Reload systemd (CPU idle unit)", _if=idle.did_change)
    systemd.service(name="Enable the CPU idle unit", service=paths.CPU_IDLE_UNIT, running=None, enabled=True)
    systemd.service(name="Apply the CPU idle setting now", service=paths.CPU_IDLE_UNIT, running=True, _if=idle.did_change)

if plan.user_drifted():
    server.group(name="render group", group="render", system=True)
    server.group(name="video group", group="video", system=True)
    server.user(
        name=f"Service user {want.user.name}",
        user=want.user.name,
        system=True,
        groups=list(want.user.groups),
        shell=want.user.shell,
        home=want.user.home,
        create_home=False,
    )
