"""Stage 2, packages and host tuning: persistent and idempotent; each setting can be switched off in group_data.

First the Debian packages the later stages need and the host lacks (docker,
curl, nft with a firewall, cpupower for the CPU idle unit, which
systemd-analyze verify checks before it runs). Then NUMA balancing off now and
at boot, the kernel command line (GRUB, regenerated; a reboot with
tune_reboot), the CPU idle unit, the service user and its groups: the tuning
entries of instinct_fleet/converge/managed.py, converged by the one applier. A tuned
host gets no command from this stage.
"""

from pyinfra.context import host
from pyinfra.operations import apt

from instinct_fleet.converge import apply, content
from instinct_fleet.fleet.run import plan_for

plan = plan_for(host)
missing = content.missing_packages(plan)
if missing:
    apt.packages(name="Install missing packages", packages=missing, update=True, no_recommends=True)

apply.converge(plan, "tuning")
