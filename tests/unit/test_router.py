"""vLLM's router: its pools from the inventory, its settings against the pinned router's own parser, its files from the
pinned wheel, its stage, and the roll that drains through it."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from instinct_fleet.converge import firewall, routerwheel
from instinct_fleet.model import paths, router
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.rules import RULES
from tests.unit.stages import STAGES, SimHost, emitted, plan, run_stage

ROOT = Path(__file__).resolve().parents[2]
VERSION = router.supported_versions()[-1]
OSS = "openai/gpt-oss-120b"


@pytest.fixture(scope="module")
def router_args(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The pinned release's own ``vllm_router/router_args.py``, read from its wheel (pip fetches it once, checked by sha256)."""
    path = tmp_path_factory.mktemp("router") / "router_args.py"
    path.write_bytes(routerwheel.members(VERSION, None)["vllm_router/router_args.py"])
    spec = importlib.util.spec_from_file_location("router_args_pinned", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(router_args: ModuleType, argv: list[str]) -> Any:
    """What the router's launcher does with ``argv``: its parser, then its own checks (SystemExit or ValueError on refusal)."""
    parser = argparse.ArgumentParser(prog="vllm-router", exit_on_error=False)
    router_args.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    args = router_args.RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False)
    args._validate_router_args()
    return args


def test_the_shipped_table_is_what_the_pinned_router_parses() -> None:
    extract = importlib.util.spec_from_file_location("extract_router", ROOT / "scripts" / "extract_router_knowledge.py")
    assert extract is not None and extract.loader is not None
    module = importlib.util.module_from_spec(extract)
    extract.loader.exec_module(module)
    shipped = router.load(VERSION)
    assert shipped is not None
    options = module.options(routerwheel.members(VERSION, None)["vllm_router/router_args.py"].decode())
    assert {n: (o["kind"], o["type"], tuple(o.get("choices", ()))) for n, o in options.items()} == {
        n: (o.kind, o.type, o.choices) for n, o in shipped.options.items()
    }


SETTINGS = [
    {},
    {"router_policy": "round_robin", "router_retries": 0, "router_health_check_interval": 1},
    {"router_policy": "power_of_two", "router_flags": {"--cache-threshold": 0.5, "--disable-circuit-breaker": True}},
    {"router_flags": {"--log-level": "debug", "--request-id-headers": ["x-request-id", "x-trace-id"]}},
    {"router_flags": {"--queue-size": 0, "--max-concurrent-requests": 64}},
]
REFUSED = [
    ({"router_policy": "fastest"}, "router_policy"),
    ({"router_flags": {"--log-level": "verbose"}}, "router_flags.--log-level"),
    ({"router_flags": {"--queue-size": "many"}}, "router_flags.--queue-size"),
    ({"router_flags": {"--cache-threshold": "half"}}, "router_flags.--cache-threshold"),
    ({"router_flags": {"--no-such-option": 1}}, "router_flags.--no-such-option"),
    ({"router_flags": {"--disable-retries": "yes"}}, "router_flags.--disable-retries"),
]


def router_host(**data: Any) -> tuple[Any, list[Any]]:
    ((spec, findings),) = plan_hosts([HostData("r1", (), {"router": True, "scrape_address": "10.1.0.1", **data})])
    return spec, findings


@pytest.mark.parametrize("settings", SETTINGS)
def test_what_validation_accepts_the_pinned_router_parses(router_args: ModuleType, settings: dict[str, Any]) -> None:
    spec, findings = router_host(**settings)
    assert [f for f in findings if f.severity == "error"] == []
    (pool,) = spec.pools
    argv = router.argv(spec, pool)
    args = parse(router_args, [*argv, "--worker-urls", *(w.url for w in pool.workers)])
    assert args.port == pool.admin_port and args.prometheus_port == pool.metrics_port and args.worker_urls == ["http://10.1.0.1:8080"]
    assert args.policy == spec.vars.router_policy and args.health_check_interval_secs == spec.vars.router_health_check_interval


@pytest.mark.parametrize(("settings", "key"), REFUSED)
def test_what_validation_refuses_the_pinned_router_refuses(router_args: ModuleType, settings: dict[str, Any], key: str) -> None:
    _, findings = router_host(**settings)
    (hit,) = [f for f in findings if f.rule == "router-flag"]
    assert hit.host == "r1" and hit.key == key
    flags = settings.get("router_flags", {"--policy": settings.get("router_policy")})
    argv = [a for name, value in flags.items() for a in ([name] if value is True else [name, str(value)])]
    with pytest.raises((SystemExit, argparse.ArgumentError, ValueError)):
        parse(router_args, argv)


def test_a_pool_is_every_instance_of_its_model_and_each_serving_host_knows_its_routers() -> None:
    hosts = [
        HostData("r1", (), {"router": True, "scrape_address": "10.1.0.1", "vllm_instances": []}),
        HostData(
            "a",
            (),
            {"scrape_address": "10.1.0.2", "vllm_instances": [{"name": "one", "port": 8000}, {"name": "two", "port": 8001, "gpus": [1]}]},
        ),
        HostData("b", (), {"scrape_address": "fd00::3", "vllm_recipe": "llama-3.1-70b", "vllm_instances": [{"name": "l", "port": 9000}]}),
    ]
    specs = {str(s.host): (s, f) for s, f in plan_hosts(hosts)}
    r1 = specs["r1"][0]
    assert [(p.model, p.port, p.metrics_port) for p in r1.pools] == [
        ("meta-llama/Llama-3.1-70B-Instruct", 30000, 29000),
        (OSS, 30001, 29001),
    ]
    assert [w.url for w in r1.pools[1].workers] == ["http://10.1.0.2:8000", "http://10.1.0.2:8001"]
    assert [w.url for w in r1.pools[0].workers] == ["http://[fd00::3]:9000"]
    assert {(m.unit, m.api) for m in specs["a"][0].memberships} == {
        ("vllm-one", "http://10.1.0.1:31001"),
        ("vllm-two", "http://10.1.0.1:31001"),
    }
    assert r1.pools[1].worker_list == "http://10.1.0.2:8000\nhttp://10.1.0.2:8001\n"
    assert [str(f) for _, fs in specs.values() for f in fs if f.severity == "error"] == []


def test_a_pool_whose_instances_disagree_on_an_api_key_is_refused_and_one_that_agrees_is_not() -> None:
    key = {"vllm_api_key_path": "/etc/instinct-fleet/api-key"}
    hosts = [HostData("r1", (), {"router": True, **key}), HostData("b", (), {"scrape_address": "10.1.0.2"})]
    findings = [f for _, fs in plan_hosts(hosts) for f in fs if f.rule == "router-api-key"]
    assert [(f.host, f.key, f.severity) for f in findings] == [("r1", "router_models", "error")] and "(r1) and without (b)" in findings[
        0
    ].message
    hosts[1] = HostData("b", (), {"scrape_address": "10.1.0.2", **key})
    assert not [f for _, fs in plan_hosts(hosts) for f in fs if f.rule == "router-api-key"]


def test_a_router_port_that_another_listener_has_is_refused() -> None:
    _, findings = router_host(router_port=8080)
    (hit,) = [f for f in findings if f.rule == "port-conflict"]
    assert hit.host == "r1" and "router" in hit.message and "8080" in hit.message
    _, findings = router_host(router_metrics_port=22)
    assert [f.key for f in findings if f.rule == "port-conflict"] == ["router_metrics_port"]


@pytest.mark.parametrize(
    ("data", "rule", "key"),
    [
        ({"router_version": "0.0.1"}, "router-version", "router_version"),
        ({"router_flags": {"--api-key": "sk-secret"}}, "router-api-key-inline", "router_flags.--api-key"),
        ({"router_models": ["meta-llama/none"]}, "router-pool", "router_models"),
        ({"vllm_instances": []}, "router-pool", "router"),
        ({"router_flags": {"--vllm-pd-disaggregation": True}}, "router-flag", "router_flags.--vllm-pd-disaggregation"),
        ({"router_flags": {"--port": 1}}, "router-flag", "router_flags.--port"),
    ],
)
def test_bad_router_input_is_refused_before_any_host_with_host_key_and_rule(data: dict[str, Any], rule: str, key: str) -> None:
    _, findings = router_host(**data)
    hits = [f for f in findings if f.rule == rule]
    assert [f.key for f in hits] == [key] and hits[0].host == "r1" and RULES[rule].severity == "error"
    assert "sk-secret" not in " ".join(f.message for f in findings)


def test_the_wheel_is_refused_unless_it_is_the_pinned_one(tmp_path: Path) -> None:
    fake = tmp_path / "vllm_router.whl"
    fake.write_bytes(b"not the wheel")
    with pytest.raises(routerwheel.WheelError, match=r"sha256 .* not vllm-router .*'s"):
        routerwheel.members(VERSION, str(fake))
    with pytest.raises(routerwheel.WheelError, match="is not a file"):
        routerwheel.members(VERSION, str(tmp_path / "missing.whl"))
    sim = SimHost()
    refused = plan({"router": True, "router_wheel": str(fake)}, sim)
    assert [e.rule for e in refused.errors] == ["router-wheel"] and "remove it, or point router_wheel" in refused.errors[0].message


def fake_members(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """The wheel's members as small stand-ins: the stage tests need their paths and hashes, not 70 MB."""
    table = router.load(VERSION)
    assert table is not None
    members = {name: hashlib.sha256(name.encode()).hexdigest().encode() for name in table.members}
    monkeypatch.setattr(routerwheel, "members", lambda version, wheel: members)
    return members


def test_a_router_host_gets_its_files_units_and_pool_and_a_second_run_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    members = fake_members(monkeypatch)
    data = {"router": True}
    sim = SimHost()
    ops = emitted(monkeypatch, "router", plan(data, sim))
    unit = paths.router_unit(30000)
    release = paths.router_dir(VERSION)
    assert {f"vllm-router {name}" for name in members} <= set(ops)
    assert f"Router {unit} for {OSS}" in ops and f"{unit} passes systemd-analyze verify" in ops
    assert f"Restart {unit} for its new configuration" in ops
    # A new worker list is applied to the running router at once (a router not running yet starts with it).
    assert ops.index(f"Router pool of {OSS}: synced to its new worker list") < ops.index(f"Restart {unit} for its new configuration")
    from tests.unit.test_stages import converged, only

    sim = converged(monkeypatch, data)
    assert sim.files[f"{release}/vllm_router_rs.abi3.so"][0] == members["vllm_router_rs.abi3.so"]
    assert "--worker-urls" not in sim.files[paths.unit_path(unit)][0].decode()
    assert sim.files[paths.router_workers(30000)][0] == b"http://h1:8080\n"
    assert only(monkeypatch, data, sim) == {}
    # The running pool lost a worker (an interrupted roll took it out): the fact's --check says so, the stage syncs.
    drift = {"router-drift": "30000 add http://h1:8080"}
    assert only(monkeypatch, data, sim, **drift) == {"router": [f"Router pool of {OSS}: add http://h1:8080"]}
    # With a new worker list as well (another host serves the model now), the list's own sync does it, once.
    grown = emitted(monkeypatch, "router", plan(data, sim, peers={"h2": {"scrape_address": "10.0.0.7"}}, **drift))
    assert [o for o in grown if o.startswith("Router pool of")] == [f"Router pool of {OSS}: synced to its new worker list"]
    # Its instance's unit stopped (a deploy failed halfway): taken out of the running pool, whatever answers its port;
    # the roll adds it back after its gate.
    sim.active.discard(paths.vllm_unit("main"))
    assert only(monkeypatch, data, sim)["router"] == [f"Router pool of {OSS}: http://h1:8080 joins after its gate"]
    sim.active.add(paths.vllm_unit("main"))
    # Drift: a member removed by hand is put back, and the router restarted for it.
    del sim.files[f"{release}/vllm_router/router.py"]
    again = only(monkeypatch, data, sim)["router"]
    assert "vllm-router vllm_router/router.py" in again and f"Restart {unit} for its new configuration" in again


def test_the_roll_takes_a_unit_out_of_its_pools_before_it_stops_and_back_after_its_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.test_stages import converged

    data = {"vllm_allow_from": ["10.0.0.0/8"]}
    peers = {"r1": {"router": True, "vllm_instances": [], "scrape_address": "10.0.0.9"}}
    sim = converged(monkeypatch, data)
    changed = {**data, "vllm_args": {"max-num-seqs": 200}}
    names = [o.name for o in run_stage(monkeypatch, "services", plan(changed, sim, peers=peers))]
    out, restart, gate, back = (
        names.index("Roll: out of the router pools"),
        names.index("Restart vllm-main for its new configuration"),
        names.index("vllm-main healthy"),
        names.index("Roll: back into the router pools"),
    )
    assert out < restart < gate < back
    # A failed gate with rolling_on_failure rollback: back into the pools only after the rollback's own gate.
    ops = run_stage(monkeypatch, "services", plan(changed, sim, peers=peers), sick={"vllm-main.service": 1})
    names = [o.name for o in ops]
    assert "Roll: back into the router pools" not in names
    assert names.index("Roll: back to generation 1") < names.index("Roll: back into the router pools after the rollback")
    left = next(o for o in ops if o.name == "Roll: out of the router pools").kwargs["members"]
    assert [(m.router, m.api, m.url) for m in left] == [("r1", "http://10.0.0.9:31000", "http://h1:8080")]
    # Nothing changed: no call to any router.
    assert not [n for n in emitted(monkeypatch, "services", plan(data, sim, peers=peers)) if "router" in n]


def test_every_stage_has_its_place() -> None:
    assert STAGES.index("router") == STAGES.index("exporter") + 1


def test_each_pool_router_is_a_prometheus_target_that_promtool_reads() -> None:
    from instinct_fleet.commands import monitoring
    from tests.unit.consumers import targets_check

    spec, _ = router_host(router_metrics_port=29100)
    groups = monitoring.file_sd([spec])
    (routed,) = [g for g in groups if g["labels"]["job"] == "vllm-router"]
    assert (
        routed["targets"] == ["10.1.0.1:29100"]
        and routed["labels"]["model"] == OSS
        and routed["labels"]["instance"] == paths.router_unit(30000)
    )
    assert targets_check(groups) == ""


def test_status_shows_each_router_s_pool_against_the_inventory() -> None:
    from instinct_fleet.commands import status

    spec, _ = router_host()
    (pool,) = spec.pools
    assert f"http://127.0.0.1:{pool.admin_port}/workers" in status.script(spec)
    mark = status.MARK
    workers = {"workers": [{"url": "http://10.1.0.1:8080", "is_healthy": False}, {"url": "http://10.9.9.9:8000", "is_healthy": True}]}
    text = f"{mark}roll\n{mark}router {pool.unit}\nactive\n{json.dumps(workers)}\n"
    (row,) = [r for r in status.parse(spec, text) if r.unit == paths.service(pool.unit)]
    assert row.pool == "1 of 1 healthy" and row.instance == OSS
    assert row.problem() == f"{row.unit}'s pool is not the inventory's (not in the inventory http://10.9.9.9:8000): deploy to converge it"
    assert "pool 1 of 1 healthy ! not in the inventory http://10.9.9.9:8000" in status.table([row])
    # A worker missing from the running pool is drift only while it answers from the router host: a deploy leaves out
    # one that does not serve (its host failed preflight), and the router would send it nothing.
    empty = json.dumps({"workers": []})
    (gone,) = [
        r
        for r in status.parse(spec, f"{mark}router {pool.unit}\nactive\n{empty}\nanswers http://10.1.0.1:8080 000\n")
        if r.unit == paths.service(pool.unit)
    ]
    assert gone.pool == "0 of 1 healthy" and gone.problem() is None
    (lost,) = [
        r
        for r in status.parse(spec, f"{mark}router {pool.unit}\nactive\n{empty}\nanswers http://10.1.0.1:8080 200\n")
        if r.unit == paths.service(pool.unit)
    ]
    assert lost.problem() == f"{lost.unit}'s pool is not the inventory's (missing http://10.1.0.1:8080): deploy to converge it"
    (down,) = [r for r in status.parse(spec, f"{mark}router {pool.unit}\nfailed\n\n") if r.unit == paths.service(pool.unit)]
    assert down.health == "no answer" and down.problem() == f"{down.unit} is failed"


def test_a_pool_that_is_gone_has_its_unit_stopped_and_its_files_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.stages import deploy
    from tests.unit.test_stages import converged, only

    fake_members(monkeypatch)
    sim = converged(monkeypatch, {"router": True})
    unit = paths.router_unit(30000)
    assert unit in sim.active and paths.unit_path(unit) in sim.files
    # Moved to another port: the old pool's unit goes, the new one comes; then nothing is left to do.
    moved = {"router": True, "router_port": 31000, "router_metrics_port": 29100, "router_admin_port": 32000}
    ops = only(monkeypatch, moved, sim)["router"]
    assert f"Stop {unit} (no longer a pool of this host)" in ops
    assert f"Remove {paths.unit_path(unit)}" in ops and f"Remove {paths.router_workers(30000)}" in ops
    assert f"Router {paths.router_unit(31000)} for {OSS}" in ops
    deploy(monkeypatch, plan(moved, sim), sim)
    assert unit not in sim.active and paths.unit_path(unit) not in sim.files and paths.router_unit(31000) in sim.active
    assert only(monkeypatch, moved, sim) == {}
    # Switched off: every router unit and worker list goes, and the next run is quiet.
    deploy(monkeypatch, plan({}, sim), sim)
    assert not [p for p in sim.files if p.startswith(paths.ROUTER_CONFIG + "/") and p.endswith(".workers")]
    assert paths.router_unit(31000) not in sim.active and only(monkeypatch, {}, sim) == {}


def test_the_worker_api_is_kept_to_the_serving_hosts_and_router_allow_from_to_the_clients_and_nft_loads_it(tmp_path: Path) -> None:
    """The router's own port (its worker API) admits the host, its pools' serving hosts and router_admin_from, whether
    or not router_allow_from is set; router_allow_from keeps the clients' and metrics ports."""
    from instinct_fleet.converge.hostfacts import HostFacts
    from instinct_fleet.converge.preflight import parse_report
    from tests.unit.consumers import nft_check

    hosts = [
        HostData(
            "r1",
            (),
            {
                "router": True,
                "scrape_address": "10.1.0.1",
                "router_allow_from": ["192.168.0.0/16"],
                "prometheus_allow_from": ["10.9.0.5"],
                "router_admin_from": ["10.8.0.7"],
            },
        ),
        HostData("b", (), {"scrape_address": "10.1.0.2"}),
        HostData("c", (), {"scrape_address": "c.example"}),
    ]
    planned = {str(s.host): (s, f) for s, f in plan_hosts(hosts)}
    spec, findings = planned["r1"]
    (reach,) = [f for f in findings if f.rule == "router-reach"]
    assert reach.severity == "error" and "c is reached at a name (http://c.example:8080)" in reach.message
    assert router.allowed(spec) == ("192.168.0.0/16",)
    assert router.admin_allowed(spec) == ("10.1.0.1", "10.1.0.2", "10.8.0.7")
    ruleset = firewall.firewall(HostFacts(spec, parse_report(""), None, None))
    assert ruleset is not None
    (tmp_path / "firewall.nft").write_text(ruleset)
    assert nft_check(tmp_path / "firewall.nft") == ""
    assert 'tcp dport { 30000 } counter drop comment "router clients: router_allow_from only"' in ruleset
    assert 'tcp dport { 29000 } counter drop comment "router metrics: router_allow_from and prometheus_allow_from only"' in ruleset
    assert (
        "tcp dport { 29000 } ip saddr @scrapers_v4 accept" in ruleset and "tcp dport { 30000 } ip saddr @scrapers_v4 accept" not in ruleset
    )
    admin = [line.strip() for line in ruleset.splitlines() if line.strip().startswith("tcp dport { 31000 }")]
    assert admin == [
        "tcp dport { 31000 } fib saddr type local accept",
        "tcp dport { 31000 } ip saddr @router_admin_v4 accept",
        "tcp dport { 31000 } ip6 saddr @router_admin_v6 accept",
        'tcp dport { 31000 } counter drop comment "router worker API: its pools\' serving hosts and router_admin_from only"',
    ]
    assert "elements = { 10.1.0.1/32, 10.1.0.2/32, 10.8.0.7/32 }" in ruleset
    # No router_allow_from: clients from anywhere, the worker API still closed to them.
    alone = plan_hosts([HostData("r1", (), {"router": True, "scrape_address": "10.1.0.1"})])[0][0]
    assert router.allowed(alone) is None
    open_ruleset = firewall.firewall(HostFacts(alone, parse_report(""), None, None))
    assert open_ruleset is not None and 'tcp dport { 30000 } accept comment "router clients: anyone"' in open_ruleset
    assert 'tcp dport { 31000 } counter drop comment "router worker API' in open_ruleset
    (tmp_path / "open.nft").write_text(open_ruleset)
    assert nft_check(tmp_path / "open.nft") == ""


def test_two_instances_at_one_url_are_refused() -> None:
    hosts = [HostData("r1", (), {"router": True, "scrape_address": "10.1.0.1"}), HostData("twin", (), {"scrape_address": "10.1.0.1"})]
    findings = [f for _, fs in plan_hosts(hosts) for f in fs if f.rule == "router-pool"]
    assert [(f.host, f.key) for f in findings] == [("r1", "router_models")] and "both reached at http://10.1.0.1:8080" in findings[
        0
    ].message


def test_the_unpacked_members_are_used_only_while_they_match_the_checked_wheel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    table = router.load(VERSION)
    assert table is not None
    routerwheel.members(VERSION, None)  # the real wheel in the controller's cache, checked
    wheel: str | None = str(routerwheel.cache_dir() / table.wheel_file)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    unpack = routerwheel.members.__wrapped__  # not the per-process cache
    first = unpack(VERSION, wheel)  # router_wheel: checked, then unpacked into the cache for runs without it
    monkeypatch.setattr(routerwheel, "cache_dir", lambda: tmp_path / "instinct-fleet" / "wheels")
    shutil.copy(wheel, routerwheel.cache_dir() / table.wheel_file)
    wheel = None
    kept = routerwheel.cache_dir() / f"vllm-router-{VERSION}-{table.sha256[:16]}"
    assert (kept / routerwheel.SUMS).is_file() and set(first) == set(table.members)
    # A member changed on the controller's disk is not used: the wheel is read again and the member rewritten.
    (kept / "vllm_router/router.py").write_text("tampered")
    assert unpack(VERSION, wheel)["vllm_router/router.py"] == first["vllm_router/router.py"]
    assert (kept / "vllm_router/router.py").read_bytes() == first["vllm_router/router.py"]
    # Cut short before its sums were written: unpacked again, whatever the members hold.
    (kept / routerwheel.SUMS).unlink()
    (kept / "vllm_router/version.py").write_text("half")
    assert unpack(VERSION, wheel)["vllm_router/version.py"] == first["vllm_router/version.py"]


def test_a_pool_lists_only_instances_that_serve_in_this_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that failed preflight or could not be reached is in no pool: its port may be anyone's on that host (an
    unprivileged user there who opens it would get the clients' requests and keys). Its facts are read with the router
    host's even when the run is limited to the router, so a pool is never decided on an older run's outcome."""
    import dataclasses

    from instinct_fleet.converge import evaluate, preflight
    from instinct_fleet.roll.plan import plan_inventory

    fake_members(monkeypatch)
    sim = SimHost()
    hosts = [
        HostData("r1", (), {"router": True, "scrape_address": "10.0.0.1", "vllm_instances": []}),
        HostData("good", (), {"scrape_address": "10.0.0.2"}),
        HostData("nogpu", (), {"scrape_address": "10.0.0.3"}),
        HostData("down", (), {"scrape_address": "10.0.0.4"}),
    ]
    asked: list[str] = []

    def read(specs: dict[str, Any]) -> dict[str, preflight.HostReport | None]:
        asked.extend(specs)
        reports: dict[str, preflight.HostReport | None] = {}
        for name, spec in specs.items():
            gpus = {"amd_smi_static": "", "render_nodes": "", "render_by_path": "", "kfd": ""} if name == "nogpu" else {}
            text = sim.read(dataclasses.replace(evaluate.probe(spec)), **gpus)
            reports[name] = None if name == "down" else preflight.parse_report(text)
        return reports

    plans = plan_inventory(hosts, {"r1"}, read)
    # The members are read and judged, not planned: a run limited to the router rolls nothing else.
    assert sorted(asked) == ["down", "good", "nogpu", "r1"] and set(plans) == {"r1"}
    whole = plan_inventory(hosts, {"r1", "good", "nogpu", "down"}, read)
    assert not whole["good"].errors and whole["nogpu"].errors and not whole["down"].reached
    assert whole["r1"].desired == plans["r1"].desired
    (pool,) = plans["r1"].spec.pools
    assert pool.worker_list == "http://10.0.0.2:8080\n"
    workers = next(f for f in plans["r1"].desired.files if f.path == paths.router_workers(pool.port))
    assert workers.content == b"http://10.0.0.2:8080\n"
    # The inventory's pool is unchanged: a host back in order is back in the pool at the next run.
    (whole,) = next(s for s, _ in plan_hosts(hosts) if str(s.host) == "r1").pools
    assert len(whole.workers) == 3


def test_a_worker_whose_unit_is_not_running_joins_only_after_its_own_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that passed preflight but whose unit is not running (its last deploy failed halfway, or the unit was
    stopped) holds nothing of ours at its port: the router stage's sync takes it out of the running pool and never
    adds it, whatever answers there; its roll adds it after its gate. A running unit is added as before, and a
    quarantined one (stopped on purpose, left out by its watch) is not made to sync at every run."""
    from instinct_fleet.converge import gpuhealth, preflight
    from instinct_fleet.converge.evaluate import probe
    from instinct_fleet.roll.plan import plan_inventory

    fake_members(monkeypatch)
    hosts = [
        HostData("r1", (), {"router": True, "scrape_address": "10.0.0.1", "vllm_instances": []}),
        HostData("up", (), {"scrape_address": "10.0.0.2"}),
        HostData("stopped", (), {"scrape_address": "10.0.0.3"}),
        HostData("held", (), {"scrape_address": "10.0.0.4"}),
    ]
    unit = paths.vllm_unit("main")
    sims = {"r1": SimHost(), "up": SimHost(active={unit}), "stopped": SimHost(), "held": SimHost()}

    def read(specs: dict[str, Any]) -> dict[str, preflight.HostReport | None]:
        return {name: preflight.parse_report(sims[name].read(probe(spec))) for name, spec in specs.items()}

    ask = gpuhealth.Ask(quarantine={"held": (None, "operator")})
    plans = plan_inventory(hosts, {"r1"}, read, ask=ask)
    (pool,) = plans["r1"].spec.pools
    assert pool.joining == {"http://10.0.0.3:8080"}
    # The worker file is the inventory's pool, whatever runs: it does not change from one run to the next.
    assert pool.worker_list == "http://10.0.0.2:8080\nhttp://10.0.0.3:8080\nhttp://10.0.0.4:8080\n"
    ops = emitted(monkeypatch, "router", plans["r1"])
    synced = [o for o in ops if o.startswith("Router pool of")]
    # The new list syncs before the router (re)starts; then, the router up, the worker that joins is taken out of it.
    assert synced == [
        f"Router pool of {OSS}: synced to its new worker list",
        f"Router pool of {OSS}: http://10.0.0.3:8080 joins after its gate",
    ]
    assert ops.index(synced[1]) > ops.index(f"Restart {paths.router_unit(30000)} for its new configuration")
    from instinct_fleet.converge import managed

    assert managed.sync_command(pool).endswith(" --joining http://10.0.0.3:8080")
    assert managed.sync_command(pool, wait=True).endswith(" --joining http://10.0.0.3:8080 --wait")
    # Once every unit runs (the roll started it), nothing joins and the command is the plain sync.
    sims["stopped"].active.add(unit)
    (pool,) = plan_inventory(hosts, {"r1"}, read, ask=ask)["r1"].spec.pools
    assert pool.joining == frozenset() and "--joining" not in managed.sync_command(pool)
