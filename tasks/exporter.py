"""Stage 7, device metrics exporter (metrics_exporter = True): AMD's exporter as a systemd-managed container.

Like every unit this tool writes: a pinned image, a unit checked by
systemd-analyze verify, a restart only when its unit, config or image changed,
and nothing at all when the host already matches instinct_fleet/converge/managed.py.
Switched off, a unit left by an earlier deploy is stopped and removed.
"""

from pyinfra.context import host

from instinct_fleet.converge import apply
from instinct_fleet.fleet.run import plan_for

apply.converge(plan_for(host), "exporter")
