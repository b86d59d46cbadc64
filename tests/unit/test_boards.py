"""The Grafana boards (instinct_fleet/commands/boards.py): every query parses (``promtool check rules`` on each, its
Grafana variables given values), every series it reads is written by the pinned vLLM's source and the stand-in, the
exporter or the watch, renamed metrics follow the pinned versions, and the boards are laid out as Grafana reads them."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from instinct_fleet.cli import main
from instinct_fleet.commands import boards
from instinct_fleet.model import knowledge
from instinct_fleet.model.defaults import EXPORTER_FIELDS
from instinct_fleet.model.inventory import HostData, plan_hosts
from tests.unit import series
from tests.unit.consumers import PROMTOOL, standin

VERSIONS = ("0.11.0", "0.22.0", "0.33.0")
# What Grafana puts in a query before Prometheus reads it.
GRAFANA = {"$__rate_interval": "1m", "$model": ".*", "$host": ".*", "$instance": ".*"}


def specs(**data: Any) -> list[Any]:
    hosts = [HostData("a", (), {"vllm_instances": [{"name": "one", "port": 8000}], "metrics_exporter": True, **data})]
    return [spec for spec, _ in plan_hosts(hosts)]


def queries(board: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    found += [a["expr"] for a in board["annotations"]["list"]]
    found += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return found


def as_prometheus(expr: str) -> str:
    for variable, value in GRAFANA.items():
        expr = expr.replace(variable, value)
    return expr


@pytest.mark.parametrize("version", VERSIONS)
def test_every_query_parses_and_every_series_it_reads_is_written(tmp_path: Path, version: str) -> None:
    chosen = specs(vllm_version=version)
    made = [boards.fleet_board(chosen), boards.instance_board(chosen)]
    exprs = [as_prometheus(q) for board in made for q in queries(board)]
    # label_values() is Grafana's, not PromQL: its argument is the series selector Prometheus reads.
    promql = [q[len("label_values(") : q.rindex(",")] if q.startswith("label_values(") else q for q in exprs]
    rules = {"groups": [{"name": "boards", "rules": [{"record": f"board:query{i}", "expr": q} for i, q in enumerate(promql)]}]}
    (tmp_path / "boards.yml").write_text(json.dumps(rules))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "boards.yml")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    read = series.read(promql)
    table = knowledge.load(version)
    vllm = {n for n in read if n.startswith("vllm:")}
    assert {n for n in vllm if series.in_table(table.metrics, n) is None} == set()
    module = standin(version)
    module.State.served = "m"
    text = module.metrics_text()
    assert {n for n in vllm if not series.standin_exposes(text, n)} == set()
    exporter = {n for n in read if n.startswith(("gpu_", "pcie_"))}
    assert exporter and exporter <= {f.lower() for f in EXPORTER_FIELDS}
    watch = {n for n in read if n.startswith("instinct_fleet_watch_")}
    assert watch and watch <= series.watch_writes()
    assert read <= vllm | exporter | watch | {"up"}


def test_a_renamed_metric_is_read_by_the_name_every_pinned_version_has() -> None:
    tables = [knowledge.load(v) for v in VERSIONS]
    assert boards.names(tables) == {
        "kv_cache": "vllm:kv_cache_usage_perc",
        "tpot": "vllm:inter_token_latency_seconds",
        "prefix_hits": "vllm:prefix_cache_hits",
        "prefix_queries": "vllm:prefix_cache_queries",
    }
    # A release from before the rename has only the old name: the boards read it there.
    old = dataclasses.replace(
        tables[0],
        version="0.8.0",
        metrics={k: v for k, v in tables[0].metrics.items() if k not in ("vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds")},
    )
    assert boards.names([old])["kv_cache"] == "vllm:gpu_cache_usage_perc"
    assert boards.names([old])["tpot"] == "vllm:time_per_output_token_seconds"
    # With a release that has only the new name beside it, no name is shared: refused, with what to do.
    with pytest.raises(boards.BoardError, match=r"the pinned vLLM versions \(0\.33\.0, 0\.8\.0\) share none of vllm:kv_cache_usage_perc"):
        boards.names([old, tables[2]])


def test_the_boards_are_laid_out_as_grafana_reads_them() -> None:
    for board in (boards.fleet_board(specs()), boards.instance_board(specs())):
        assert board["schemaVersion"] == 39 and board["uid"].startswith("instinct-fleet")
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        cells = set()
        for panel in board["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24
            mine = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
            assert not cells & mine, panel["title"]
            cells |= mine
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and panel["targets"]
                assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    titles = [p["title"] for p in boards.fleet_board(specs())["panels"]]
    for wanted in ("Request rate", "Success rate", "Time to first token", "Time per output token", "Queue", "Running requests"):
        assert wanted in titles
    for wanted in ("KV cache use", "Preemptions", "Prefix-cache hit rate", "GPU power", "Junction temperature", "Quarantined"):
        assert wanted in titles
    ttft = next(p for p in boards.fleet_board(specs())["panels"] if p["title"] == "Time to first token")
    assert [t["legendFormat"] for t in ttft["targets"]] == ["{{model}} p50", "{{model}} p99"]


def test_targets_writes_the_boards_and_a_provisioning_file_that_points_at_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The directory is made; the provisioning file is YAML, as its name says, and names where Grafana reads the boards
    (the directory, or where a container mounts it); a mistake in a later argument writes nothing at all."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "grafana" / "boards"
    code = main(["targets", str(root / "inventories" / "prod.py"), "-o", str(tmp_path / "t.json"), "--grafana", str(out)])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [
        "instinct-fleet-instance.json",
        "instinct-fleet-provisioning.yaml",
        "instinct-fleet.json",
    ]
    provider = yaml.safe_load((out / "instinct-fleet-provisioning.yaml").read_text())
    assert provider["apiVersion"] == 1 and provider["providers"][0]["options"]["path"] == str(out.resolve())
    assert json.loads((out / "instinct-fleet.json").read_text())["uid"] == "instinct-fleet"
    mounted = "/var/lib/grafana/dashboards/instinct-fleet"
    code = main(
        ["targets", str(root / "inventories" / "prod.py"), "-o", str(tmp_path / "t.json"), "--grafana", str(out), "--grafana-path", mounted]
    )
    assert (
        code == 0 and yaml.safe_load((out / "instinct-fleet-provisioning.yaml").read_text())["providers"][0]["options"]["path"] == mounted
    )
    capsys.readouterr()
    later = tmp_path / "later"
    (tmp_path / "a-file").write_text("")
    code = main(
        [
            "targets",
            str(root / "inventories" / "prod.py"),
            "--alerts",
            str(later / "rules.yml"),
            "--grafana",
            str(later / "g"),
            "-o",
            str(tmp_path / "a-file" / "t.json"),
        ]
    )
    assert code == 2 and "is a file, not a directory" in capsys.readouterr().err
    assert not later.exists()  # the rules and boards of the earlier arguments were not written either
