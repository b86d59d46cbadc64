"""Carrying compile caches: who builds, who receives, what counts as one configuration, and ``instinct-fleet warm``."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from instinct_fleet.converge import preflight
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.model import paths
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.render import compile_config, render_args
from instinct_fleet.roll import spread
from instinct_fleet.roll.plan import FleetPlan, plan_inventory
from instinct_fleet.roll.roll import WARM_LEFT, Journal, format_summary, plan_roll

from . import consumers
from .test_preflight import mi300x_host
from .test_roll import deployed

MAIN = {"vllm_instances": [{"name": "main"}]}


ETH0 = "1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet {}/16 brd 10.0.255.255 scope global eth0"


def serving(hosts: dict[str, dict[str, Any]], arch: dict[str, str | None] | None = None) -> dict[str, HostPlan]:
    """Hosts that serve their instances now, each serving unit's env file changed: every one restarts in the roll.
    Each host has its own address on eth0 (a cluster's nodes reach each other there)."""
    data = [HostData(name, (), values) for name, values in hosts.items()]
    address = {name: ETH0.format(f"10.0.0.{i + 1}") for i, name in enumerate(hosts)}
    fresh = plan_inventory(data, set(hosts), lambda specs: {n: preflight.parse_report(mi300x_host(interfaces=address[n])) for n in specs})
    reports = {}
    for name in hosts:
        units = fresh[name].desired.serving
        running = "\n".join(f"{unit}.service loaded active running x" for unit in units)
        changed = {paths.unit_env_path(u): "OLD=1\n" for u in units}
        text = mi300x_host(files=deployed(fresh[name], **changed), active=running, interfaces=address[name])
        report = preflight.parse_report(text)
        if arch is not None and name in arch:
            report = dataclasses.replace(report, gpus=tuple(dataclasses.replace(g, arch=arch[name]) for g in report.gpus))
        reports[name] = report
    return plan_inventory(data, set(hosts), lambda specs: {n: reports[n] for n in specs})


def test_the_first_host_to_restart_sends_its_cache_to_the_later_ones_that_build_the_same() -> None:
    plans = serving(
        {
            "a1": MAIN,
            "a2": {"vllm_instances": [{"name": "main", "port": 9000}]},  # another port: the same configuration
            "a3": MAIN,
            "b1": {**MAIN, "vllm_args": {"max-num-seqs": 64}},  # a flag of its own: its own cache, nobody to send it to
            "mi355": MAIN,  # another GPU architecture
            "smi": MAIN,  # no architecture named (rocm-smi)
        },
        arch={"mi355": "gfx950", "smi": None},
    )
    roll = plan_roll(plans)
    assert [sorted(h for u in b for h in u.hosts) for b in roll.batches][1:3] == [["a1"], ["a2"]]  # rolling_batch 1
    cache = plans["a1"].spec.compile_cache(plans["a1"].spec.services[0])
    assert roll.spreads == (spread.Spread("a1", cache, plans["a1"].spec.services[0].image, 1, ("a2", "a3")),)


CLUSTER = {"cluster_nic": "eth0", "vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2, "nccl_ib_hca": "mlx5_0"}


def clusters(*names: str, **extra: Any) -> dict[str, dict[str, Any]]:
    """Two-node Ray clusters: ``<name>-head`` and ``<name>-worker`` for each name."""
    return {f"{name}-{role}": {**CLUSTER, **extra, "ray_cluster": name, "ray_role": role} for name in names for role in ("head", "worker")}


def test_each_node_of_a_cluster_sends_to_the_same_node_of_the_later_clusters() -> None:
    """A node builds its own ranks' kernels: the first cluster's head sends to the later heads, its worker to the later
    workers (the head restarts through its instance, a worker through Ray). Another configuration is its own group."""
    plans = serving({**clusters("c1", "c2", "c3"), **clusters("d1", vllm_args={"max-num-seqs": 64})})
    roll = plan_roll(plans)
    assert [sorted(u.name for u in b) for b in roll.batches][1:] == [["cluster c1"], ["cluster c2"], ["cluster c3"], ["cluster d1"]]
    svc = plans["c1-head"].spec.services[0]
    cache = plans["c1-head"].spec.compile_cache(svc)
    assert roll.spreads == (
        spread.Spread("c1-head", cache, svc.image, 1, ("c2-head", "c3-head")),
        spread.Spread("c1-worker", cache, svc.image, 1, ("c2-worker", "c3-worker")),
    )
    members = spread.groups(plans, roll.turns)
    assert sorted(unit for found in members.values() for _, host, unit, _ in found if host.startswith("c1")) == ["ray-worker", "vllm-main"]


def test_warm_leaves_clusters_to_the_deploy() -> None:
    """A cluster builds only by rolling as a whole: warm restarts no cluster and carries nothing between them."""
    plans = serving({**clusters("c1", "c2"), "a1": MAIN, "a2": MAIN})
    roll = plan_roll(plans, warm=True)
    assert sorted(h for b in roll.batches for u in b for h in u.hosts) == ["a1"]
    assert [(s.source, s.receivers) for s in roll.spreads] == [("a1", ("a2",))]
    assert {Journal(roll).outcome(h, set())[0] for h in ("c1-head", "c1-worker", "c2-head", "c2-worker")} == {"not-rolled"}


def test_warm_restarts_one_instance_per_configuration_and_fills_every_other_host() -> None:
    plans = serving({"a1": MAIN, "a2": MAIN, "a3": MAIN, "b1": {**MAIN, "vllm_args": {"max-num-seqs": 64}}})
    roll = plan_roll(plans, warm=True)
    assert sorted(h for b in roll.batches for u in b for h in u.hosts) == ["a1", "b1"]
    assert [(s.source, s.receivers) for s in roll.spreads] == [("a1", ("a2", "a3"))]
    assert roll.turns["a1"].pending == ("vllm-main",) and roll.turns["a1"].batch is not None
    for other in ("a2", "a3"):  # nothing of them restarts, no hook, no marker: their cache fills
        turn = roll.turns[other]
        assert turn.batch is None and turn.pending == () and not turn.rolling and not turn.busy
    run = FleetPlan.of(plans, warm=True).journal  # the run's journal follows the run's own (warm) roll
    assert run.plan == roll
    assert run.outcome("a2", set()) == run.outcome("a2", set(), ran=False) == ("not-rolled", WARM_LEFT)
    assert run.outcome("a1", set(), ran=False) == ("would-roll", "in batch 1; a dry run changed nothing")


def test_warm_builds_every_configuration_on_as_few_hosts_as_it_can() -> None:
    """a1 and a2 both serve main (one configuration); a1 also serves big, a2 also small. a1 builds main and big;
    a2 builds small alone and leaves its main, which a1 built, for the next deploy."""

    def host(other: str, seqs: int) -> dict[str, Any]:
        return {"vllm_instances": [{"name": "main", "gpus": [0]}, {"name": other, "gpus": [1], "args": {"max-num-seqs": seqs}}]}

    plans = serving({"a1": host("big", 64), "a2": host("small", 32), "a3": {"vllm_instances": [{"name": "main", "gpus": [0]}]}})
    roll = plan_roll(plans, warm=True)
    assert roll.turns["a1"].pending == ("vllm-main", "vllm-big") and roll.turns["a2"].pending == ("vllm-small",)
    assert roll.turns["a3"].batch is None
    assert [(s.source, s.receivers) for s in roll.spreads] == [("a1", ("a2", "a3"))]
    run = Journal(roll)
    for index in range(1, len(roll.batches)):
        assert run.proceeds(index, set())
    rows = {r["instance"]: (r["status"], r["why"]) for r in run.summary({"a2": ("vllm-main", "vllm-small")}, set())}
    assert rows["vllm-main"] == ("not-rolled", WARM_LEFT) and rows["vllm-small"][0] == "rolled"


def test_warm_never_builds_on_a_host_whose_docker_settings_change() -> None:
    """Restarting dockerd stops every container of the host, the ones warm leaves too: such a host only receives,
    and a configuration that only such hosts serve waits for the deploy."""
    plans = serving({"a1": MAIN, "a2": MAIN, "b1": {**MAIN, "vllm_args": {"max-num-seqs": 64}}})
    turns = {name: dataclasses.replace(turn, defers_docker=name in ("a1", "b1")) for name, turn in plan_roll(plans).turns.items()}
    members = spread.groups(plans, turns)
    sources = spread.warm_sources(members, turns)
    assert sources == {"a2": frozenset({"vllm-main"})}
    assert [(s.source, s.receivers) for s in spread.plan(members, sources, lambda _h: 1)] == [("a2", ("a1",))]


def test_the_summary_says_what_each_cache_did() -> None:
    plans = serving({"a1": MAIN, "a2": MAIN})
    roll = Journal(plan_roll(plans))
    roll.carried.note("a2", "compile cache from a1 refused: the copy's sha256 is 00, the source's ff (a partial or damaged copy)")
    rows = roll.summary({"a1": ("vllm-main",), "a2": ("vllm-main",)}, set())
    assert rows[1]["cache"] == ["compile cache from a1 refused: the copy's sha256 is 00, the source's ff (a partial or damaged copy)"]
    assert "a partial or damaged copy" in format_summary(rows)


def test_the_copies_run_as_function_commands_that_get_the_host() -> None:
    # pyinfra hands state and host to a FunctionCommand only when both parameters are named so.
    for function in (spread._pack, spread._receive):
        assert inspect.getfullargspec(function).args[:2] == ["state", "host"]


# (what differs from the base instance, its inventory, the env it adds in the container, one configuration or two)
VARIANTS: list[tuple[str, dict[str, Any], dict[str, str], bool]] = [
    ("another port", {"vllm_instances": [{"name": "main", "port": 9100}]}, {}, True),
    ("an API key (0.22.0 hashes VLLM_API_KEY)", {"vllm_api_key_path": "/etc/instinct-fleet/api-key"}, {"VLLM_API_KEY": "sk-1"}, False),
    ("another max-num-seqs", {"vllm_args": {"max-num-seqs": 64}}, {}, False),
    ("AITER off", {"vllm_env": {"VLLM_ROCM_USE_AITER": "0"}}, {}, False),
    ("a logging level (not hashed)", {"vllm_env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}, {}, True),
    ("a served name", {"vllm_args": {"served-model-name": "oss"}}, {}, False),
    ("uvicorn's log level (a server flag)", {"vllm_args": {"uvicorn-log-level": "warning"}}, {}, True),
]


def _standin_key(data: dict[str, Any], extra_env: dict[str, str]) -> tuple[str | None, str]:
    (spec, findings), *_ = plan_hosts([HostData("h1", (), {**MAIN, **data})])
    assert not [f for f in findings if f.severity == "error"], findings
    svc = spec.services[0]
    model, args = consumers.standin().parse(["serve", svc.model, *render_args(svc)])
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    with mock.patch.dict(os.environ, {**clean, **svc.env, **extra_env}, clear=True):
        return compile_config(svc, spec.vars.vllm_api_key_path), consumers.standin().compile_key(model, args)


@pytest.mark.parametrize("name, data, env, same", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_one_configuration_means_one_cache_key_to_the_stand_in(name: str, data: dict[str, Any], env: dict[str, str], same: bool) -> None:
    """Two instances the spreading counts as one configuration build the same cache entries in vLLM's stand-in
    (its key is vLLM's, from the version's compile factors); the spreading may split more, never less."""
    base_config, base_key = _standin_key({}, {})
    config, key = _standin_key(data, env)
    assert config is not None and base_config is not None
    assert (config == base_config) is same, name
    if same:
        assert key == base_key, name


class FakeHost:
    """What _pack and _receive use of a pyinfra host: shell commands (answered by ``answer``) and file transfers."""

    def __init__(self, name: str, answer: Any, get: Any = None, put: Any = None) -> None:
        self.name, self.answer, self.get, self.put = name, answer, get, put
        self.ran: list[str] = []

    def run_shell_command(self, command: Any, **_: Any) -> tuple[bool, Any]:
        text = str(command.get_raw_value() if hasattr(command, "get_raw_value") else command)
        self.ran.append(text)
        ok, out, err = self.answer(text)
        return ok, SimpleNamespace(stdout_lines=out, stderr_lines=err)

    def get_file(self, remote: str, local: str, **_: Any) -> bool:
        return bool(self.get(remote, local))

    def put_file(self, local: str, remote: str, **_: Any) -> bool:
        return bool(self.put(local, remote))


SPREAD = spread.Spread("s1", "/var/cache/instinct-fleet/compile/img_0123", "reg/vllm:v1", 1, ("r1", "r2"))
PAYLOAD = b"a packed cache"
SUM = hashlib.sha256(PAYLOAD).hexdigest()


def packer(ok: bool = True, said: tuple[str, ...] = ("id sha256:aaa", f"sha256 {SUM}", f"bytes {len(PAYLOAD)}")) -> Any:
    return lambda text: (
        (ok, list(said), [] if ok else ["not packed: the cache changed while it was read"]) if " pack " in text else (True, [], [])
    )


def test_a_source_keeps_only_a_copy_whose_sum_it_checked(tmp_path: Path) -> None:
    def fetched(data: bytes) -> Any:
        return lambda _remote, local: Path(local).write_bytes(data) or True

    carried = spread.Carried(_spool=tmp_path)
    host = FakeHost("s1", packer(), get=fetched(PAYLOAD))
    assert spread._pack(None, host, SPREAD, carried, {})
    assert carried.bundles[("s1", SPREAD.cache)].sha256 == SUM and carried.notes["s1"] == ["compile cache sent to 2 host(s) (0 KiB)"]
    assert any(cmd.startswith("rm -f") for cmd in host.ran)  # the host's packed copy does not stay behind
    assert carried.bundles[("s1", SPREAD.cache)].path.read_bytes() == PAYLOAD
    (tmp_path / "other").mkdir()
    damaged = spread.Carried(_spool=tmp_path / "other")
    assert spread._pack(None, FakeHost("s1", packer(), get=fetched(b"a packed cach")), SPREAD, damaged, {})
    assert not damaged.bundles and "does not match the source's sha256" in damaged.notes["s1"][0]
    assert not list((tmp_path / "other").iterdir())  # a copy that does not match is not kept on the control machine


def test_a_source_that_cannot_pack_or_send_only_says_why(tmp_path: Path) -> None:
    carried = spread.Carried(_spool=tmp_path)
    assert spread._pack(None, FakeHost("s1", packer(ok=False)), SPREAD, carried, {})
    assert carried.notes["s1"] == ["compile cache not sent: not packed: the cache changed while it was read"]

    def lost(_remote: str, _local: str) -> bool:
        raise EOFError

    host = FakeHost("s1", packer(), get=lost)
    assert spread._pack(None, host, SPREAD, carried, {})
    assert carried.notes["s1"][1] == "compile cache not sent: fetching it failed (EOFError)" and not carried.bundles
    assert any(cmd.startswith("rm -f") for cmd in host.ran)


def test_a_receiver_removes_a_copy_that_did_not_arrive_whole_and_reports_a_refusal(tmp_path: Path) -> None:
    bundle = tmp_path / "copy.tar"
    bundle.write_bytes(PAYLOAD)
    carried = spread.Carried(bundles={("s1", SPREAD.cache): spread.Bundle(bundle, SUM, len(PAYLOAD), "sha256:aaa")})
    assert spread._receive(None, FakeHost("r0", packer()), dataclasses.replace(SPREAD, source="s9"), 2, carried, {})
    assert carried.notes["r0"] == ["no compile cache from s9: it sent none (its row says why)"]

    def full(_local: str, _remote: str) -> bool:
        raise OSError(28, "No space left on device")

    host = FakeHost("r1", lambda text: (True, [], []), put=full)
    assert spread._receive(None, host, SPREAD, 2, carried, {})
    assert "not received: [Errno 28] No space left on device; the partial copy was removed" in carried.notes["r1"][0]
    assert host.ran[-1].startswith("rm -f ") and host.ran[-1].endswith(".tar")

    def refuses(text: str) -> tuple[bool, list[str], list[str]]:
        if " receive " in text:
            return False, [], ["refused: built with image sha256:aaa, and reg/vllm:v1 is sha256:bbb here"]
        return True, [], []

    assert spread._receive(None, FakeHost("r2", refuses, put=lambda *_: True), SPREAD, 2, carried, {})
    assert carried.notes["r2"] == ["compile cache from s1 refused: built with image sha256:aaa, and reg/vllm:v1 is sha256:bbb here"]
    merged = FakeHost("r3", lambda text: (True, ["moved 3"], []), put=lambda *_: True)
    assert spread._receive(None, merged, SPREAD, 2, carried, {})
    assert carried.notes["r3"] == ["compile cache from s1 received (0 KiB, 3 new entries)"]


def test_the_canary_host_is_measured_in_a_roll_and_warm_measures_nothing() -> None:
    """The canary is decided before each host's turn: the turn of the first restart batch's host is measured."""
    canaried = {"vllm_instances": [{"name": "main"}], "canary_profile": "seed-001-gpt-oss"}
    plans = serving({"a1": canaried, "a2": canaried})
    roll = plan_roll(plans)
    assert roll.canary_host == "a1" and roll.turns["a1"].measured and not roll.turns["a2"].measured
    warm = plan_roll(plans, warm=True)
    assert warm.canary_host is None and not any(t.measured for t in warm.turns.values())
