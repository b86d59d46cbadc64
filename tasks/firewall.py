"""Stage 6, firewall: Ray ports only for cluster members, vLLM ports only for vllm_allow_from (nftables)."""

from pyinfra.context import host
from pyinfra.operations import systemd

from instinct_fleet import apply, paths
from instinct_fleet.run import plan_for

plan = plan_for(host)
unit = paths.service(paths.FIREWALL_UNIT)
if plan.desired.firewall:
    rules = apply.files(plan, [f for f in plan.desired.stage("firewall") if f.path == paths.FIREWALL_FILE])
    unit_file = apply.files(plan, [f for f in plan.desired.stage("firewall") if f.path != paths.FIREWALL_FILE])
    if unit_file:
        systemd.daemon_reload(name="Reload systemd (firewall unit)", _if=unit_file[0].did_change)
    # A table flushed by hand, under an active unit, is loaded again.
    loaded = plan.report.firewall_loaded
    if rules or not loaded:  # an active unit reloads its file; an inactive one loads it when started below
        systemd.service(
            name="Load the new firewall rules",
            service=unit,
            running=None,
            reloaded=True,
            _if=rules[0].did_change if rules and loaded else None,
        )
    if rules or unit_file or not loaded or plan.unit_drifted(paths.FIREWALL_UNIT):
        systemd.service(name="Firewall loaded and enabled", service=unit, running=True, enabled=True)
