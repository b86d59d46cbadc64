"""Shared helpers for the unit tests: plan one host from plain data, as ``instinct-fleet plan`` does."""

from __future__ import annotations

from typing import Any

from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.rules import Finding
from instinct_fleet.model.spec import HostSpec


def check(data: dict[str, Any], host: str = "h1") -> tuple[HostSpec, list[Finding]]:
    ((spec, findings),) = plan_hosts([HostData(host, ("all",), data)])
    return spec, findings


CLUSTER = {"ray_cluster": "c", "cluster_nic": "eth0", "nccl_ib_hca": "mlx5_0"}


def check_cluster(data: dict[str, Any], nodes: int, **head: Any) -> list[tuple[HostSpec, list[Finding]]]:
    """Plan a cluster of ``nodes`` hosts (h1 the head) sharing ``data``, as one inventory."""
    hosts = [HostData("h1", ("all",), {**CLUSTER, **data, "ray_role": "head", **head})]
    hosts += [HostData(f"h{i}", ("all",), {**CLUSTER, **data, "ray_role": "worker"}) for i in range(2, nodes + 1)]
    return plan_hosts(hosts)


def rules_of(findings: list[Finding]) -> set[str]:
    return {f.rule for f in findings}
