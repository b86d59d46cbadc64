"""How long validation takes before a deploy, as the fleet grows (not a test; run by hand).

    .venv/bin/python benchmarks/plan_scale.py [HOSTS ...]

Each host runs 8 x TP1 gpt-oss-120b; every fourth pair of hosts is a 2-node Ray
cluster serving Llama 3.1 405B. Prints hosts, services and seconds for
``plan_hosts`` (the step `instinct-fleet deploy` runs before contacting any host).
"""

from __future__ import annotations

import sys
import time

from instinct_fleet.model.inventory import HostData, plan_hosts

CLUSTER = {"vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2, "cluster_nic": "eth0", "nccl_ib_hca": "mlx5_0"}


def inventory(size: int) -> list[HostData]:
    hosts = []
    for i in range(size):
        if i % 8 in (6, 7):
            role = "head" if i % 8 == 6 else "worker"
            data = {**CLUSTER, "ray_cluster": f"c{i // 8}", "ray_role": role, "vllm_instances": [{"name": "llama-405b"}]}
        else:
            data = {"vllm_instances": [{"name": f"gpt-oss-{g}", "gpus": [g], "port": 8080 + g} for g in range(8)]}
        hosts.append(HostData(f"mi300x-{i:04d}", ("all",), data))
    return hosts


def main() -> None:
    for size in [int(a) for a in sys.argv[1:]] or [10, 100, 1000]:
        hosts = inventory(size)
        started = time.perf_counter()
        planned = plan_hosts(hosts)
        elapsed = time.perf_counter() - started
        errors = sum(1 for _, fs in planned for f in fs if f.severity == "error")
        services = sum(len(spec.services) for spec, _ in planned)
        print(f"{size:5d} hosts  {services:6d} services  {elapsed:7.2f} s  {errors} errors")


if __name__ == "__main__":
    main()
