"""The templates rendered directly, as the deploy renders them: the unit grammar and the directives each case needs.

The fleet runs ``systemd-analyze verify`` on every unit it writes (operations.unit_verified);
here each template is checked without a host, for every shape it has: single node,
cluster head and worker, with and without the drop-in and the firewall.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from instinct_fleet.converge import content, entries, firewall, managed, steps, system, templating
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.model import paths
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.paths import DOCKER_DROP_IN
from instinct_fleet.roll.plan import plan_inventory
from tests.unit.consumers import units_check
from tests.unit.files import docker_files, exporter_files, unit_files

from . import test_preflight as pf
from .conftest import CLUSTER

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"Unit", "Service", "Install"}
LINE = re.compile(r"^(#.*|\[(\w+)\]|([A-Za-z]+)=(.*)|\s+\S.*|)$")


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit as sections of (key, value), continuation lines joined; any other line fails the test."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        match = LINE.match(line)
        assert match, f"not unit grammar: {line!r}"
        if match.group(2):
            assert match.group(2) in SECTIONS
            current = sections.setdefault(match.group(2), [])
        elif match.group(3):
            assert current is not None, f"{line!r} outside a section"
            value = match.group(4)
            while value.endswith("\\"):
                i += 1
                value = value[:-1].rstrip() + " " + lines[i].strip()
            current.append((match.group(3), value))
        else:
            assert not line.startswith((" ", "\t")), f"a continuation without a backslash before it: {line!r}"
        i += 1
    return sections


def keys(section: list[tuple[str, str]]) -> list[str]:
    return [k for k, _ in section]


def single() -> HostPlan:
    report = pf.preflight.parse_report(pf.mi300x_host())
    return pf.plan({"vllm_instances": [{"name": "main"}, {"name": "b"}], "vllm_args": {"tensor-parallel-size": 4}}, report)


def cluster() -> dict[str, HostPlan]:
    return pf.cluster_plans(pf.interfaces("172.17.0.6"))


def test_the_vllm_unit_of_a_single_node_instance() -> None:
    plan = single()
    (svc, _) = plan.serves
    text = unit_files(plan)["vllm-main"][paths.unit_path("vllm-main")]
    unit = parse_unit(text)
    assert keys(unit["Unit"]) == ["Description", "After", "Wants", "Requires"]
    service = dict(unit["Service"])
    assert keys(unit["Service"]) == [
        "Type",
        "ExecStartPre",
        "ExecStartPre",
        "ExecStart",
        "ExecStop",
        "ExecStopPost",
        "Restart",
        "RestartSec",
        "TimeoutStartSec",
        "TimeoutStopSec",
    ]
    assert service["ExecStart"].startswith(f"{paths.DOCKER} run --rm --name vllm-main")
    assert "--env-file /etc/instinct-fleet/vllm-main.env" in service["ExecStart"]
    assert service["ExecStop"] == f"{paths.DOCKER} stop --time 90 vllm-main"  # drain 60 s + 30 s
    assert int(service["TimeoutStopSec"]) == 105 and service["TimeoutStartSec"] == "120"  # ExecStartPre only; health has its own wait
    assert unit["Install"] == [("WantedBy", "multi-user.target")]
    # Every flag on its own continuation line, the JSON-free argv split exactly as rendered.
    assert "--port 8080" in service["ExecStart"] and "--tensor-parallel-size 4" in service["ExecStart"]
    assert svc.name == "main"


def test_the_cluster_head_unit_waits_for_ray_and_the_worker_retries_forever() -> None:
    plans = cluster()
    head, worker = plans["head"], plans["w1"]
    vllm = parse_unit(unit_files(head)[paths.vllm_unit(head.serves[0].name)][paths.unit_path(paths.vllm_unit(head.serves[0].name))])
    assert ("After", "ray-head.service") in vllm["Unit"] and ("Requires", "ray-head.service") in vllm["Unit"]
    pre = [v for k, v in vllm["Service"] if k == "ExecStartPre"]
    assert " 2 16 600" in pre[0]  # two nodes, sixteen GPUs, ray_ready_timeout
    ray_head = parse_unit(unit_files(head)["ray-head"][paths.unit_path("ray-head")])
    ray_worker = parse_unit(unit_files(worker)["ray-worker"][paths.unit_path("ray-worker")])
    assert dict(ray_head["Service"])["Restart"] == "on-failure"
    assert dict(ray_worker["Service"])["Restart"] == "always" and dict(ray_worker["Service"])["RestartSec"] == "5"
    assert ("StartLimitIntervalSec", "0") in ray_worker["Unit"] and "StartLimitIntervalSec" not in keys(ray_head["Unit"])
    assert "--address=172.17.0.5:6379" in dict(ray_worker["Service"])["ExecStart"]


@pytest.mark.parametrize(("memlock", "want"), [(True, "infinity"), (8388608, "8388608")])
def test_the_dockerd_drop_in_raises_memlock(memlock: bool | int, want: str) -> None:
    text = templating.template("docker-limits.conf.j2", memlock=system.memlock_systemd(memlock))
    assert parse_unit(text) == {"Service": [("LimitMEMLOCK", want)]}


def test_no_drop_in_when_memlock_is_left_alone() -> None:
    report = pf.preflight.parse_report(pf.mi300x_host())
    plan = pf.plan({"tune_memlock": False}, report)
    assert docker_files(plan)[DOCKER_DROP_IN] is None


@pytest.mark.parametrize("name", ["firewall.service.j2", "cpu-idle.service.j2"])
def test_static_units_parse_and_install(name: str) -> None:
    text = {"firewall.service.j2": firewall.firewall_unit, "cpu-idle.service.j2": system.cpu_idle_unit}[name]()
    unit = parse_unit(text)
    assert dict(unit["Service"])["Type"] == "oneshot" and dict(unit["Service"])["RemainAfterExit"] == "yes"
    assert unit["Install"] == [("WantedBy", "multi-user.target")]
    assert "{{" not in text and "{%" not in text


# Host shapes whose declarations together hold every kind of managed file: a single-node host with the exporter, the
# firewall and the watch; a router host; a cluster's head and worker.
SHAPES: dict[str, dict[str, object]] = {
    "single": {"metrics_exporter": True, "vllm_allow_from": ["10.0.0.0/8"]},
    "router": {"router": True},
    "cluster": {**CLUSTER, "vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2},
}


def test_every_template_is_loaded_by_the_declaration_and_each_file_it_makes_passes_its_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The templates are found from the declaration, not from a list here: every file of ``templates/`` is loaded by
    some entry's content, and every declared file passes whoever reads it on the host: ``systemd-analyze verify``
    for a unit, ``sh -n`` for a shell script, Python's compiler for a Python one. A new entry and its template need
    no edit here."""
    loaded: set[str] = set()
    template, template_bytes = templating.template, templating.template_bytes
    monkeypatch.setattr(templating, "template", lambda name, **values: (loaded.add(name), template(name, **values))[1])
    monkeypatch.setattr(templating, "template_bytes", lambda name: (loaded.add(name), template_bytes(name))[1])
    made: dict[str, bytes] = {}
    reports = {
        h: pf.preflight.parse_report(pf.mi300x_host(interfaces=pf.interfaces(ip))) for h, ip in (("h1", "10.0.0.1"), ("h2", "10.0.0.2"))
    }
    for shape, data in SHAPES.items():
        if "ray_cluster" in data:
            hosts = [HostData("h1", (), {**data, "ray_role": "head"}), HostData("h2", (), {**data, "ray_role": "worker"})]
        else:
            hosts = [HostData("h1", (), data)]
        plans = plan_inventory(hosts, {h.name for h in hosts}, lambda specs: {name: reports[name] for name in specs})
        for name, host_plan in plans.items():
            assert host_plan.ok, (shape, host_plan.errors)
            made |= {f"{shape}/{name}:{f.path}": f.content for f in host_plan.desired.files if f.content is not None}
    shipped = {p.name for p in (ROOT / "instinct_fleet" / "templates").iterdir() if p.is_file()}
    assert shipped - loaded == set(), "templates no declared entry loads"
    units = {key.split(":", 1)[1]: data.decode() for key, data in made.items() if steps.unit_name(key.split(":", 1)[1])}
    assert len(units) >= 8 and units_check(units) == ""
    for key, data in made.items():
        if key.endswith(".sh"):
            checked = subprocess.run(["sh", "-n"], input=data, capture_output=True)
            assert checked.returncode == 0, (key, checked.stderr)
        elif key.endswith(".py"):
            compile(data, key, "exec")


def test_plan_inventory_is_the_one_entry_point() -> None:
    # The templates' values come from the plan alone: nothing else is needed to render them.
    plans = plan_inventory(
        [HostData("h1", (), {})], {"h1"}, lambda specs: dict.fromkeys(specs, pf.preflight.parse_report(pf.mi300x_host()))
    )
    assert plans["h1"].desired.serving == ("vllm-main",)


def test_the_metrics_exporter_unit_runs_the_pinned_image_with_the_gpus_and_its_config() -> None:
    report = pf.preflight.parse_report(pf.mi300x_host())
    files = exporter_files(pf.plan({"metrics_exporter": True, "metrics_exporter_port": 5050}, report))
    unit = parse_unit(files[paths.unit_path(paths.EXPORTER_UNIT)])  # amd-metrics-exporter.service.j2
    start = dict(unit["Service"])["ExecStart"]
    assert "--device /dev/kfd" in start and "--device /dev/dri" in start and "--network host" in start
    assert "-v /etc/instinct-fleet/metrics-exporter:/etc/metrics:ro" in start
    assert start.rstrip().endswith("rocm/device-metrics-exporter:v1.2.0")
    assert ("Requires", "docker.service") in unit["Unit"] and unit["Install"] == [("WantedBy", "multi-user.target")]
    config = json.loads(files[paths.EXPORTER_CONFIG])
    assert config["ServerPort"] == 5050 and "GPU_GFX_ACTIVITY" in config["GPUConfig"]["Fields"]
    assert {"GPU_UUID", "CARD_SERIES", "HOSTNAME"} <= set(config["GPUConfig"]["Labels"])
    assert exporter_files(pf.plan({}, report)) == {}


def test_the_host_readme_names_every_managed_unit_and_file() -> None:
    """host-readme.j2: what an operator on the host reads lists the declaration's units and files, with mode and owner."""
    report = pf.preflight.parse_report(pf.mi300x_host())
    plan = pf.plan({"metrics_exporter": True, "vllm_allow_from": ["10.0.0.0/8"]}, report)
    text = plan.desired.file(paths.HOST_README).text
    assert text.startswith("# Managed by instinct-fleet")
    declared = managed.declare(plan.spec)
    for entry in declared:
        if isinstance(entry, entries.FileEntry):
            assert f"  {entry.path}  {entry.mode or '-'} {entry.owner}:{entry.group}\n" in text, entry.path
        elif isinstance(entry, entries.UnitEntry):
            assert f"  {paths.service(entry.name)}\n" in text, entry.name
    assert paths.GENERATIONS_DIR in text and "{{" not in text


def test_the_router_unit_passes_systemd_analyze_verify() -> None:
    """router.service.j2, as content.router_unit renders it for one pool."""
    ((spec, findings),) = plan_hosts([HostData("r1", (), {"router": True, "router_flags": {"--cache-threshold": 0.5}})])
    assert not [f for f in findings if f.severity == "error"]
    (pool,) = spec.pools
    text = content.router_unit(spec, pool)
    assert units_check({paths.unit_path(pool.unit): text}) == ""
    assert "--cache-threshold 0.5" in text and "--api-key" not in text


def test_the_watch_unit_passes_systemd_analyze_verify() -> None:
    """watch.service.j2, as system.watch_unit renders it."""
    text = system.watch_unit(9401)
    assert units_check({paths.unit_path(paths.WATCH_UNIT): text}) == ""
    assert "port 9401" in text and paths.WATCH_STATE in text
