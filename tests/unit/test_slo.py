"""The fleet's SLOs and alerts (instinct_fleet/commands/slo.py), held to their readers and to the series' writers:
``promtool check rules`` and ``promtool test rules`` with synthetic series for every alert, firing and quiet;
``amtool check-config`` on the Alertmanager config; every series a rule reads is one the pinned vLLM's source creates,
the stand-in's /metrics exposes, or the watch writes; the bucket bounds extracted from vLLM's source; and the SLO
settings that cannot be measured refused before any connection."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from instinct_fleet.commands import slo
from instinct_fleet.model import knowledge
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.knowledge import Histogram
from instinct_fleet.model.vllmsource import metrics as vllm_metrics
from tests.unit import series
from tests.unit.conftest import check
from tests.unit.consumers import PROMTOOL, standin

AMTOOL = "/usr/bin/amtool"
VERSIONS = ("0.11.0", "0.22.0", "0.33.0")
MODEL = "openai/gpt-oss-120b"


def specs(**data: Any) -> list[Any]:
    hosts = [
        HostData("r1", (), {"router": True, "vllm_instances": [], **data}),
        HostData("a", (), {"vllm_instances": [{"name": "one", "port": 8000}], **data}),
    ]
    return [spec for spec, _ in plan_hosts(hosts)]


def rules_file(tmp_path: Path, **data: Any) -> tuple[Path, dict[str, Any], list[str]]:
    rules, notes = slo.rule_file(specs(**data))
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return path, rules, notes


def promtool_test(tmp_path: Path, rules: Path, series: list[dict[str, str]], cases: list[dict[str, Any]]) -> None:
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": cases}],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    done = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def burn(slo_name: str, severity: str, window: str, objective: float, burn_rate: float, what: str) -> dict[str, Any]:
    """What a burn-rate alert of ``slo_name`` says for MODEL."""
    long, short = window.split("/")
    return {
        "exp_labels": {"severity": severity, "slo": slo_name, "window": window, "model": MODEL},
        "exp_annotations": {
            "summary": f"{MODEL}: {what} burn the {1 - objective:.3g} error budget {burn_rate:g} times too fast over {long} and {short}",
            "description": f"{what} exceed {burn_rate:g} times the budget of {1 - objective:.3g} of all, over {long} and the last "
            f"{short}; objective {objective:g} (docs/dashboards.md)",
        },
    }


def ttft_series(slow_percent: list[tuple[int, int]], model: str = MODEL) -> list[dict[str, str]]:
    """Ten requests a minute to ``model``; for each (minutes, percent) in turn, that percent of them over 2.5 s."""
    count, within, done_count, done_within = [], [], 0, 0
    for minutes, percent in slow_percent:
        for _ in range(minutes):
            done_count += 10
            done_within += 10 - percent // 10
            count.append(str(done_count))
            within.append(str(done_within))
    labels = f'job="vllm",model="{model}",instance="one",host="a"'
    return [
        {"series": f'vllm:time_to_first_token_seconds_bucket{{{labels},le="2.5"}}', "values": " ".join(within)},
        {"series": f"vllm:time_to_first_token_seconds_count{{{labels}}}", "values": " ".join(count)},
    ]


TTFT_WHAT = "requests whose first token took over 2.5 s"


def test_each_ttft_burn_alert_fires_on_its_burn_over_both_windows_and_not_below(tmp_path: Path) -> None:
    path, _, notes = rules_file(tmp_path)
    assert notes == []
    # 10% slow for 70 minutes: over 6x and 1x of a 1% budget, under 14.4x. A model with none slow: nothing.
    series = ttft_series([(70, 10)]) + ttft_series([(70, 0)], model="other/fast")
    page6h = burn("ttft", "page", "6h/30m", 0.99, 6, TTFT_WHAT)
    ticket = burn("ttft", "ticket", "3d/2h", 0.99, 1, TTFT_WHAT)
    promtool_test(tmp_path, path, series, [{"eval_time": "65m", "alertname": "VllmTtftSloBurn", "exp_alerts": [page6h, ticket]}])
    # All slow for an hour, then none for ten minutes: the 1h window still burns 14.4x, the 5m one no longer does.
    burst = ttft_series([(60, 100), (12, 0)])
    fast = burn("ttft", "page", "1h/5m", 0.99, 14.4, TTFT_WHAT)
    promtool_test(
        tmp_path,
        path,
        burst,
        [
            {"eval_time": "55m", "alertname": "VllmTtftSloBurn", "exp_alerts": [fast, page6h, ticket]},
            {"eval_time": "71m", "alertname": "VllmTtftSloBurn", "exp_alerts": [page6h, ticket]},
        ],
    )


def test_the_success_burn_alert_reads_vllm_s_error_finish_reason(tmp_path: Path) -> None:
    path, _, _ = rules_file(tmp_path)
    labels = f'job="vllm",model="{MODEL}",instance="one",host="a"'
    series = [
        # 100 requests a minute, 2 of them ending in error: 2% against a 0.1% budget, over 14.4x.
        {"series": f'vllm:request_success_total{{{labels},finished_reason="stop"}}', "values": "0+98x70"},
        {"series": f'vllm:request_success_total{{{labels},finished_reason="error"}}', "values": "0+2x70"},
    ]
    what = "requests that ended in error"
    expected = [
        burn("success", sev, w, 0.999, b, what) for sev, w, b in (("page", "1h/5m", 14.4), ("page", "6h/30m", 6), ("ticket", "3d/2h", 1))
    ]
    promtool_test(tmp_path, path, series, [{"eval_time": "65m", "alertname": "VllmSuccessSloBurn", "exp_alerts": expected}])


def test_the_success_slo_of_a_vllm_without_the_error_reason_is_said_not_written(tmp_path: Path) -> None:
    _, rules, notes = rules_file(tmp_path, vllm_version="0.11.0")
    assert notes == [f"VllmSuccessSloBurn for {MODEL}: its vLLM has no finished_reason 'error' (vllm:request_success has it from 0.22.0)"]
    success = next(g for g in rules["groups"] if g["name"] == "instinct-fleet-slo-success")
    assert all('{model!~"openai/gpt-oss-120b"}' in r["expr"] for r in success["rules"] if "alert" in r)


def fleet_alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    rule = next(r for r in slo.fleet_group(specs())["rules"] if r["alert"] == name)
    summary = rule["annotations"]["summary"]
    for key, value in labels.items():
        summary = summary.replace(f"{{{{ $labels.{key} }}}}", value)
    description = summary + rule["annotations"]["description"][len(rule["annotations"]["summary"]) :]
    return {"exp_labels": {"severity": severity, **labels}, "exp_annotations": {"summary": summary, "description": description}}


def test_the_fleet_s_own_alerts_fire_on_their_series(tmp_path: Path) -> None:
    path, _, _ = rules_file(tmp_path)
    down = {"job": "vllm", "host": "a", "instance": "one", "model": MODEL}
    watch = {"job": "instinct-fleet-watch", "host": "a", "unit": "vllm-one", "port": "8000"}
    router = {"job": "vllm-router", "host": "r1", "instance": "vllm-router-30000", "model": MODEL}
    as_labels = lambda labels: ",".join(f'{k}="{v}"' for k, v in labels.items())  # noqa: E731
    series = [
        {"series": f"up{{{as_labels(down)}}}", "values": "1 1 0 0 0 0 0"},
        {"series": f"up{{{as_labels({**down, 'instance': 'two'})}}}", "values": "1x6"},
        {"series": f"instinct_fleet_watch_left_out{{{as_labels(watch)}}}", "values": "0 0 1 1"},
        {"series": f"instinct_fleet_watch_restarts_total{{{as_labels(watch)}}}", "values": "0 0 1 1 1 1 1"},
        {"series": f"instinct_fleet_watch_quarantined{{{as_labels(watch)}}}", "values": "0 1 1"},
        # The pool's two workers turn unhealthy; a second router whose pool lists nobody at all.
        {"series": f'vllm_router_worker_health{{{as_labels(router)},worker="http://a:8000"}}', "values": "1 1 0 0 0 0"},
        {"series": f'vllm_router_worker_health{{{as_labels(router)},worker="http://b:8000"}}', "values": "1 0 0 0 0 0"},
        {"series": f"vllm_router_active_workers{{{as_labels({**router, 'instance': 'vllm-router-30001'})}}}", "values": "0x6"},
    ]
    promtool_test(
        tmp_path,
        path,
        series,
        [
            {"eval_time": "3m", "alertname": "VllmInstanceDown", "exp_alerts": []},  # down for 1 of its 2 minutes
            {"eval_time": "5m", "alertname": "VllmInstanceDown", "exp_alerts": [fleet_alert("VllmInstanceDown", "page", **down)]},
            {"eval_time": "3m", "alertname": "VllmEngineLeftOut", "exp_alerts": [fleet_alert("VllmEngineLeftOut", "page", **watch)]},
            {"eval_time": "4m", "alertname": "VllmEngineRestarted", "exp_alerts": [fleet_alert("VllmEngineRestarted", "ticket", **watch)]},
            {
                "eval_time": "2m",
                "alertname": "GpuInstanceQuarantined",
                "exp_alerts": [fleet_alert("GpuInstanceQuarantined", "ticket", **watch)],
            },
            {
                "eval_time": "5m",
                "alertname": "VllmRouterPoolEmpty",
                "exp_alerts": [
                    fleet_alert("VllmRouterPoolEmpty", "page", host="r1", instance="vllm-router-30000", model=MODEL),
                    fleet_alert("VllmRouterPoolEmpty", "page", host="r1", instance="vllm-router-30001", model=MODEL),
                ],
            },
        ],
    )


def test_the_alertmanager_config_delivers_every_alert_to_the_webhook_and_amtool_takes_it(tmp_path: Path) -> None:
    config = slo.alertmanager_config(specs(alert_webhook_url="https://hooks.example.com/fleet")[0].vars)
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run([AMTOOL, "check-config", str(tmp_path / "alertmanager.yml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert config["receivers"] == [
        {"name": "instinct-fleet", "webhook_configs": [{"url": "https://hooks.example.com/fleet", "send_resolved": True}]}
    ]


# Every series the rules read is written by someone: vLLM (its source's table, and the stand-in that serves it), the
# watch, the exporter (monitoring.ALERTS, tests/unit/test_alerts.py), vllm-router (tests/e2e/test_observe.py scrapes it).


def exprs(rules: dict[str, Any]) -> list[str]:
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_vllm_series_a_rule_reads_is_in_the_pinned_source_and_the_stand_in_s_metrics(tmp_path: Path, version: str) -> None:
    _, rules, _ = rules_file(tmp_path, vllm_version=version)
    table = knowledge.load(version)
    names = {n for n in series.read(exprs(rules)) if n.startswith("vllm:")}
    assert names >= {"vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count", "vllm:request_success_total"}
    assert {n for n in names if series.in_table(table.metrics, n) is None} == set()
    module = standin(version)
    module.State.served = "m"
    text = module.metrics_text()
    assert {n for n in names if not series.standin_exposes(text, n)} == set()
    # The bound the TTFT SLO reads, as the stand-in writes it from the same table.
    assert re.search(r'^vllm:time_to_first_token_seconds_bucket\{le="2\.5",', text, re.M)
    reasons = set(re.findall(r'finished_reason="(\w+)"', text))
    assert reasons == set(table.finish_reasons) and ("error" in reasons) == (version != "0.11.0")


def test_every_watch_series_a_rule_reads_is_one_the_watch_writes(tmp_path: Path) -> None:
    _, rules, _ = rules_file(tmp_path)
    written = series.watch_writes()
    assert {n for n in series.read(exprs(rules)) if n.startswith("instinct_fleet_watch_")} <= written
    assert "instinct_fleet_watch_quarantined" in written


def test_le_is_written_as_prometheus_client_writes_it() -> None:
    assert [slo.le(b) for b in (0.001, 1.0, 2.5, 2560.0, 12345678.0, 10000000.0)] == [
        "0.001",
        "1.0",
        "2.5",
        "2560.0",
        "1.2345678e+07",
        "1e+07",
    ]


# The bounds, from vLLM's own source.


def test_the_shipped_tables_give_the_ttft_bounds_and_the_finish_reasons_of_their_release() -> None:
    bounds = (
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        20.0,
        40.0,
        80.0,
        160.0,
        640.0,
        2560.0,
    )
    for version in VERSIONS:
        ttft = knowledge.load(version).histograms[knowledge.TTFT]
        assert ttft.buckets == bounds
        assert ttft.family == ("time_to_first_token" if version == "0.33.0" else None)
    assert knowledge.load("0.11.0").finish_reasons == ("stop", "length", "abort")
    assert knowledge.load("0.33.0").finish_reasons == ("stop", "length", "abort", "error", "repetition")
    assert Histogram((1.0, 2.0), "time_to_first_token").bounds({"time_to_first_token": [0.5, 3]}) == (0.5, 3.0)
    assert Histogram((1.0, 2.0), None).bounds({"time_to_first_token": [0.5]}) == (1.0, 2.0)


def test_the_extractor_reads_literals_names_and_bucket_families_and_leaves_out_what_follows_the_model() -> None:
    loggers = """
class PrometheusStatLogger:
    def __init__(self, custom_buckets, max_model_len):
        latency = [0.5, 1, 2]
        ttft = histogram_buckets("time_to_first_token", overrides=custom_buckets)
        tokens = build_1_2_5_buckets(max_model_len)
        self._histogram_cls(name="vllm:a_seconds", buckets=[0.1, 0.2], labelnames=[])
        self._histogram_cls(name="vllm:b_seconds", buckets=latency, labelnames=[])
        self._histogram_cls(name="vllm:time_to_first_token_seconds", buckets=ttft, labelnames=[])
        self._histogram_cls(name="vllm:request_prompt_tokens", buckets=tokens, labelnames=[])
        self._histogram_cls(name="other:c", buckets=[1], labelnames=[])
"""
    buckets = """
TIME_TO_FIRST_TOKEN_BUCKETS: tuple[float, ...] = (0.25, 0.5)
_STATIC_FAMILY_DEFAULTS: dict[str, tuple[float, ...]] = {"time_to_first_token": TIME_TO_FIRST_TOKEN_BUCKETS}
"""
    found = vllm_metrics.histogram_buckets({"vllm/v1/metrics/loggers.py": loggers, "vllm/v1/metrics/buckets.py": buckets})
    assert found == {
        "vllm:a_seconds": {"buckets": [0.1, 0.2]},
        "vllm:b_seconds": {"buckets": [0.5, 1.0, 2.0]},
        "vllm:time_to_first_token_seconds": {"buckets": [0.25, 0.5], "family": "time_to_first_token"},
    }
    assert vllm_metrics.finish_reasons('FINISH_REASON_STRINGS = ("stop", "length")\n') == ["stop", "length"]
    assert vllm_metrics.finish_reasons("X = 1\n") == []
    ast.parse(loggers)  # the fixture is Python


# Refused before any connection.


def findings(data: dict[str, Any]) -> list[Any]:
    return check(data)[1]


def test_a_ttft_slo_off_the_bucket_bounds_is_refused_with_the_nearest_and_custom_buckets_can_add_it() -> None:
    (off,) = [f for f in findings({"vllm_version": "0.22.0", "slo_ttft_seconds": 2}) if f.rule == "slo-ttft-bucket"]
    assert "slo_ttft_seconds 2 is no bucket bound of vllm:time_to_first_token_seconds" in off.message
    assert "the nearest bounds are 1 and 2.5" in off.message and "custom-histogram-buckets" not in off.message
    (hint,) = [f for f in findings({"vllm_version": "0.33.0", "slo_ttft_seconds": 2}) if f.rule == "slo-ttft-bucket"]
    assert "or add it to --custom-histogram-buckets' time_to_first_token list" in hint.message
    added = {
        "vllm_version": "0.33.0",
        "slo_ttft_seconds": 2,
        "vllm_args": {"custom-histogram-buckets": {"time_to_first_token": [0.5, 2, 10]}},
    }
    assert [f for f in findings(added) if f.rule == "slo-ttft-bucket"] == []
    # The instance's own bounds replace vLLM's: 2.5 is no longer one.
    replaced = {**added, "slo_ttft_seconds": 2.5}
    (gone,) = [f for f in findings(replaced) if f.rule == "slo-ttft-bucket"]
    assert "its --custom-histogram-buckets" in gone.message and "the nearest bounds are 2 and 10" in gone.message


def test_windows_that_retention_cannot_hold_or_out_of_order_and_a_webhook_that_is_not_http_are_refused() -> None:
    long = [f.message for f in findings({"prometheus_retention": "2d"}) if f.rule == "slo-window"]
    assert long == [
        "slo_burn_alerts[2] (ticket, 1x) reads 3d of samples, more than prometheus_retention 2d keeps: its window never "
        "fills; shorten it, or raise prometheus_retention with your Prometheus's --storage.tsdb.retention.time"
    ]
    order = [
        f.message
        for f in findings({"slo_burn_alerts": [{"severity": "page", "burn": 10, "long": "5m", "short": "1h"}]})
        if f.rule == "slo-window"
    ]
    assert len(order) == 1 and "its short window 1h is not below its long window 5m" in order[0]
    same = findings({"slo_burn_alerts": [{"severity": "page", "burn": 10, "long": "60m", "short": "1h"}]})
    assert [f.rule for f in same] == ["slo-window"]
    for bad in ("ftp://hooks.example.com/x", "hooks.example.com", "http://"):
        (found,) = [f for f in findings({"alert_webhook_url": bad})]
        assert found.rule == "value-format" and found.key == "alert_webhook_url" and "an http:// or https:// URL" in found.message
    (duration,) = findings({"prometheus_retention": "15 days"})
    assert (
        duration.rule == "value-format"
        and duration.key == "prometheus_retention"
        and "a Prometheus duration of one unit" in duration.message
    )
