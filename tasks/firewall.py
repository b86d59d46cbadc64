"""Stage 6, firewall: Ray ports only for cluster members, vLLM ports only for vllm_allow_from (nftables).

The ruleset, its unit and the live table are entries of instinct_fleet/converge/managed.py:
a new ruleset, or a table flushed by hand, reloads the unit.
"""

from pyinfra.context import host

from instinct_fleet.converge import apply
from instinct_fleet.fleet.run import plan_for

apply.converge(plan_for(host), "firewall")
