"""Prometheus file_sd targets for every vLLM ``/metrics`` endpoint and device metrics exporter of an inventory.

Why generated: the endpoints follow from the inventory (instances, ports, cluster
roles, ``metrics_exporter``), so the scrape configuration follows it too instead
of being a second list to keep in step. A cluster serves from its head only; its
workers have no vLLM endpoint, but each node runs its own exporter. Labels say
which host, instance, model, recipe, cluster and role a series belongs to; the
job is ``vllm``, ``vllm-router`` (a router's ``--prometheus-port``, one per pool), ``instinct-fleet-watch``
(a serving host's watch: ``instinct_fleet_watch_out``, ``_left_out``, ``_stalled_seconds``, ``_restarts``) or
``amd-device-metrics``.
"""

from __future__ import annotations

from typing import Any

from instinct_fleet.model import paths
from instinct_fleet.model.spec import HostSpec


def file_sd(specs: list[HostSpec]) -> list[dict[str, Any]]:
    """One file_sd group per vLLM instance and exporter: ``[{"targets": ["addr:port"], "labels": {...}}]``, sorted."""
    groups = []

    def group(spec: HostSpec, port: int, job: str, instance: str, model: str = "", recipe: str = "") -> None:
        cluster = spec.cluster
        labels = {"job": job, "host": str(spec.host), "instance": instance, "model": model, "recipe": recipe}
        labels |= {"cluster": cluster.name if cluster else "", "role": cluster.role if cluster else "single"}
        groups.append({"targets": [paths.host_port(spec.reach, port)], "labels": labels})

    for spec in specs:
        if spec.vars.metrics_exporter:
            group(spec, spec.vars.metrics_exporter_port, "amd-device-metrics", paths.EXPORTER_UNIT)
        for svc in spec.serves:
            group(spec, svc.port, "vllm", svc.name, svc.model, svc.recipe)
        if spec.vars.watch and spec.serves:
            group(spec, spec.vars.watch_port, "instinct-fleet-watch", paths.WATCH_UNIT)
        for pool in spec.pools:
            group(spec, pool.metrics_port, "vllm-router", pool.unit, pool.model)
    return sorted(groups, key=lambda g: (g["labels"]["host"], g["labels"]["instance"]))
