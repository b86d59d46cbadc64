"""The fleet's SLOs as Prometheus recording and alerting rules, the alerts on what its own parts expose, and the
Alertmanager configuration that delivers them.

SLOs, one per model, alerted on as the Google SRE workbook's multiwindow burn rates ("Alerting on SLOs"):
- TTFT: the fraction of requests whose first token came later than ``slo_ttft_seconds``, read from vLLM's own
  histogram at the bucket bound ``le`` that equals it (validation's ``slo-ttft-bucket`` makes sure one does);
- success: the fraction of finished requests whose ``finished_reason`` is ``error`` (``vllm:request_success``; vLLM
  has that reason from 0.22.0, so on an older pin this SLO is said, not written).
Each error ratio is recorded over every window an alert of ``slo_burn_alerts`` reads; an alert fires while its long
and its short window both burn the error budget (1 - objective) ``burn`` times faster than the objective allows.

Fleet alerts: an instance whose target is down, an engine the watch left out or restarted, an instance quarantined
on its GPU's evidence, a router pool without a healthy worker.

Every series named here is one that its writer exposes: the pinned vLLM's source (its table's ``metrics``), the
watch's ``/metrics`` (templates/watch.py), vllm-router's ``/metrics``; tests/unit/test_slo.py holds each to its source.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from instinct_fleet.commands.monitoring import alert_rules, promql_string, re2_literal
from instinct_fleet.model.defaults import BurnAlert, FleetVars, duration_seconds
from instinct_fleet.model.knowledge import TTFT
from instinct_fleet.model.spec import HostSpec

SUCCESS = "vllm:request_success_total"  # a counter by finished_reason
ERROR_REASON = "error"
# vllm-router's pool, as its /metrics exposes it (one series per worker; the count of workers it lists).
ROUTER_WORKER_HEALTH = "vllm_router_worker_health"
ROUTER_ACTIVE_WORKERS = "vllm_router_active_workers"


def le(bound: float) -> str:
    """A bucket bound as prometheus_client writes its ``le`` label (floatToGoString), the value a selector must match."""
    text = repr(float(bound))
    dot = text.find(".")
    if bound > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def windows(alerts: Iterable[BurnAlert]) -> list[str]:
    """Every window the burn-rate alerts read, shortest first: one recording rule each."""
    return sorted({w for a in alerts for w in (a.long, a.short)}, key=duration_seconds)


@dataclass(frozen=True)
class Slo:
    """One SLO: its name in rule and alert names, what it counts, its objective, and the PromQL of its error ratio over
    a window ``{w}`` per model."""

    name: str  # ttft, success
    alert: str
    what: str
    objective: float
    ratio: str

    def record(self, window: str) -> str:
        return f"model:instinct_fleet_{self.name}_errors:ratio_rate{window}"


def slos(v: FleetVars) -> tuple[Slo, Slo]:
    """The TTFT and success SLOs at the fleet's objectives (validation: one value for the fleet, slo-fleet)."""
    bound = le(float(v.slo_ttft_seconds))
    ttft = (
        f'1 - (sum by (model) (rate({TTFT}_bucket{{job="vllm",le="{bound}"}}[{{w}}])) '
        f'/ sum by (model) (rate({TTFT}_count{{job="vllm"}}[{{w}}])))'
    )
    success = (
        f'sum by (model) (rate({SUCCESS}{{job="vllm",finished_reason="{ERROR_REASON}"}}[{{w}}])) '
        f'/ sum by (model) (rate({SUCCESS}{{job="vllm"}}[{{w}}]))'
    )
    return (
        Slo("ttft", "VllmTtftSloBurn", f"requests whose first token took over {float(v.slo_ttft_seconds):g} s", v.slo_ttft_objective, ttft),
        Slo("success", "VllmSuccessSloBurn", "requests that ended in error", v.slo_success_objective, success),
    )


def slo_groups(specs: list[HostSpec]) -> tuple[list[dict[str, Any]], list[str]]:
    """The recording rules and burn-rate alerts of the fleet's SLOs; and what cannot be written: the success SLO of a
    model that an instance serves on a vLLM without the ``error`` finish reason."""
    serving = [(spec, svc) for spec in specs for svc in spec.serves]
    if not serving:
        return [], []
    v = specs[0].vars
    ttft, success = slos(v)
    blind = sorted({svc.model for _, svc in serving if svc.table is not None and ERROR_REASON not in svc.table.finish_reasons})
    unwritten = [
        f"{success.alert} for {model}: its vLLM has no finished_reason {ERROR_REASON!r} (vllm:request_success has it from 0.22.0)"
        for model in blind
    ]
    groups = []
    for slo in (ttft, success):
        selector = "{model!~" + promql_string("|".join(re2_literal(m) for m in blind)) + "}" if slo is success and blind else ""
        records = [{"record": slo.record(w), "expr": slo.ratio.replace("{w}", w)} for w in windows(v.slo_burn_alerts)]
        alerts = []
        for a in v.slo_burn_alerts:
            threshold = f"{a.burn * (1 - slo.objective):g}"
            alerts.append(
                {
                    "alert": slo.alert,
                    "expr": f"{slo.record(a.long)}{selector} > {threshold} and {slo.record(a.short)}{selector} > {threshold}",
                    "labels": {"severity": a.severity, "slo": slo.name, "window": f"{a.long}/{a.short}"},
                    "annotations": {
                        "summary": f"{{{{ $labels.model }}}}: {slo.what} burn the {1 - slo.objective:.3g} error budget "
                        f"{a.burn:g} times too fast over {a.long} and {a.short}",
                        "description": f"{slo.what} exceed {a.burn:g} times the budget of {1 - slo.objective:.3g} of all, over "
                        f"{a.long} and the last {a.short}; objective {slo.objective:g} (docs/dashboards.md)",
                    },
                }
            )
        groups.append({"name": f"instinct-fleet-slo-{slo.name}", "rules": [*records, *alerts]})
    return groups, unwritten


def fleet_group(specs: list[HostSpec]) -> dict[str, Any]:
    """The alerts on the fleet's own parts (``specs``: at least one host): targets down, engines the watch gave up on or
    restarted, quarantines, and a router pool with no healthy worker (where a host runs a router)."""
    rules: list[dict[str, Any]] = [
        _alert(
            "VllmInstanceDown",
            'up{job="vllm"} == 0',
            specs[0].vars.alert_down_for,
            "page",
            "{{ $labels.instance }} on {{ $labels.host }} ({{ $labels.model }}) does not answer its /metrics",
            "its unit stopped or failed, the host is down, or the firewall changed; `instinct-fleet status` says which",
        ),
        _alert(
            "VllmEngineLeftOut",
            'instinct_fleet_watch_left_out{job="instinct-fleet-watch"} == 1',
            "0m",
            "page",
            "the watch on {{ $labels.host }} left {{ $labels.unit }} out of its router pools after watch_max_restarts restarts",
            "its engine stalls after every restart; read its journal, fix it, then remove its .out file (docs/rolling.md, Live engines)",
        ),
        _alert(
            "VllmEngineRestarted",
            'increase(instinct_fleet_watch_restarts_total{job="instinct-fleet-watch"}[15m]) > 0',
            "0m",
            "ticket",
            "the watch on {{ $labels.host }} restarted {{ $labels.unit }}: its engine made no step while busy",
            "it is back in its pools once its gate passed; a hang that repeats leaves it out (docs/rolling.md, Live engines)",
        ),
        _alert(
            "GpuInstanceQuarantined",
            'instinct_fleet_watch_quarantined{job="instinct-fleet-watch"} == 1',
            "0m",
            "ticket",
            "{{ $labels.unit }} on {{ $labels.host }} is quarantined on its GPU's evidence",
            "`instinct-fleet status` gives the reason; the next deploy re-admits it once the evidence clears (docs/gpu-health.md)",
        ),
    ]
    if any(spec.pools for spec in specs):
        rules.append(
            _alert(
                "VllmRouterPoolEmpty",
                f'(sum by (host, instance, model) ({ROUTER_WORKER_HEALTH}{{job="vllm-router"}}) '
                f'or max by (host, instance, model) ({ROUTER_ACTIVE_WORKERS}{{job="vllm-router"}})) == 0',
                "1m",
                "page",
                "the router {{ $labels.instance }} on {{ $labels.host }} has no healthy worker for {{ $labels.model }}",
                "every client request to it fails: its instances are down, quarantined or left out",
            )
        )
    return {"name": "instinct-fleet-fleet", "rules": rules}


def _alert(name: str, expr: str, hold: str, severity: str, summary: str, what: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": hold,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": f"{summary}: {what}"},
    }


def rule_file(specs: list[HostSpec]) -> tuple[dict[str, Any], list[str]]:
    """The one Prometheus rule file of the chosen hosts (``instinct-fleet targets --alerts``): the GPU health alerts
    (commands/monitoring.py), the SLOs' recording rules and burn-rate alerts, and the fleet's own alerts; and what
    cannot fire or be written, one line each."""
    gpu, unfired = alert_rules(specs)
    groups, unwritten = slo_groups(specs)
    return {"groups": [*gpu["groups"], *groups, fleet_group(specs)]}, [*unfired, *unwritten]


def alertmanager_config(v: FleetVars) -> dict[str, Any]:
    """Alertmanager's configuration: every alert to ``alert_webhook_url``, resolved ones too, grouped per alert, model
    and host; a page repeats every hour, a ticket every 12 hours."""
    assert v.alert_webhook_url is not None  # the CLI refuses without one
    hook = {"url": v.alert_webhook_url, "send_resolved": True}
    return {
        "route": {
            "receiver": "instinct-fleet",
            "group_by": ["alertname", "model", "host"],
            "group_wait": "10s",
            "group_interval": "1m",
            "repeat_interval": "1h",
            "routes": [{"receiver": "instinct-fleet", "matchers": ['severity="ticket"'], "repeat_interval": "12h"}],
        },
        "receivers": [{"name": "instinct-fleet", "webhook_configs": [hook]}],
    }
