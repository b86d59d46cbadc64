"""Stage 7, device metrics exporter (metrics_exporter = True): AMD's exporter as a systemd-managed container.

Like every unit this tool writes: a pinned image, a unit checked by
systemd-analyze verify, a restart only when its unit, config or image changed,
and nothing at all when the host already matches instinct_fleet/desired.py.
Switched off, a unit left by an earlier deploy is stopped and removed.
"""

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from instinct_fleet import operations, paths, render, serving
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
v = plan.spec.vars
unit = f"{paths.EXPORTER_UNIT}.service"
unit_file = render.unit_path(paths.EXPORTER_UNIT)

if v.metrics_exporter:
    pulled = []
    if plan.report.exporter_image_id is None:
        pulled.append(
            operations.image_present(
                name="Metrics exporter image present", image=v.metrics_exporter_image, _timeout=plan.spec.settings.image_pull_timeout
            )
        )
    written = []
    for path, content in plan.exporter_files().items():
        if plan.drifted(path):
            written.append(files.put(name=f"Metrics exporter {path}", src=StringIO(content), dest=path, mode="644"))
    if written:
        operations.unit_verified(name="Metrics exporter unit passes systemd-analyze verify", path=unit_file, _if=any_changed(*written))
        systemd.daemon_reload(name="Reload systemd (metrics exporter)", _if=any_changed(*written))
    changed = [*written, *pulled]
    if changed or plan.unit_drifted(unit):  # restarted when one of them changed, and kept running and enabled
        operations.service_converged(paths.EXPORTER_UNIT, changed, serving.always, plan.spec.settings.command_timeout)
elif plan.drifted(unit_file) or plan.unit_drifted(unit):
    systemd.service(name="Stop the metrics exporter (metrics_exporter is off)", service=unit, running=False, enabled=False)
    files.file(name="Remove the metrics exporter unit", path=unit_file, present=False)
    files.file(name="Remove the metrics exporter config", path=paths.EXPORTER_CONFIG, present=False)
    systemd.daemon_reload(name="Reload systemd (metrics exporter removed)")
