"""instinct-fleet: bare AMD Instinct hosts to tuned hosts serving vLLM.

    pyinfra -y inventories/prod.py deploy.py      (or: instinct-fleet deploy inventories/prod.py)

Each stage is one file in tasks/. A host that fails preflight stops there, alone;
the other hosts go on. All logic lives in the instinct_fleet package.
"""

from pyinfra import local
from pyinfra.context import host

from instinct_fleet.hostplan import plan_for

local.include("tasks/preflight.py")
if plan_for(host).ok:
    local.include("tasks/tuning.py")
    local.include("tasks/runtime.py")
    local.include("tasks/cluster.py")
    local.include("tasks/firewall.py")
    local.include("tasks/services.py")
    local.include("tasks/health.py")
