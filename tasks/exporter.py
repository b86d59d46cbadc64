"""Stage 7, device metrics exporter (metrics_exporter = True): AMD's exporter as a systemd-managed container.

Like every unit this tool writes: a pinned image, a unit checked by
systemd-analyze verify, a restart only when its unit, config or image changed,
and nothing at all when the host already matches instinct_fleet/managed.py.
Switched off, a unit left by an earlier deploy is stopped and removed.
"""

from pyinfra.context import host
from pyinfra.operations import systemd
from pyinfra.operations.util import any_changed

from instinct_fleet import apply, operations, paths, serving
from instinct_fleet.run import plan_for

plan = plan_for(host)
v = plan.spec.vars
unit = paths.EXPORTER_UNIT
entries = plan.desired.stage("exporter")

if v.metrics_exporter:
    pulled = []
    if plan.report.exporter_image_id is None:
        pulled.append(
            operations.image_present(name="Metrics exporter image present", image=v.metrics_exporter_image, _timeout=v.image_pull_timeout)
        )
    written = apply.files(plan, entries)
    if written:
        unit_file = paths.unit_path(unit)
        operations.unit_verified(name="Metrics exporter unit passes systemd-analyze verify", path=unit_file, _if=any_changed(*written))
        systemd.daemon_reload(name="Reload systemd (metrics exporter)", _if=any_changed(*written))
    changed = [*written, *pulled]
    if changed or plan.unit_drifted(unit):  # restarted when one of them changed, and kept running and enabled
        operations.service_converged(unit, changed, serving.always, v.command_timeout)
elif entries or plan.unit_drifted(unit):
    systemd.service(name="Stop the metrics exporter (metrics_exporter is off)", service=paths.service(unit), running=False, enabled=False)
    apply.files(plan, entries)
    systemd.daemon_reload(name="Reload systemd (metrics exporter removed)")
