"""Stage 6, firewall: Ray ports only for cluster members, vLLM ports only for vllm_allow_from (nftables)."""

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import files, systemd

from instinct_fleet import paths, render
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
ruleset = plan.firewall()
unit_file = render.unit_path(paths.FIREWALL_UNIT)
drift = plan.drifted(paths.FIREWALL_FILE, unit_file) or plan.unit_drifted(paths.FIREWALL_UNIT) or not plan.report.firewall_loaded
if ruleset is not None and drift:
    rules = files.put(name="nftables table inet instinct_fleet", src=StringIO(ruleset), dest=paths.FIREWALL_FILE, mode="600")
    unit = files.put(name="Firewall unit", src=StringIO(render.firewall_unit()), dest=unit_file, mode="644")
    systemd.daemon_reload(name="Reload systemd (firewall unit)", _if=unit.did_change)
    # A table flushed by hand, under an active unit, is loaded again.
    loaded = plan.report.firewall_loaded
    systemd.service(
        name="Load the new firewall rules",
        service=paths.FIREWALL_UNIT,
        running=None,
        reloaded=True,
        _if=rules.did_change if loaded else None,
    )
    systemd.service(name="Firewall loaded and enabled", service=paths.FIREWALL_UNIT, running=True, enabled=True)
