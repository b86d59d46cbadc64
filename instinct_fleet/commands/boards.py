"""Grafana boards of the fleet, generated from the inventory and the pinned vLLM's own metric names.

Two boards in Grafana's JSON model (Grafana 10.4 and newer; ``schemaVersion`` 39), and the provisioning file that
loads them: the fleet's (per model: request rate, success rate, TTFT and TPOT p50 and p99, queue, running requests,
KV cache use, preemptions, prefix-cache hit rate; per host: GPU power, junction and memory temperature, uncorrectable
ECC, PCIe speed; serving units up, out of their pools, quarantined) and one instance's. The roll's batches, canaries
and rollbacks are annotations, from the watch's counters of what the roll's marker showed on each host.

A metric vLLM renamed (``vllm:gpu_cache_usage_perc`` became ``vllm:kv_cache_usage_perc`` and was removed in 0.12;
``vllm:time_per_output_token_seconds`` became ``vllm:inter_token_latency_seconds``) is chosen per fleet: the first
name of :data:`RENAMED` that every pinned vLLM's table has, so a board never queries a name the fleet's vLLM no longer
writes; tests/unit/test_boards.py holds every name to the tables, the stand-in's /metrics, the exporter's fields and
the watch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from instinct_fleet.commands.slo import ERROR_REASON, SUCCESS
from instinct_fleet.model.knowledge import TTFT, VllmKnowledge
from instinct_fleet.model.spec import HostSpec

# The names a vLLM metric had, newest first: a board reads the first one every pinned table has.
RENAMED = {
    "kv_cache": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "tpot": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "prefix_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "prefix_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
}
GRAFANA_SCHEMA = 39  # Grafana 10.4
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


class BoardError(ValueError):
    """The fleet's pinned vLLM versions share no name for a metric a board needs; the message says which."""


def names(tables: Iterable[VllmKnowledge]) -> dict[str, str]:
    """For each renamed metric, the name the boards read (as vLLM's source writes it): the newest that every table has."""
    tables = list(tables)
    chosen = {}
    for key, candidates in RENAMED.items():
        found = next((n for n in candidates if all(n in t.metrics for t in tables)), None)
        if found is None:
            versions = ", ".join(sorted({t.version for t in tables}))
            raise BoardError(f"the pinned vLLM versions ({versions}) share none of {', '.join(candidates)}: pin one version")
        chosen[key] = found
    return chosen


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def _panel(title: str, unit: str, targets: list[tuple[str, str]], description: str = "") -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)],
    }


def _row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def _laid_out(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ids and grid positions: rows across the board, three panels to a line under each."""
    y, x, out = 0, 0, []
    for n, panel in enumerate(panels, start=1):
        if panel["type"] == "row":
            y, x = y + (8 if x else 0), 0
            out.append({**panel, "id": n, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
            y += 1
            continue
        out.append({**panel, "id": n, "gridPos": {"h": 8, "w": 8, "x": x, "y": y}})
        x += 8
        if x >= 24:
            x, y = 0, y + 8
    return out


def _quantiles(metric: str, selector: str, by: str, legend: str) -> list[tuple[str, str]]:
    return [
        (f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{selector}[{RATE}])))", f"{legend} p{round(q * 100)}")
        for q in (0.5, 0.99)
    ]


def _board(uid: str, title: str, variables: list[dict[str, Any]], panels: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["instinct-fleet", "vllm"],
        "schemaVersion": GRAFANA_SCHEMA,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                *variables,
            ]
        },
        "annotations": {
            "list": [
                {
                    "name": name,
                    "datasource": DATASOURCE,
                    "enable": True,
                    "iconColor": color,
                    "expr": f'increase(instinct_fleet_watch_{kind}_total{{job="instinct-fleet-watch"}}[2m]) > 0',
                    "step": "1m",
                    "titleFormat": f"{what} on {{{{host}}}}",
                    "tagKeys": "host",
                }
                for name, kind, color, what in (
                    ("Rolls", "rolls", "blue", "roll batch"),
                    ("Canaries", "canaries", "orange", "canary"),
                    ("Rollbacks", "rollbacks", "red", "rollback"),
                )
            ]
        },
        "panels": _laid_out(panels),
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
    }


def fleet_board(specs: list[HostSpec]) -> dict[str, Any]:
    """The fleet's board: per model, per host, and the serving units."""
    n = names(svc.table for spec in specs for svc in spec.serves if svc.table is not None)
    m = '{job="vllm",model=~"$model"}'
    h = '{job="amd-device-metrics",host=~"$host"}'
    w = '{job="instinct-fleet-watch",host=~"$host"}'
    per_model = [
        _row("Per model"),
        _panel("Request rate", "reqps", [(f"sum by (model) (rate({SUCCESS}{m}[{RATE}]))", "{{model}}")]),
        _panel(
            "Success rate",
            "percentunit",
            [
                (
                    # A version without the error reason has no such series: none failed, as far as it can tell.
                    f'1 - ((sum by (model) (rate({SUCCESS}{{job="vllm",model=~"$model",finished_reason="{ERROR_REASON}"}}[{RATE}])) '
                    f"or sum by (model) (rate({SUCCESS}{m}[{RATE}])) * 0) / sum by (model) (rate({SUCCESS}{m}[{RATE}])))",
                    "{{model}}",
                )
            ],
            "Finished requests that did not end in error (vLLM's finished_reason, from 0.22.0).",
        ),
        _panel("Time to first token", "s", _quantiles(TTFT, m, "model", "{{model}}")),
        _panel("Time per output token", "s", _quantiles(n["tpot"], m, "model", "{{model}}")),
        _panel("Queue", "short", [(f"sum by (model) (vllm:num_requests_waiting{m})", "{{model}} waiting")]),
        _panel("Running requests", "short", [(f"sum by (model) (vllm:num_requests_running{m})", "{{model}} running")]),
        _panel("KV cache use", "percentunit", [(f"avg by (model) ({n['kv_cache']}{m})", "{{model}}")]),
        _panel("Preemptions", "short", [(f"sum by (model) (rate(vllm:num_preemptions_total{m}[{RATE}]))", "{{model}}")]),
        _panel(
            "Prefix-cache hit rate",
            "percentunit",
            [
                (
                    f"sum by (model) (rate({n['prefix_hits']}_total{m}[{RATE}])) / sum by (model) (rate({n['prefix_queries']}_total{m}[{RATE}]))",
                    "{{model}}",
                )
            ],
            "Prompt tokens found in the prefix cache: what the router's cache-aware policy wins.",
        ),
    ]
    per_host = [
        _row("Per host (AMD device metrics exporter)"),
        _panel("GPU power", "watt", [(f"sum by (host) (gpu_package_power{h})", "{{host}}")]),
        _panel("Junction temperature", "celsius", [(f"max by (host) (gpu_junction_temperature{h})", "{{host}}")]),
        _panel("Memory temperature", "celsius", [(f"max by (host) (gpu_memory_temperature{h})", "{{host}}")]),
        _panel("Uncorrectable ECC errors", "short", [(f"sum by (host, gpu_id) (gpu_ecc_uncorrect_total{h})", "{{host}} GPU {{gpu_id}}")]),
        _panel(
            "PCIe speed",
            "short",
            [(f"min by (host) (pcie_speed{h})", "{{host}} slowest"), (f"max by (host) (pcie_max_speed{h})", "{{host}} maximum")],
        ),
    ]
    units = [
        _row("Serving units"),
        _panel("Instances up", "short", [('sum by (host) (up{job="vllm",host=~"$host"})', "{{host}}")]),
        _panel("Out of their router pools", "short", [(f"sum by (host) (instinct_fleet_watch_out{w})", "{{host}}")]),
        _panel("Quarantined", "short", [(f"sum by (host) (instinct_fleet_watch_quarantined{w})", "{{host}}")]),
    ]
    variables = [
        _variable("model", "Model", 'label_values(vllm:num_requests_running{job="vllm"}, model)'),
        _variable("host", "Host", "label_values(up, host)"),
    ]
    return _board("instinct-fleet", "instinct-fleet: fleet", variables, [*per_model, *per_host, *units])


def instance_board(specs: list[HostSpec]) -> dict[str, Any]:
    """One instance's board, chosen by host and instance."""
    n = names(svc.table for spec in specs for svc in spec.serves if svc.table is not None)
    i = '{job="vllm",host=~"$host",instance=~"$instance"}'
    panels = [
        _row("Instance"),
        _panel("Requests", "reqps", [(f"sum by (finished_reason) (rate({SUCCESS}{i}[{RATE}]))", "{{finished_reason}}")]),
        _panel("Time to first token", "s", _quantiles(TTFT, i, "instance", "{{instance}}")),
        _panel("Time per output token", "s", _quantiles(n["tpot"], i, "instance", "{{instance}}")),
        _panel("Queue and running", "short", [(f"vllm:num_requests_waiting{i}", "waiting"), (f"vllm:num_requests_running{i}", "running")]),
        _panel("KV cache use", "percentunit", [(f"{n['kv_cache']}{i}", "{{instance}}")]),
        _panel("Preemptions", "short", [(f"rate(vllm:num_preemptions_total{i}[{RATE}])", "{{instance}}")]),
        _panel(
            "Watch",
            "short",
            [
                (
                    'instinct_fleet_watch_stalled_seconds{job="instinct-fleet-watch",host=~"$host",unit=~"vllm-$instance"}',
                    "{{unit}} stalled s",
                ),
                ('instinct_fleet_watch_out{job="instinct-fleet-watch",host=~"$host",unit=~"vllm-$instance"}', "{{unit}} out"),
            ],
        ),
    ]
    variables = [
        _variable("host", "Host", 'label_values(up{job="vllm"}, host)'),
        _variable("instance", "Instance", 'label_values(up{job="vllm",host=~"$host"}, instance)'),
    ]
    return _board("instinct-fleet-instance", "instinct-fleet: instance", variables, panels)


def provisioning(directory: str) -> dict[str, Any]:
    """Grafana's dashboard provider (``/etc/grafana/provisioning/dashboards/``) for the boards written to ``directory``."""
    provider = {
        "name": "instinct-fleet",
        "folder": "instinct-fleet",
        "type": "file",
        "disableDeletion": False,
        "updateIntervalSeconds": 60,
        "allowUiUpdates": False,
        "options": {"path": directory, "foldersFromFilesStructure": False},
    }
    return {"apiVersion": 1, "providers": [provider]}
