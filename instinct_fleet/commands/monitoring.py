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

import re
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Alert:
    """One GPU health alert on the device metrics exporter's series: its exporter field, its PromQL with ``{sel}`` for
    the hosts' selector and ``{n}`` for the host's threshold, and ``rule``: the ``gpu-*`` rule the next deploy judges
    the same fault by (a page), or the variable that sets its threshold (a ticket)."""

    name: str
    field: str  # the exporter field it reads (metrics_exporter_fields); its series is the name in lower case
    expr: str
    threshold: Callable[[HostSpec], float]
    hold: str  # Prometheus "for"
    rule: str
    summary: str


ALERTS = (
    Alert(
        "GpuUncorrectableEccIncreased",
        "GPU_ECC_UNCORRECT_TOTAL",
        "increase(gpu_ecc_uncorrect_total{sel}[5m]) > {n}",
        lambda _s: 0,
        "0m",
        "gpu-ecc-uncorrectable",
        "uncorrectable ECC errors on GPU {{ $labels.gpu_id }} of {{ $labels.host }} rose by {{ $value }} in 5 minutes",
    ),
    Alert(
        "GpuPcieRecoveries",
        "PCIE_RECOVERY_COUNT",
        "increase(pcie_recovery_count{sel}[15m]) > {n}",
        lambda s: s.vars.gpu_health_recovery_error,
        "0m",
        "gpu-pcie-recovery",
        "the PCIe link of GPU {{ $labels.gpu_id }} on {{ $labels.host }} went to recovery {{ $value }} times in 15 minutes",
    ),
    Alert(
        "GpuPcieSpeedBelowMaximum",
        "PCIE_SPEED",
        "pcie_speed{sel} < on(host, gpu_id) pcie_max_speed{sel}",
        lambda _s: 0,
        "10m",
        "gpu-pcie-speed",
        "the PCIe link of GPU {{ $labels.gpu_id }} on {{ $labels.host }} runs below its maximum speed",
    ),
    Alert(
        "GpuJunctionTemperatureHigh",
        "GPU_JUNCTION_TEMPERATURE",
        "gpu_junction_temperature{sel} > {n}",
        lambda s: s.vars.gpu_alert_junction_celsius,
        "5m",
        "gpu_alert_junction_celsius",
        "GPU {{ $labels.gpu_id }} of {{ $labels.host }} runs at {{ $value }} °C junction temperature",
    ),
    Alert(
        "GpuMemoryTemperatureHigh",
        "GPU_MEMORY_TEMPERATURE",
        "gpu_memory_temperature{sel} > {n}",
        lambda s: s.vars.gpu_alert_memory_celsius,
        "5m",
        "gpu_alert_memory_celsius",
        "GPU {{ $labels.gpu_id }} of {{ $labels.host }} runs at {{ $value }} °C memory temperature",
    ),
)
# PCIE_MAX_SPEED is read with PCIE_SPEED; the exporter has no field for the link's width (amd-smi's is judged by the deploy).
COMPANIONS = {"PCIE_SPEED": ("PCIE_MAX_SPEED",)}


def alert_rules(specs: list[HostSpec]) -> tuple[dict[str, Any], list[str]]:
    """Prometheus alerting rules (one group) for the GPU health of the hosts with a metrics exporter, each threshold the
    host's own (hosts that share a value share a rule, selected by their ``host`` label); and what cannot fire: an
    alert whose exporter field some host does not export, by host."""
    exporting = [s for s in specs if s.vars.metrics_exporter]
    rules: list[dict[str, Any]] = []
    unfired: list[str] = []
    for alert in ALERTS:
        needs = (alert.field, *COMPANIONS.get(alert.field, ()))
        lacking = [str(s.host) for s in exporting if not set(needs) <= set(s.vars.metrics_exporter_fields)]
        if lacking:
            unfired.append(f"{alert.name} reads {', '.join(needs)}, which metrics_exporter_fields of {', '.join(lacking)} leaves out")
        by_value: dict[float, list[str]] = {}
        for s in exporting:
            if str(s.host) not in lacking:
                by_value.setdefault(float(alert.threshold(s)), []).append(str(s.host))
        judged = alert.rule.startswith("gpu-")  # a gpu-* rule the deploy judges on amd-smi's evidence; else a variable
        for value, hosts in sorted(by_value.items()):
            selector = "{host=~" + promql_string("|".join(re2_literal(h) for h in sorted(hosts))) + "}"
            rules.append(
                {
                    "alert": alert.name,
                    "expr": alert.expr.replace("{sel}", selector).replace("{n}", f"{value:g}"),
                    "for": alert.hold,
                    "labels": {"severity": "page" if judged else "ticket", "instinct_fleet": alert.rule},
                    "annotations": {
                        "summary": alert.summary,
                        "description": f"{alert.summary}; "
                        + (f"the next deploy quarantines by {alert.rule}" if judged else f"above {alert.rule}")
                        + " (docs/gpu-health.md)",
                    },
                }
            )
    return {"groups": [{"name": "instinct-fleet-gpu-health", "rules": rules}]}, unfired


def re2_literal(text: str) -> str:
    """``text`` matched literally by RE2, Prometheus's regex engine (Python's re.escape also escapes '-', which RE2
    refuses outside a class)."""
    return re.sub(r"([.\\^$*+?()\[\]{}|])", r"\\\1", text)


def promql_string(text: str) -> str:
    """A PromQL double-quoted string literal (Go's escapes: backslash and quote)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
