"""Stage 5, firewall: Ray ports only for cluster members, vLLM ports only for vllm_allow_from (nftables)."""

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import files, systemd

from instinct_fleet import render
from instinct_fleet.hostplan import plan_for

plan = plan_for(host)
ruleset = plan.firewall()
if ruleset is not None:
    rules = files.put(name="nftables table inet instinct_fleet", src=StringIO(ruleset), dest=render.FIREWALL_FILE, mode="600")
    unit = files.template(
        name="Firewall unit", src="templates/firewall.service.j2", dest=render.unit_path(render.FIREWALL_UNIT), mode="644"
    )
    systemd.daemon_reload(name="Reload systemd (firewall unit)", _if=unit.did_change)
    systemd.service(name="Load the new firewall rules", service=render.FIREWALL_UNIT, running=None, reloaded=True, _if=rules.did_change)
    systemd.service(name="Firewall loaded and enabled", service=render.FIREWALL_UNIT, running=True, enabled=True)
