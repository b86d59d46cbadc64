"""What a no-op re-tune costs per host, counted from pyinfra's own debug log (the figures go to the CI log).

On the fleet converged on inventories/local.py (the ``converged`` fixture), in any order.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from typing import Any

from fleetctl import FIGURES, ROOT

FLEET_SHARE = 2  # beside test_roll_gates, before it (conftest.py)

HOSTS = ("sim-gpu-1", "sim-gpu-2", "sim-c1", "sim-c2", "sim-nogpu")


def test_a_no_op_re_tune_reads_one_fact_and_runs_at_most_three_commands_per_host(converged: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventories/local.py", "deploy.py", "--debug"], cwd=ROOT, capture_output=True, text=True
    )
    log = done.stdout + done.stderr
    facts = Counter(re.findall(r"\[(sim-[\w-]+)\]\s+Loaded fact \S*HostReport", log))
    assert facts == dict.fromkeys(HOSTS, 1), facts
    commands = Counter(re.findall(r"Running command on (sim-[\w-]+):", log))
    FIGURES.append("no-op re-tune, commands per host: " + ", ".join(f"{h} {commands[h]}" for h in HOSTS))
    # The performance contract (README, Performance): a converged host costs the one fact, whatever the fleet size.
    assert max(commands[h] for h in HOSTS) <= 3, commands
