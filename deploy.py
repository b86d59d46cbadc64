"""instinct-fleet: bare AMD Instinct hosts to tuned hosts serving vLLM.

    pyinfra -y inventories/prod.py deploy.py      (or: instinct-fleet deploy inventories/prod.py)

Each stage is one file in tasks/. A host that fails preflight stops there, alone;
the other hosts go on. Stage 6 rolls the serving units batch by batch behind a
health gate (README, Re-tuning a live fleet). All logic lives in the
instinct_fleet package.
"""

from pyinfra import local
from pyinfra.context import host

from instinct_fleet.fleet.run import plan_for

plan = plan_for(host)
# pyinfra takes an operation's _timeout from host data: every command gets command_timeout
# (image pulls and health waits set their own), and instinct_fleet/converge/watchdog.py cuts a host
# whose operation outlives it, so a hung host fails alone instead of stalling the run.
host.data._timeout = plan.spec.vars.command_timeout

local.include("tasks/preflight.py")
if plan.ok:
    local.include("tasks/tuning.py")
    local.include("tasks/runtime.py")
    local.include("tasks/weights.py")
    local.include("tasks/cluster.py")
    local.include("tasks/firewall.py")
    local.include("tasks/exporter.py")
    local.include("tasks/services.py")
    local.include("tasks/health.py")
