"""The GPU health alerting rules (instinct_fleet/commands/monitoring.py), handed to their reader: ``promtool check rules``
and ``promtool test rules`` with synthetic exporter series for every alert, firing and quiet, each host at its own
threshold, on host names that need escaping in PromQL."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from instinct_fleet.commands import monitoring
from instinct_fleet.model.inventory import HostData, plan_hosts
from tests.unit.consumers import PROMTOOL

HOT = "gpu-1.example.com"  # a dot: literal in RE2 only when escaped
COOL = "b"


def specs() -> list[Any]:
    hosts = [
        HostData(HOT, (), {"metrics_exporter": True, "gpu_health_recovery_error": 3, "gpu_alert_junction_celsius": 100}),
        HostData(COOL, (), {"metrics_exporter": True, "gpu_health_recovery_error": 10, "gpu_alert_junction_celsius": 110}),
    ]
    return [spec for spec, _ in plan_hosts(hosts)]


def expected(name: str, host: str, gpu: str, value: str) -> dict[str, Any]:
    alert = next(a for a in monitoring.ALERTS if a.name == name)
    summary = alert.summary.replace("{{ $labels.gpu_id }}", gpu).replace("{{ $labels.host }}", host).replace("{{ $value }}", value)
    judged = alert.rule.startswith("gpu-")
    said = f"the next deploy quarantines by {alert.rule}" if judged else f"above {alert.rule}"
    return {
        "exp_labels": {"severity": "page" if judged else "ticket", "instinct_fleet": alert.rule, "host": host, "gpu_id": gpu},
        "exp_annotations": {"summary": summary, "description": f"{summary}; {said} (docs/gpu-health.md)"},
    }


def series(name: str, host: str, values: str, gpu: str = "0") -> dict[str, str]:
    return {"series": f'{name}{{host="{host}",gpu_id="{gpu}"}}', "values": values}


def test_every_alert_fires_on_its_fault_at_each_host_s_threshold_and_not_otherwise(tmp_path: Path) -> None:
    rules, unfired = monitoring.alert_rules(specs())
    assert unfired == []
    (tmp_path / "alerts.yml").write_text(json.dumps(rules))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "alerts.yml")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    cases = [
        # Two uncorrectable errors on HOT's GPU 3 fire at once; COOL's counter that stays flat does not.
        (
            [
                series("gpu_ecc_uncorrect_total", HOT, "0 0 2 2 2 2 2", "3"),
                series("gpu_ecc_uncorrect_total", COOL, "5x6"),
                # Not a host of the inventory: its name matches HOT's only where the dot is not escaped.
                series("gpu_ecc_uncorrect_total", HOT.replace(".", "x", 1), "0 0 2 2 2 2 2", "3"),
            ],
            [("3m", "GpuUncorrectableEccIncreased", [expected("GpuUncorrectableEccIncreased", HOT, "3", "2")])],
        ),
        # Five recoveries in 15 minutes: over HOT's 3, under COOL's 10.
        (
            [series("pcie_recovery_count", HOT, "0+1x5 5x10"), series("pcie_recovery_count", COOL, "0+1x5 5x10")],
            [("6m", "GpuPcieRecoveries", [expected("GpuPcieRecoveries", HOT, "0", "5")])],
        ),
        # Gen4 on a Gen5 link for more than 10 minutes; COOL at its maximum.
        (
            [
                series("pcie_speed", HOT, "16x15"),
                series("pcie_max_speed", HOT, "32x15"),
                series("pcie_speed", COOL, "32x15"),
                series("pcie_max_speed", COOL, "32x15"),
            ],
            [
                ("5m", "GpuPcieSpeedBelowMaximum", []),
                ("12m", "GpuPcieSpeedBelowMaximum", [expected("GpuPcieSpeedBelowMaximum", HOT, "0", "16")]),
            ],
        ),
        # 105 °C: over HOT's 100, under COOL's 110, held 5 minutes.
        (
            [series("gpu_junction_temperature", HOT, "105x10"), series("gpu_junction_temperature", COOL, "105x10")],
            [
                ("3m", "GpuJunctionTemperatureHigh", []),
                ("7m", "GpuJunctionTemperatureHigh", [expected("GpuJunctionTemperatureHigh", HOT, "0", "105")]),
            ],
        ),
        (
            [series("gpu_memory_temperature", HOT, "95x10"), series("gpu_memory_temperature", COOL, "80x10")],
            [("7m", "GpuMemoryTemperatureHigh", [expected("GpuMemoryTemperatureHigh", HOT, "0", "95")])],
        ),
    ]
    assert {name for _, tests in cases for _, name, _ in tests} == {a.name for a in monitoring.ALERTS}
    tests = [
        {
            "interval": "1m",
            "input_series": inputs,
            "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": alerts} for at, name, alerts in checks],
        }
        for inputs, checks in cases
    ]
    (tmp_path / "tests.yml").write_text(json.dumps({"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_alert_whose_field_a_host_does_not_export_is_said_and_left_out_there() -> None:
    only_ecc = {"metrics_exporter": True, "metrics_exporter_fields": ["GPU_ECC_UNCORRECT_TOTAL"]}
    hosts = [HostData("a", (), only_ecc), HostData("b", (), {"metrics_exporter": False})]
    rules, unfired = monitoring.alert_rules([spec for spec, _ in plan_hosts(hosts)])
    assert [r["alert"] for r in rules["groups"][0]["rules"]] == ["GpuUncorrectableEccIncreased"]
    assert (
        len(unfired) == 4
        and "GpuPcieSpeedBelowMaximum reads PCIE_SPEED, PCIE_MAX_SPEED, which metrics_exporter_fields of a leaves out" in unfired
    )
