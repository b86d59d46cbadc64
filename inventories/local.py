"""The local simulated fleet that `make demo` and `make test` deploy onto. Not for production.

tests/fleet/fleet.py starts the hosts (containers with systemd, sshd and dockerd,
plus stand-ins for the GPUs, ROCm and vLLM) and writes .fleet/fleet.json, which
this file reads for ports, the SSH key and the local registry.
"""

import json
import os
from pathlib import Path

# INSTINCT_FLEET_SLOT=N selects the Nth fleet tests/fleet/fleet.py runs beside the first (make test runs two).
SLOT = os.environ.get("INSTINCT_FLEET_SLOT", "0")
STATE = Path(__file__).resolve().parent.parent / ".fleet"
FLEET_FILE = (STATE if SLOT == "0" else STATE / f"slot{SLOT}") / "fleet.json"
if not FLEET_FILE.is_file():
    raise FileNotFoundError(f"{FLEET_FILE} is missing: start the simulated fleet with `make demo` or `python3 tests/fleet/fleet.py up`")
fleet = json.loads(FLEET_FILE.read_text())
by_name = {h["name"]: h for h in fleet["hosts"]}


def host_data(name: str, **data: object) -> tuple[str, dict[str, object]]:
    sim = by_name[name]
    connection = {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": sim["ssh_port"],
        "ssh_user": "root",
        "ssh_key": fleet["ssh_key"],
        "ssh_known_hosts_file": "/dev/null",
        "ssh_strict_host_key_checking": "no",
    }
    common = {
        # The stand-in vLLM image in the fleet's own registry, pinned like a real one.
        "vllm_image": fleet["image"],
        "vllm_version": fleet["vllm_version"],
        "docker_insecure_registries": [fleet["registry"]],
        # The test machine's kernel caps locked memory at 8 MiB (no CAP_SYS_RESOURCE), so
        # "unlimited" cannot be granted here; a real host keeps the default (True).
        "tune_memlock": 8 * 1024 * 1024,
        "health_timeout": 120,
        # The token the control machine holds; the deploy writes it to every host (root's alone).
        "hf_token_source": fleet["hf_token_file"],
        # Prometheus on the machine scrapes the hosts' container addresses (not the published ports).
        "scrape_address": sim["address"],
    }
    return name, {**connection, **common, **data}


gateway = fleet["registry"].split(":")[0]  # the machine itself, as the hosts see it

# Who reaches the GPU hosts' vLLM ports (a leading underscore: pyinfra reads every other list here as a group of hosts): the machine (the tests' client, Prometheus, make demo), the router on
# sim-gpu-1 and sim-gpu-2 (a bench client in the tests). Without it, their keyed instances in the router's pool
# would answer the router alone: vLLM checks the key on /v1 only, and its other routes answer anyone.
_gpu_clients = [gateway, by_name["sim-gpu-1"]["address"], by_name["sim-gpu-2"]["address"]]

# Both single-node hosts stage their weights from the fleet's shared store (a directory every
# host mounts, as an NFS share would be): one host downloads each model there, both copy it.
weights = {"weights_source": fleet["weights_source"]}
# The default recipe (gpt-oss-120b, TP 1) twice; the first answers on the port the fleet publishes.
sim_gpu = [
    host_data(
        "sim-gpu-1",
        vllm_instances=[
            {"name": "main", "port": by_name["sim-gpu-1"]["api_port"]},
            {"name": "batch", "recipe": "gpt-oss-120b-batch", "port": 8081},
        ],
        metrics_exporter=True,
        metrics_exporter_image=fleet["exporter_image"],
        # vLLM's router in front of gpt-oss-120b's instances (main, batch and sim-gpu-2's oss) on port
        # 30000 (router_models; without it, one pool per model the inventory serves).
        router=True,
        router_models=["openai/gpt-oss-120b"],
        # Its worker API (port 31000) answers the serving hosts of the pool and the machine (the control machine of
        # the tests and `make demo`), nobody else; its clients use port 30000, where only the OpenAI routes pass.
        router_admin_from=[gateway],
        # The pool of gpt-oss-120b holds sim-gpu-2's keyed oss too: every instance in it takes the same key (a pool of
        # keyed and keyless instances is refused, router-api-key), so a client without it is refused everywhere.
        vllm_api_key_path="/etc/instinct-fleet/api-key",
        **weights,
        vllm_allow_from=_gpu_clients,
    ),
    # A TP 4 Llama 3.1 70B instance and a gpt-oss-120b one beside it, offline: they start only
    # if the weights were staged into the host's Hugging Face cache first.
    host_data(
        "sim-gpu-2",
        vllm_recipe="llama-3.1-70b",
        vllm_instances=[
            {"name": "llama-a", "port": by_name["sim-gpu-2"]["api_port"], "gpus": [0, 1, 2, 3]},
            {"name": "oss", "recipe": "gpt-oss-120b", "port": 8001, "gpus": [4]},
        ],
        vllm_env={"HF_HUB_OFFLINE": "1"},
        # /v1 answers only with the key in this root-only file (the fleet writes it, as an operator would).
        vllm_api_key_path="/etc/instinct-fleet/api-key",
        **weights,
        vllm_allow_from=_gpu_clients,
    ),
]

# A host with no GPU at all: preflight must fail it alone, and it is in no router pool. It would serve gpt-oss-120b
# like the others, so it takes their key too (router-api-key refuses a pool of keyed and keyless instances).
sim_nogpu = [host_data("sim-nogpu", vllm_api_key_path="/etc/instinct-fleet/api-key")]

# A two-node Ray cluster: Llama 3.1 405B, TP 8 inside each node and PP 2 across them.
cluster = {
    "ray_cluster": "sim-405b",
    "vllm_recipe": "llama-3.1-405b-pp2",
    "vllm_nodes": 2,
    "vllm_instances": [{"name": "llama-405b", "port": by_name["sim-c1"]["api_port"]}],
    "cluster_nic": "eth0",
    # The API answers the machine (make demo) and sim-gpu-1, nobody else.
    "vllm_allow_from": [gateway, by_name["sim-gpu-1"]["address"]],
    # GPU metrics on both nodes, which only Prometheus (on the machine) may scrape.
    "metrics_exporter": True,
    "metrics_exporter_image": fleet["exporter_image"],
    "prometheus_allow_from": [gateway],
}
sim_cluster = [
    host_data("sim-c1", ray_role="head", **cluster),
    host_data("sim-c2", ray_role="worker", **cluster),
]
