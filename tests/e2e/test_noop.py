"""What a no-op re-tune costs per host, counted from pyinfra's own debug log (the figures go to the CI log).

On the fleet converged on inventories/local.py (the ``converged`` fixture), in any order.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from fleetctl import FIGURES, ROOT, deploy, quiet, unleaked, verify

from instinct_fleet.model.inventory import load_inventory

FLEET_SHARE = 2  # beside test_roll_gates, before it (conftest.py)

HOSTS = ("sim-gpu-1", "sim-gpu-2", "sim-c1", "sim-c2", "sim-nogpu")


def test_a_no_op_re_tune_reads_one_fact_and_runs_at_most_three_commands_per_host(converged: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventories/local.py", "deploy.py", "--debug"], cwd=ROOT, capture_output=True, text=True
    )
    log = done.stdout + done.stderr
    unleaked(done.args, log)  # pyinfra's --debug log holds every command it ran, and no secret
    facts = Counter(re.findall(r"\[(sim-[\w-]+)\]\s+Loaded fact \S*HostReport", log))
    assert facts == dict.fromkeys(HOSTS, 1), facts
    commands = Counter(re.findall(r"Running command on (sim-[\w-]+):", log))
    FIGURES.append("no-op re-tune, commands per host: " + ", ".join(f"{h} {commands[h]}" for h in HOSTS))
    # The performance contract (README, Performance): a converged host costs the one fact, whatever the fleet size.
    assert max(commands[h] for h in HOSTS) <= 3, commands


def test_the_same_fleet_as_an_ansible_inventory_deploys_as_a_no_op(converged: Any, tmp_path: Path) -> None:
    """inventories/local.py written as an Ansible YAML inventory (its groups, every host's data, the connection
    variables by their Ansible names): a deploy through it changes nothing on the fleet that local.py converged,
    and `verify` passes through it, as it does through local.py."""
    back = {
        "ssh_hostname": "ansible_host",
        "ssh_port": "ansible_port",
        "ssh_user": "ansible_user",
        "ssh_key": "ansible_ssh_private_key_file",
    }
    tree: dict[str, Any] = {"all": {"children": {}}}
    for host in load_inventory(str(ROOT / "inventories" / "local.py"), str(ROOT)):
        group = tree["all"]["children"].setdefault(host.groups[0], {"hosts": {}})
        group["hosts"][host.name] = {back.get(k, k): v for k, v in host.data.items() if not k.startswith("_")}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(tree, sort_keys=False))
    again = deploy(inventory=str(tmp_path / "hosts.yml"))
    quiet(again)
    statuses = {row["status"] for row in again.roll if row["host"] != "sim-nogpu"}  # the GPU-less host fails preflight
    assert again.changed_ops() == set() and statuses == {"unchanged"}, again.roll
    checked = verify("sim-gpu-*", inventory=str(tmp_path / "hosts.yml"))
    assert checked.returncode == 0, checked.stdout[-3000:]
