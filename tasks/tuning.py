"""Stage 2, host tuning: persistent and idempotent; each setting can be switched off in group_data."""

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import files, server, systemd

from instinct_fleet import render
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
settings = plan.spec.settings

if settings.tune_numa_balancing and plan.report.numa_balancing is not None:
    server.sysctl(name="NUMA balancing off now", key="kernel.numa_balancing", value=0)
    files.put(name="NUMA balancing off at boot", src=StringIO(render.sysctl_file()), dest=render.SYSCTL_FILE, mode="644")

if settings.tune_kernel_cmdline:
    grub = files.put(
        name="GRUB drop-in: iommu=pt pci=realloc=off", src=StringIO(render.grub_drop_in()), dest=render.GRUB_DROP_IN, mode="644"
    )
    server.shell(name="Regenerate the GRUB configuration", commands=["update-grub"], _if=grub.did_change)
    if settings.tune_reboot:
        server.reboot(name="Reboot for the new kernel command line", _if=grub.did_change)
    elif plan.report.missing_kernel_args:
        files.file(name="Report: reboot required", path=render.REBOOT_MARKER, present=True, create_remote_dir=True)

if settings.tune_cpu_idle:
    idle = files.template(
        name="CPU idle unit",
        src="templates/cpu-idle.service.j2",
        dest=render.unit_path(render.CPU_IDLE_UNIT),
        mode="644",
        cpupower="/usr/bin/cpupower",
    )
    systemd.daemon_reload(name="Reload systemd (CPU idle unit)", _if=idle.did_change)
    systemd.service(name="Enable the CPU idle unit", service=render.CPU_IDLE_UNIT, running=None, enabled=True)
    systemd.service(name="Apply the CPU idle setting now", service=render.CPU_IDLE_UNIT, running=True, _if=idle.did_change)

server.group(name="render group", group="render", system=True)
server.group(name="video group", group="video", system=True)
server.user(
    name=f"Service user {settings.service_user}",
    user=settings.service_user,
    system=True,
    groups=["render", "video"],
    shell="/usr/sbin/nologin",
    home=settings.hf_cache_dir,
    create_home=False,
)
