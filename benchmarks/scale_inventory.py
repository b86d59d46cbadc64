"""The light simulated fleet of benchmarks/retune_scale.py (``tests/fleet/fleet.py up --hosts N``). Not for production.

Every host pulls the stand-in image through the fleet's pull-through cache
(Debian's docker-registry in proxy mode), as a fleet without internet access
pulls a 20+ GB vLLM image from a cache on its own network. Single-node hosts
serve the default recipe; each pair the fleet built as a cluster serves
llama-3.1-405b-pp2 over Ray.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fleet"))
import fleet as simulated  # its slot decides where the fleet's state is (INSTINCT_FLEET_SLOT)

FLEET_FILE = simulated.STATE / "fleet.json"
if not FLEET_FILE.is_file():
    raise FileNotFoundError(f"{FLEET_FILE} is missing: start a light fleet with `python3 tests/fleet/fleet.py up --hosts N`")
fleet = json.loads(FLEET_FILE.read_text())
if not fleet.get("slim_image"):
    raise FileNotFoundError("this fleet is the demo fleet: start a light one with `python3 tests/fleet/fleet.py up --hosts N`")
cache = fleet["cache"]
slim = fleet["slim_image"].replace(fleet["registry"], cache, 1)  # single-node hosts: no Ray in the stand-in
full = fleet["image"].replace(fleet["registry"], cache, 1)  # cluster hosts


def host(sim: dict) -> tuple[str, dict]:
    data = {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": sim["ssh_port"],
        "ssh_user": "root",
        "ssh_key": fleet["ssh_key"],
        "ssh_known_hosts_file": "/dev/null",
        "ssh_strict_host_key_checking": "no",
        "vllm_image": full if sim.get("cluster") else slim,
        "vllm_version": fleet["vllm_version"],
        "docker_insecure_registries": [cache],
        "tune_memlock": 8 * 1024 * 1024,  # the test machine caps locked memory (see inventories/local.py)
        "health_timeout": 300,
        "vllm_instances": [{"name": "main", "port": sim["api_port"]}],
    }
    if sim.get("cluster"):
        data.update(
            ray_cluster=sim["cluster"],
            ray_role=sim["role"],
            vllm_recipe="llama-3.1-405b-pp2",
            vllm_nodes=2,
            cluster_nic="eth0",
        )
    return sim["name"], data


scale = [host(sim) for sim in fleet["hosts"]]
