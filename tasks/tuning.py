"""Stage 2, host tuning: persistent and idempotent; each setting can be switched off in group_data.

NUMA balancing off now and at boot, the kernel command line (GRUB, regenerated;
a reboot with tune_reboot), the CPU idle unit, the service user and its groups:
the tuning entries of instinct_fleet/managed.py, converged by the one applier.
A tuned host gets no command from this stage.
"""

from pyinfra.context import host

from instinct_fleet import apply
from instinct_fleet.run import plan_for

apply.converge(plan_for(host), "tuning")
