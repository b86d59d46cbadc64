"""Stage 2, host tuning: persistent and idempotent; each setting can be switched off in group_data.

The files come from instinct_fleet/managed.py and are written only where the
host differs, as the preflight fact read it; this stage adds what follows from
them. A tuned host gets no command from this stage.
"""

from pyinfra.context import host
from pyinfra.operations import server, systemd
from pyinfra.operations.util import any_changed

from instinct_fleet import apply, paths
from instinct_fleet.run import plan_for

plan = plan_for(host)
v = plan.spec.vars
want = plan.desired

if want.sysctl and plan.report.numa_balancing != want.sysctl["kernel.numa_balancing"]:
    server.sysctl(name="NUMA balancing off now", key="kernel.numa_balancing", value=0)

grub = apply.files(plan, [f for f in want.stage("tuning") if f.path == paths.GRUB_DROP_IN])
if grub:
    server.shell(name="Regenerate the GRUB configuration", commands=["update-grub"], _if=any_changed(*grub))
    if v.tune_reboot:
        server.reboot(name="Reboot for the new kernel command line", _if=any_changed(*grub))
apply.files(plan, [f for f in want.stage("tuning") if f.path in (paths.SYSCTL_FILE, paths.REBOOT_MARKER)])

idle = apply.files(plan, [f for f in want.stage("tuning") if f.restarts == paths.CPU_IDLE_UNIT])
if idle:
    systemd.daemon_reload(name="Reload systemd (CPU idle unit)", _if=any_changed(*idle))
if idle or (v.tune_cpu_idle and plan.unit_drifted(paths.CPU_IDLE_UNIT)):
    systemd.service(name="Enable the CPU idle unit", service=paths.service(paths.CPU_IDLE_UNIT), running=None, enabled=True)
if idle:
    systemd.service(name="Apply the CPU idle setting now", service=paths.service(paths.CPU_IDLE_UNIT), running=True, _if=any_changed(*idle))

if plan.user_drifted():
    for group in want.groups:
        server.group(name=f"{group} group", group=group, system=True)
    server.user(
        name=f"Service user {want.user.name}",
        user=want.user.name,
        system=True,
        groups=list(want.user.groups),
        shell=want.user.shell,
        home=want.user.home,
        create_home=False,
    )
