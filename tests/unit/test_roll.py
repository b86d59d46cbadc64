"""The roll: serving units classified from facts, batches, when the roll stops, the summary."""

from __future__ import annotations

import hashlib
import inspect
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from instinct_fleet.converge import preflight
from instinct_fleet.converge.health import Startup
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.roll import roll as rolling
from instinct_fleet.roll.plan import image_seeds, plan_inventory
from instinct_fleet.roll.roll import Journal, RollPlan, ServingUnit, batch_size, batches, format_summary, plan_roll
from instinct_fleet.roll.run import interrupt_handler
from tests.unit.files import docker_files, unit_files

from .test_preflight import docker_section, mi300x_host

DATA = {"vllm_instances": [{"name": "main"}]}


def sha(text: str | None) -> str:
    return hashlib.sha256((text or "").encode()).hexdigest()


def planned(files: str = "", active: str = "", units: str = "", name: str = "h1") -> HostPlan:
    report = preflight.parse_report(mi300x_host(files=files, active=active, units=units))
    return plan_inventory([HostData(name, (), DATA)], {name}, lambda specs: dict.fromkeys(specs, report))[name]


def deployed(plan: HostPlan, **overrides: str | None) -> str:
    """The `files` section of a host that holds exactly what ``plan`` renders, but for ``overrides``."""
    files = {path: content for unit in unit_files(plan).values() for path, content in unit.items()}
    files.update({p: c for p, c in docker_files(plan).items() if c is not None})
    files.update(overrides)
    return "\n".join(f"{sha(content)}  {path}" for path, content in files.items() if content is not None)


def test_a_fresh_host_starts_and_a_converged_host_is_unchanged() -> None:
    fresh = planned()
    assert rolling.kind(fresh) == "start" and rolling.docker_changed(fresh) and rolling.changed_units(fresh) == {"vllm-main"}
    same = planned(
        files=deployed(fresh), active="vllm-main.service loaded active running vLLM", units="/etc/systemd/system/vllm-main.service"
    )
    assert rolling.kind(same) == "unchanged" and not rolling.docker_changed(same) and not rolling.changed_units(same)


def test_a_changed_unit_that_serves_restarts_and_one_that_is_stopped_starts() -> None:
    fresh = planned()
    edited = deployed(fresh, **{"/etc/instinct-fleet/vllm-main.env": "OLD=1\n"})
    serving = planned(files=edited, active="vllm-main.service loaded active running x", units="/etc/systemd/system/vllm-main.service")
    assert rolling.kind(serving) == "restart" and rolling.changed_units(serving) == {"vllm-main"} and not rolling.defers_docker(serving)
    stopped = planned(files=edited, units="/etc/systemd/system/vllm-main.service")
    assert rolling.kind(stopped) == "start"


def test_new_docker_settings_on_a_serving_host_wait_for_its_batch() -> None:
    fresh = planned()
    plan = planned(
        files=deployed(fresh, **{"/etc/docker/daemon.json": "{}\n"}),
        active="vllm-main.service loaded active running x",
        units="/etc/systemd/system/vllm-main.service",
    )
    assert rolling.kind(plan) == "restart" and rolling.defers_docker(plan) and not rolling.changed_units(plan)


def test_a_stale_running_unit_makes_its_host_roll() -> None:
    fresh = planned()
    plan = planned(files=deployed(fresh), active="vllm-old.service loaded active running x", units="/etc/systemd/system/vllm-old.service")
    assert plan.stale_units == ["vllm-old"] and rolling.kind(plan) == "restart"


@pytest.mark.parametrize(
    ("setting", "units", "size"), [(1, 10, 1), (3, 10, 3), ("25%", 10, 2), ("25%", 3, 1), ("100%", 7, 7), ("1%", 50, 1)]
)
def test_batch_size_is_a_count_or_a_percentage_rounded_down_at_least_one(setting: int | str, units: int, size: int) -> None:
    assert batch_size(setting, units) == size


def units(**kinds: str) -> list[ServingUnit]:
    return [ServingUnit(name, (name,), kind) for name, kind in kinds.items()]  # type: ignore[arg-type]


def test_starts_go_first_together_then_restarts_in_name_order() -> None:
    fleet = units(c="restart", a="restart", b="start", d="unchanged", e="start", f="restart")
    assert [[u.name for u in batch] for batch in batches(fleet, 2)] == [["b", "e"], ["a", "c"], ["f"]]


def journal(fleet: list[ServingUnit], size: int = 1, max_failures: int = 0, canary: bool = False, **plan: Any) -> Journal:
    """The run journal of a roll of ``fleet`` in batches of ``size`` (``canary``: its first restart alone)."""
    return Journal(RollPlan(tuple(fleet), tuple(map(tuple, batches(fleet, size, canary=canary))), max_failures, **plan))


def roll(max_failures: int = 0, **plan: Any) -> Journal:
    return journal(units(a="restart", b="restart", c="restart", d="unchanged"), max_failures=max_failures, **plan)


def test_the_roll_stops_when_more_batches_failed_than_allowed() -> None:
    r = roll()
    assert r.proceeds(0, set()) and r.proceeds(1, set())
    assert not r.proceeds(2, {"a"})  # batch 1 (a) failed while it ran
    assert r.outcome("a", {"a"})[0] == "failed"
    status, why = r.outcome("b", {"a"})
    assert status == "not-rolled" and "stopped after batch 1" in why
    assert r.outcome("d", {"a"}) == ("unchanged", "")


def test_a_dry_run_says_what_would_roll_not_that_the_roll_stopped() -> None:
    r = roll()  # no batch ever opened: pyinfra's --dry ran no operation
    assert r.outcome("a", set(), ran=False) == ("would-roll", "in batch 1; a dry run changed nothing")
    assert r.outcome("d", set(), ran=False) == ("unchanged", "")
    assert r.outcome("b", {"b"}, ran=False)[0] == "not-rolled"  # a host that failed (preflight, unreachable) still says so


def test_a_failure_allowance_lets_the_roll_go_on() -> None:
    r = roll(max_failures=1)
    assert r.proceeds(0, set()) and r.proceeds(1, set()) and r.proceeds(2, {"a"})
    assert not r.proceeds(3, {"a", "b"})
    assert r.outcome("c", {"a", "b"})[0] == "not-rolled"


def test_a_host_that_failed_before_its_batch_does_not_fail_the_batch() -> None:
    r = roll()
    assert r.proceeds(0, {"b"}) and r.proceeds(1, {"b"})  # b failed at the pre-pull, before batch 2
    assert r.proceeds(2, {"b"}) and r.proceeds(3, {"b"})
    assert r.outcome("b", {"b"})[0] == "not-rolled"  # its batch opened, but it had failed before
    assert r.outcome("c", {"b"}) == ("rolled", "batch 3")


def test_a_failed_gate_rolls_its_batch_back_and_stops_the_roll() -> None:
    r = roll(on_failure="rollback")
    assert r.proceeds(0, set()) and r.proceeds(1, set())
    r.hold("a", "vllm-main: not healthy on :8000: unit restarted while starting (crash loop)")
    r.targets["a"] = 4
    assert r.rolls_back(1, set()) and not r.rolls_back(0, set())  # batch 0 only started units: nothing to go back to
    assert not r.proceeds(2, set())  # a gate that failed fails its batch, though pyinfra has not failed the host yet
    assert r.back("a") and not r.back("b")  # only the host whose own gate failed fails after its rollback
    status, why = r.outcome("a", {"a"})
    assert status == "rolled-back" and "crash loop" in why and "generation 4" in why and "differs from the inventory" in why
    assert r.outcome("c", {"a"})[0] == "not-rolled"


def test_a_rollback_that_did_not_complete_is_a_failure_and_stop_mode_never_rolls_back() -> None:
    r = roll(on_failure="rollback")
    r.proceeds(0, set())
    r.proceeds(1, set())
    r.hold("a", "vllm-main: not healthy")
    assert r.rolls_back(1, set())
    status, why = r.outcome("a", {"a"})  # its restore failed the host before the operation after it ran
    assert status == "failed" and "did not complete" in why
    stop = roll()
    stop.proceeds(0, set())
    stop.proceeds(1, set())
    assert not stop.rolls_back(1, {"a"}) and stop.outcome("a", {"a"})[0] == "failed"


def test_the_summary_lists_every_host_and_instance_with_why() -> None:
    r = roll()
    r.proceeds(0, set())
    r.proceeds(1, set())
    r.note("a", "vllm-main: not healthy on :8000: unit restarted while starting (crash loop)")
    rows = r.summary({"a": ("vllm-main",), "b": ("vllm-x", "vllm-y"), "d": ()}, {"a"})
    assert [(row["host"], row["instance"], row["status"]) for row in rows] == [
        ("a", "vllm-main", "failed"),
        ("b", "vllm-x", "not-rolled"),
        ("b", "vllm-y", "not-rolled"),
        ("d", "-", "unchanged"),
    ]
    text = format_summary(rows)
    assert "crash loop" in text and text.startswith("Roll summary:")


def test_the_summary_says_how_each_unit_started() -> None:
    """The health gate hands the roll each unit's start (health.Startup): the row carries it, the table says it."""
    r = roll()
    r.proceeds(0, set())
    r.started("b", "vllm-x.service", Startup(63.4, 41.5, 7.25, 12.0, "cold"))
    rows = r.summary({"b": ("vllm-x", "vllm-y")}, set())  # a host's serving units, by unit name
    assert [row["start"] for row in rows] == [
        {"seconds": 63.4, "weights": 41.5, "compile": 7.25, "graph_capture": 12.0, "cache": "cold"},
        None,  # vllm-y did not start in this roll
    ]
    assert "started in 63.4 s, cold (weights 41.5 s, compile 7.25 s, graph capture 12 s)" in format_summary(rows)


def test_plan_roll_makes_a_cluster_one_serving_unit_with_the_head_first() -> None:
    cluster = {"ray_cluster": "c", "cluster_nic": "eth0", "vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2, "nccl_ib_hca": "mlx5_0"}
    hosts = [
        HostData("w1", (), {**cluster, "ray_role": "worker"}),
        HostData("head", (), {**cluster, "ray_role": "head"}),
        HostData("solo", (), DATA),
    ]
    eth = "1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet {}/16 brd 172.17.255.255 scope global eth0"
    reports = {
        name: preflight.parse_report(mi300x_host(interfaces=eth.format(ip), units=""))
        for name, ip in (("w1", "10.0.0.2"), ("head", "10.0.0.1"), ("solo", "10.0.0.3"))
    }
    plans = plan_inventory(hosts, {"w1", "head", "solo"}, lambda specs: {n: reports[n] for n in specs})
    r = plan_roll(plans)
    assert sorted((u.name, u.hosts, u.kind) for u in r.units) == [("cluster c", ("head", "w1"), "start"), ("solo", ("solo",), "start")]
    assert list(r.batches[0]) == sorted(r.units, key=lambda u: u.name)


def test_control_hooks_run_with_the_roll_env_and_fail_their_host_with_its_words(tmp_path: Path) -> None:
    from instinct_fleet.converge import operations

    # pyinfra hands state and host to a FunctionCommand only when both parameters are named so.
    assert inspect.getfullargspec(operations._control_hook).args[:2] == ["state", "host"]
    host = SimpleNamespace(name="h1", print_prefix="[h1] ")
    notes: list[tuple[str, str]] = []
    out = tmp_path / "out"
    env = {"INSTINCT_FLEET_HOST": "h1"}
    assert operations._control_hook(None, host, f'echo "$INSTINCT_FLEET_HOST" > {out}', env, lambda *n: notes.append(n))
    assert out.read_text() == "h1\n" and not notes
    assert not operations._control_hook(None, host, "echo drained badly >&2; exit 3", env, lambda *n: notes.append(n))
    assert notes == [("h1", "rolling hook on the control machine exited 3: 'echo drained badly >&2; exit 3': drained badly")]


def test_one_host_per_missing_image_pulls_first() -> None:
    """The seed fills a pull-through cache; hosts that have the image, or failed preflight, are never seeds."""
    report = preflight.parse_report(mi300x_host())
    (spec, _), *_ = plan_hosts([HostData("gpu-1", (), DATA)])
    have = preflight.parse_report(mi300x_host(docker=docker_section({spec.services[0].image: "sha256:" + "b" * 64})))
    hosts = [HostData(n, (), DATA) for n in ("gpu-3", "gpu-1", "gpu-2")]
    hosts.append(HostData("other", (), {**DATA, "vllm_image": "vllm/vllm-openai-rocm:v0.22.0-rc2"}))
    reports = {"gpu-1": have, "gpu-2": report, "gpu-3": report, "other": report}
    plans = plan_inventory(hosts, {h.name for h in hosts}, lambda specs: {n: reports[n] for n in specs})
    assert image_seeds(plans) == {"gpu-2", "other"}


def test_an_interrupt_lets_the_open_batch_finish_and_opens_no_other() -> None:
    fleet = units(a="restart", b="restart", c="unchanged")
    r = journal(fleet)
    assert r.proceeds(1, set()) and r.current == 1
    r.interrupted = "SIGINT"
    assert r.proceeds(1, set())  # batch 1 is open: its operations, health gate included, go on
    assert not r.proceeds(2, set()) and r.current == 1
    assert r.finish() and r.current is None
    assert not r.skipped("a") and r.skipped("b") and not r.skipped("c")
    assert r.outcome("a", set()) == ("rolled", "batch 1")
    status, why = r.outcome("b", {"b"})
    assert status == "interrupted" and "SIGINT before its batch 2" in why and "keeps its old configuration" in why
    assert r.outcome("c", set())[0] == "unchanged"


def test_the_signal_handler_defers_inside_a_batch_and_stops_outside_one() -> None:
    fleet = units(a="restart", b="restart")
    r = journal(fleet)
    handle = interrupt_handler(r)
    with pytest.raises(SystemExit) as stopped:  # no batch open: stop now, non-zero
        handle(signal.SIGTERM, None)
    assert stopped.value.code == 128 + signal.SIGTERM and r.interrupted == "SIGTERM"
    r = journal(fleet)
    handle = interrupt_handler(r)
    assert r.proceeds(1, set())
    handle(signal.SIGINT, None)  # inside batch 1: deferred
    assert r.interrupted == "SIGINT" and not r.proceeds(2, set())
    with pytest.raises(SystemExit) as again:  # a second signal stops at once
        handle(signal.SIGINT, None)
    assert again.value.code == 128 + signal.SIGINT


def test_each_host_s_turn_is_decided_at_plan_time_from_its_facts() -> None:
    """The serving stage only acts on its turn: what restarts, whether docker waits, the canary and the marker."""
    fresh = planned(name="fresh")
    serving = planned(
        files=deployed(fresh, **{"/etc/docker/daemon.json": "{}\n"}),
        active="vllm-main.service loaded active running x\nvllm-old.service loaded active running x",
        units="/etc/systemd/system/vllm-main.service\n/etc/systemd/system/vllm-old.service",
        name="serving",
    )
    same = planned(
        files=deployed(fresh),
        active="vllm-main.service loaded active running vLLM",
        units="/etc/systemd/system/vllm-main.service",
        name="same",
    )
    turns = rolling.plan_roll({"fresh": fresh, "serving": serving, "same": same}).turns
    assert set(turns) == {"fresh", "serving", "same"}
    # A fresh host starts its unit in batch 0; nothing of it serves, so docker's settings need not wait.
    assert turns["fresh"].pending == ("vllm-main",) and not turns["fresh"].rolling and not turns["fresh"].defers_docker
    # docker's new settings on a serving host: every unit restarts in its batch, the stale one stops, the marker goes up.
    mine = turns["serving"]
    assert mine.rolling and mine.force and mine.defers_docker and mine.batch == 1 and mine.busy
    assert mine.pending == ("vllm-main",) and mine.stale == ("vllm-old",)
    # A host whose serving files match is in no restart batch; docker's settings do not wait for one.
    assert turns["same"].batch == 0 and not turns["same"].rolling and not turns["same"].force and not turns["same"].defers_docker
