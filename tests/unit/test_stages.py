"""Stage decisions on fixtures: for each stage, (spec, fact) gives the operations it emits.

Three cases per stage, as pyinfra tests its own operations: a fresh host (the
first deploy), the same host after that deploy succeeded (every stage emits
nothing; the roll only its batch barrier), and one drift that the stage alone
repairs, with exactly the operations the repair needs.
"""

from __future__ import annotations

import functools
from typing import Any, cast, get_args

import pytest
from hypothesis import event

from instinct_fleet.converge import entries, managed
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.state import Action, Roll, Run, Stage
from instinct_fleet.model import paths
from tests.unit import smi
from tests.unit.stages import STAGES, SimHost, declared, deploy, drifted, emitted, plan, run_stage
from tests.unit.test_consumers import CLUSTER, EXAMPLES, assert_reached

# The roll's own steps, without the canary's (the default canary: test_the_default_canary_measures_a_retune_...).
DATA: dict[str, Any] = {"vllm_allow_from": ["10.0.0.0/8"], "metrics_exporter": True, "canary_profile": None}
GRUB = f"GRUB drop-in: {' '.join(paths.KERNEL_ARGS)}"

# After a unit's files are written: what brings vllm-main back and ends the host's turn in the roll.
RESTART = [
    "Reload systemd (serving units)",
    "Restart vllm-main for its new configuration",
    "vllm-main running and enabled",
    "vllm-main healthy",
]


def restart(generation: int) -> list[str]:
    """A unit's restart, ending with its new files kept as the healthy ``generation``."""
    return [*RESTART, f"Roll: keep the new serving files as generation {generation} (healthy)", "Roll: done on this host"]


def fresh(stage: str, host_plan: HostPlan) -> list[str]:
    """What a fresh host gets of ``stage``: the writes of its declared entries (:func:`declared`, derived from the
    declaration) between the operations a stage runs of its own and the actions those writes ask for, here by hand."""
    d = functools.partial(declared, host_plan)
    return {
        "preflight": [],
        "tuning": [
            "Install missing packages",
            *d("tuning"),
            "Regenerate the GRUB configuration",
            f"Restart {paths.CPU_IDLE_UNIT} for its new configuration",
            f"{paths.CPU_IDLE_UNIT} enabled",
        ],
        "runtime": [
            *d("runtime"),
            *d("docker"),
            "Restart docker for its new configuration",
            "docker running and enabled",
            *d("pull"),
            "Image: the first pull of each image is done",
        ],
        "weights": d("weights"),
        "cluster": d("cluster"),
        "firewall": [*d("firewall"), f"Reload {paths.FIREWALL_UNIT}", f"{paths.FIREWALL_UNIT} running and enabled"],
        "exporter": [
            *d("exporter"),
            f"Restart {paths.EXPORTER_UNIT} for its new configuration",
            f"{paths.EXPORTER_UNIT} running and enabled",
        ],
        "router": d("router"),  # not a router host: nothing
        "services": [
            *d("services"),
            f"Restart {paths.WATCH_UNIT} for its new configuration",
            f"{paths.WATCH_UNIT} running and enabled",
            "Roll: batch 0",
            "Roll: mark the host as rolling",
            *[n for n in d("roll") if not n.startswith("Reload systemd")],
            *restart(1),
        ],
        "health": ["vllm-main healthy"],
    }[stage]


def test_the_declared_writes_of_a_fresh_host_are_every_entry_with_content() -> None:
    """What :func:`fresh` derives is the declaration itself: every file and directory a fresh host gets, once."""
    host_plan = plan(DATA, SimHost())
    names = [n for stage in get_args(Stage) for n in declared(host_plan, stage)]
    want = host_plan.desired
    assert {f.label for f in want.files if f.content is not None} | {d.label for d in want.directories} <= set(names)
    assert "Watch: the GPU evidence and its rules" in names and f"Operator's README {paths.HOST_README}" in names


def converged(monkeypatch: pytest.MonkeyPatch, data: dict[str, Any]) -> SimHost:
    """A host after one deploy of ``data`` succeeded: what every stage emitted, replayed. Read back, nothing
    declared differs: an entry that no stage converges would (the stages run as instinct_fleet.deploys runs them)."""
    sim = SimHost()
    deploy(monkeypatch, plan(data, sim), sim)
    assert drifted(plan(data, sim)) == []
    return sim


@pytest.mark.parametrize("stage", STAGES)
def test_a_fresh_host_gets_the_whole_stage(monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    host_plan = plan(DATA, SimHost())
    assert emitted(monkeypatch, stage, host_plan) == fresh(stage, host_plan)


@pytest.mark.parametrize("stage", STAGES)
def test_a_converged_host_gets_nothing(monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    """Read back through the probe: a managed path the probe missed would show here as drift. Not even the roll's
    barrier: nothing in the fleet rolls, so there is no batch to walk (a no-op run is one fact per host)."""
    again = plan(DATA, converged(monkeypatch, DATA))
    assert emitted(monkeypatch, stage, again) == []


def only(monkeypatch: pytest.MonkeyPatch, data: dict[str, Any], sim: SimHost, **sections: str) -> dict[str, list[str]]:
    """What each stage emits for this host, leaving out the stages that emit nothing."""
    host_plan = plan(data, sim, **sections)
    return {s: ops for s in STAGES if (ops := emitted(monkeypatch, s, host_plan))}


def test_tuning_repairs_the_sysctl_file_and_the_live_value(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    content, _, owner, group = sim.files[paths.SYSCTL_FILE]
    sim.files[paths.SYSCTL_FILE] = (content, "600", owner, group)
    sim.numa_balancing = "1"
    assert only(monkeypatch, DATA, sim) == {"tuning": ["NUMA balancing off now", "NUMA balancing off at boot"]}


def test_tuning_enables_a_disabled_cpu_idle_unit_without_rewriting_it(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    sim.enabled.discard(paths.CPU_IDLE_UNIT)
    assert only(monkeypatch, DATA, sim) == {"tuning": [f"{paths.CPU_IDLE_UNIT} enabled"]}


def test_runtime_restarts_docker_for_new_settings_on_a_host_that_serves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    sim.active.discard("vllm-main")
    sim.healthy.clear()
    sim.files[paths.DAEMON_JSON] = (b"{}\n", "644", "root", "root")
    found = only(monkeypatch, DATA, sim)
    assert found["runtime"] == [  # daemon.json is no unit file: systemd has nothing to reload
        f"docker settings {paths.DAEMON_JSON}",
        "Restart docker for its new configuration",
        "docker running and enabled",
    ]
    assert "Restart vllm-main for its new configuration" in found["services"]  # started in batch 0, after docker


def test_new_docker_settings_on_a_serving_host_wait_for_its_roll_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    sim.files[paths.DAEMON_JSON] = (b"{}\n", "644", "root", "root")
    found = only(monkeypatch, DATA, sim)
    assert "runtime" not in found  # restarting dockerd now would stop every container before the roll
    assert found["services"] == [
        "Roll: batch 0",
        "Roll: batch 1",
        "Roll: mark the host as rolling",
        f"docker settings {paths.DAEMON_JSON}",
        "Restart docker for its new configuration",
        "docker running and enabled",
        "Restart vllm-main for its new configuration",
        "vllm-main running and enabled",
        "vllm-main healthy",
        "Roll: done on this host",
    ]


def test_cluster_rewrites_a_lost_readiness_script(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = {"ray_cluster": "c", "cluster_nic": "eth0", "vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2}
    worker, head = {**cluster, "ray_role": "worker"}, {"h2": {**cluster, "ray_role": "head"}}
    sim = SimHost()
    fresh = plan(worker, sim, head)
    assert fresh.ok and emitted(monkeypatch, "cluster", fresh) == ["Shared Ray session directory", "Ray readiness script"]
    deploy(monkeypatch, fresh, sim)
    assert emitted(monkeypatch, "cluster", plan(worker, sim, head)) == []
    del sim.files[paths.RAY_READY_SCRIPT]
    assert emitted(monkeypatch, "cluster", plan(worker, sim, head)) == ["Ray readiness script"]


def test_firewall_reloads_a_table_flushed_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    sim.tables.clear()
    assert only(monkeypatch, DATA, sim) == {"firewall": [f"Reload {paths.FIREWALL_UNIT}", f"{paths.FIREWALL_UNIT} running and enabled"]}


def test_exporter_restarts_for_a_new_config_and_is_removed_when_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    content, mode, owner, group = sim.files[paths.EXPORTER_CONFIG]
    sim.files[paths.EXPORTER_CONFIG] = (content + b" ", mode, owner, group)
    assert only(monkeypatch, DATA, sim) == {
        "exporter": [  # the unit file is as it was: nothing to verify, nothing for systemd to reload
            f"Metrics exporter {paths.EXPORTER_CONFIG}",
            f"Restart {paths.EXPORTER_UNIT} for its new configuration",
            f"{paths.EXPORTER_UNIT} running and enabled",
        ]
    }
    off = {**DATA, "metrics_exporter": False}
    assert only(monkeypatch, off, converged(monkeypatch, DATA))["exporter"] == [
        f"Stop {paths.EXPORTER_UNIT} (metrics_exporter is off)",
        f"Metrics exporter {paths.unit_path(paths.EXPORTER_UNIT)}",
        f"Metrics exporter {paths.EXPORTER_CONFIG}",
        "Reload systemd (metrics exporter)",
    ]
    gone = converged(monkeypatch, DATA)
    deploy(monkeypatch, plan(off, gone), gone)
    assert only(monkeypatch, off, gone) == {}


def test_services_rolls_an_edited_unit_and_removes_a_stale_one(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    unit = paths.unit_path("vllm-main")
    content, mode, owner, group = sim.files[unit]
    sim.files[unit] = (content + b"# hand edit\n", mode, owner, group)
    sim.files[paths.unit_path("vllm-ghost")] = (b"# Managed by instinct-fleet\n[Service]\n", "644", "root", "root")
    sim.active.add("vllm-ghost")
    sim.enabled.add("vllm-ghost")
    assert only(monkeypatch, DATA, sim) == {
        "services": [
            "Roll: batch 0",
            "Roll: batch 1",
            "Roll: mark the host as rolling",
            "Roll: keep the serving files as generation 2 (healthy)",
            "Stop vllm-ghost (no longer in the inventory)",
            "vllm-main unit",
            "Remove vllm-ghost",
            "vllm-main passes systemd-analyze verify",
            *restart(3),
        ]
    }


def test_the_default_canary_measures_a_retune_and_a_first_deploy_says_it_has_nothing_to_compare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user who sets nothing gets the canary: the built-in profile and the accuracy probe before the unit stops and
    after its gate; the first deploy starts the unit with no canary (nothing served before) and the summary says so."""
    default = {k: v for k, v in DATA.items() if k != "canary_profile"}
    sim = SimHost()
    first = plan(default, sim)
    assert first.ok and "Canary" not in " ".join(o for ops in only(monkeypatch, default, sim).values() for o in ops)
    sim = converged(monkeypatch, default)
    retune = {**default, "vllm_args": {"max-num-seqs": 192}}
    ops = only(monkeypatch, retune, sim)["services"]
    before, after = "Canary: canary before the change, and the accuracy probe", "Canary: canary after the change, and the accuracy probe"
    assert ops.index(before) < ops.index("vllm-main unit") < ops.index("vllm-main healthy") < ops.index(after), ops


def test_a_marker_left_by_a_failed_roll_goes_once_the_host_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    sim.files[paths.ROLL_MARKER] = (b"roll batch 1 started\n", "644", "root", "root")
    assert only(monkeypatch, DATA, sim) == {"services": ["Roll: done on this host"]}


def test_weights_copies_a_model_lost_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    data = {**DATA, "weights_source": "/mnt/models"}
    sim = converged(monkeypatch, data)
    assert only(monkeypatch, data, sim) == {}
    (source,) = sim.weights
    sim.weights[source] = (sim.weights[source][0], "")
    assert only(monkeypatch, data, sim) == {"weights": ["Copy openai/gpt-oss-120b into the Hugging Face cache"]}


def test_health_waits_for_an_instance_that_did_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    sim.healthy.clear()
    found = only(monkeypatch, DATA, sim)
    assert found["health"] == ["vllm-main healthy"]


def test_preflight_fails_a_host_without_its_driver_and_nothing_else_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    host_plan = plan(DATA, converged(monkeypatch, DATA), kfd="")
    assert emitted(monkeypatch, "preflight", host_plan) == ["Preflight"]
    assert [e.rule for e in host_plan.errors] == ["host-driver"]
    # A deploy.py that calls the stages one by one: each skips the host that failed preflight.
    assert {stage: run_stage(monkeypatch, stage, host_plan, called=True) for stage in STAGES[1:]} == {s: [] for s in STAGES[1:]}


def test_every_accepted_spec_converges_to_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over generated specs (the consumer property's): after a deploy that succeeded, read back through the
    probe, no stage has anything to do. A declared entry the probe cannot see would break this. At least
    READERS_FLOOR of the examples must get past validation, so that the property is tried, not skipped."""

    def converges(data: dict[str, Any]) -> bool:
        peers = None
        if "ray_cluster" in data:
            data = {k: v for k, v in data.items() if k != "vllm_instances"}
            data = {**data, **CLUSTER, "vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2, "ray_role": "head"}
            peers = {"h2": {**data, "ray_role": "worker"}}
        sim = SimHost()
        fresh = plan(data, sim, peers, api_key="600|root|33")
        if not fresh.ok:
            event("refused")
            return False
        event("accepted")
        deploy(monkeypatch, fresh, sim)
        again = plan(data, sim, peers, api_key="600|root|33")
        assert drifted(again) == []
        assert {s: ops for s in STAGES if (ops := emitted(monkeypatch, s, again))} == {}
        return True

    assert_reached(converges, EXAMPLES, "converged")


def test_an_interrupt_before_the_host_s_batch_rolls_nothing_and_fails_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT before the roll: no batch opens, nothing restarts, and the host fails as interrupted (a non-zero exit)."""
    sim = converged(monkeypatch, DATA)
    unit = paths.unit_path("vllm-main")
    content, mode, owner, group = sim.files[unit]
    sim.files[unit] = (content + b"# changed\n", mode, owner, group)
    assert emitted(monkeypatch, "services", plan(DATA, sim), interrupted="SIGINT") == [
        "Roll: batch 0",
        "Roll: batch 1",
        "Roll: interrupted before this host's batch",
    ]
    assert "Roll: interrupted before this host's batch" not in emitted(monkeypatch, "services", plan(DATA, sim))


RETUNE = {**DATA, "vllm_args": {"max-num-seqs": 192}}
ROLLED = ["Roll: batch 0", "Roll: batch 1", "Roll: mark the host as rolling", "vllm-main unit", "vllm-main passes systemd-analyze verify"]


def test_a_retune_that_fails_its_gate_goes_back_to_the_healthy_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The files running now are generation 1 (healthy): nothing is kept before the change, and a gate that
    fails puts generation 1 back, gates it again, then fails the host; the new files are never kept."""
    sim = converged(monkeypatch, DATA)
    assert sim.healthy_generation == 1
    assert emitted(monkeypatch, "services", plan(RETUNE, sim), sick={"vllm-main.service": 1}) == [
        *ROLLED,
        *RESTART,
        "Roll: back to generation 1",
        "vllm-main healthy",
        "Roll: rolled back",
    ]
    # The same gate passing: the new files become generation 2, the healthy one.
    assert emitted(monkeypatch, "services", plan(RETUNE, sim)) == [*ROLLED, *restart(2)]


def test_files_changed_since_the_healthy_generation_are_kept_first_and_are_where_a_rollback_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = converged(monkeypatch, DATA)
    unit = paths.unit_path("vllm-main")
    content, mode, owner, group = sim.files[unit]
    sim.files[unit] = (content + b"# tuned by hand, and answering\n", mode, owner, group)
    ops = emitted(monkeypatch, "services", plan(RETUNE, sim), sick={"vllm-main.service": 1})
    assert ops[:4] == [*ROLLED[:3], "Roll: keep the serving files as generation 2 (healthy)"]
    assert ops[-3:] == ["Roll: back to generation 2", "vllm-main healthy", "Roll: rolled back"]


def test_a_failed_gate_with_no_healthy_generation_fails_and_stop_mode_rolls_nothing_back(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    sim.generations.clear()  # deployed before generations existed, and not answering now
    sim.healthy_generation = None
    sim.healthy.clear()
    ops = emitted(monkeypatch, "services", plan(RETUNE, sim), sick={"vllm-main.service": 1})
    assert "Roll: keep the serving files as generation 1 (not healthy at preflight)" in ops
    assert ops[-2:] == ["vllm-main healthy", "Roll: roll back"]
    stop = {**RETUNE, "rolling_on_failure": "stop"}
    ops = emitted(monkeypatch, "services", plan(stop, converged(monkeypatch, DATA)), sick={"vllm-main.service": 1})
    assert not any(op.startswith(("Roll: back", "Roll: roll", "Roll: rolled")) for op in ops), ops


def test_a_rollback_puts_the_previous_generation_back_through_the_roll(monkeypatch: pytest.MonkeyPatch) -> None:
    """instinct-fleet rollback after a re-tune: generation 1's files are what the roll writes, behind the gate;
    then the old inventory is a no-op (the host is byte for byte what it deployed)."""
    sim = converged(monkeypatch, DATA)
    before = dict(sim.files)
    deploy(monkeypatch, plan(RETUNE, sim), sim)  # the re-tune passed: generation 2 is the healthy one
    assert (sim.healthy_generation, sorted(sim.generations)) == (2, [1, 2])
    back = plan(RETUNE, sim, restore="previous")
    assert back.ok, back.errors
    assert emitted(monkeypatch, "services", back) == [*ROLLED, *restart(3)]
    deploy(monkeypatch, back, sim)
    assert {p: c for p, (c, *_r) in sim.files.items()} == {p: c for p, (c, *_r) in before.items()}
    assert {s: ops for s in STAGES if (ops := emitted(monkeypatch, s, plan(DATA, sim)))} == {}


def test_a_rollback_to_a_generation_the_host_lacks_fails_that_host_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = converged(monkeypatch, DATA)
    (problem,) = plan(DATA, sim, restore="7").errors
    assert problem.rule == "host-generation" and "no generation 7 on this host (generations: 1; healthy: 1)" in problem.message
    # Without an older generation that passed the gate (a host the change did not touch), "previous"
    # leaves the host as it is: no error, nothing to do.
    stays = plan(DATA, sim, restore="previous")
    assert stays.ok and emitted(monkeypatch, "services", stays) == []
    more = {**DATA, "vllm_instances": [{"name": "main"}, {"name": "other", "port": 8001, "gpus": [1]}]}
    (problem,) = plan(more, sim, restore="1").errors
    assert "generation 1 holds vllm-main.env, vllm-main.service, the inventory's serving units need" in problem.message


@pytest.mark.parametrize("stage", [s for s in get_args(Stage) if s != "pull"])
def test_a_new_entry_is_converged_by_the_stage_it_names_with_no_other_edit(monkeypatch: pytest.MonkeyPatch, stage: Stage) -> None:
    """Adding a managed file is its entry (and its template): the stage it names writes it, runs what it asks
    for, and the next run leaves it alone. No task file, harness or list of expected operations changes."""
    then: tuple[Action, ...] = (Roll("vllm-main"),) if stage == "roll" else (Run("Tell the operator", "true"),)
    extra = entries.FileEntry(f"{paths.CONFIG_DIR}/extra-{stage}", stage, f"extra file of {stage}", lambda _r: b"x\n", then=then)
    declare = managed.declare
    monkeypatch.setattr(managed, "declare", lambda spec: (*declare(spec), extra))
    first = STAGES[STAGES.index({"docker": "runtime", "roll": "services"}.get(stage, stage))]
    ops = emitted(monkeypatch, first, plan(DATA, SimHost()))
    assert extra.label in ops and ("Restart vllm-main for its new configuration" if stage == "roll" else "Tell the operator") in ops
    sim = converged(monkeypatch, DATA)
    assert sim.files[extra.path][0] == b"x\n"
    assert only(monkeypatch, DATA, sim) == {}


def test_an_entry_no_stage_converges_fails_the_harness(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check the test above relies on has teeth: an entry of a stage no task converges stays drifted."""
    orphan = entries.FileEntry(f"{paths.CONFIG_DIR}/orphan", cast(Stage, "nowhere"), "orphan", lambda _r: b"x\n")
    declare = managed.declare
    monkeypatch.setattr(managed, "declare", lambda spec: (*declare(spec), orphan))
    with pytest.raises(AssertionError, match="orphan"):
        converged(monkeypatch, DATA)


def test_the_watch_switched_off_is_stopped_and_its_files_removed_then_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    off = {**DATA, "watch": False}
    sim = converged(monkeypatch, DATA)
    removed = declared(plan(off, sim), "services")
    assert only(monkeypatch, off, sim)["services"] == [f"Stop {paths.WATCH_UNIT} (watch is off)", *removed]
    watch_files = [e.label for e in managed.watch_entries(plan(DATA, sim).spec) if isinstance(e, entries.FileEntry) and not e.directory]
    assert removed == [*watch_files, "Reload systemd (services)"]
    gone = converged(monkeypatch, DATA)
    deploy(monkeypatch, plan(off, gone), gone)
    assert only(monkeypatch, off, gone) == {}


def test_a_gpu_in_error_stops_its_instance_once_keeps_its_files_and_the_roll_starts_it_when_the_evidence_clears(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quarantine is planned like any state: stopped and recorded once, nothing on the next run, back in the
    roll's batch (behind its gate) once amd-smi shows the GPU clean."""
    sim = converged(monkeypatch, DATA)
    files = sim.serving_files()
    bad = smi.sections({"gpus": {"0": {"uncorrectable": 3}}})
    held = only(monkeypatch, DATA, sim, **bad)
    assert held["services"] == [
        "Stop vllm-main (quarantined: GPU 0: 3 uncorrectable ECC error(s) (blocks: UMC 3): read them "
        "with `amd-smi metric --ecc --ecc-blocks`; the counters clear at a GPU reset or reboot, and the next deploy re-admits it "
        "[gpu-ecc-uncorrectable])",
        "GPU health quarantine record",
    ], held
    assert "health" not in held  # no endpoint left to wait for
    deploy(monkeypatch, plan(DATA, sim, **bad), sim)
    assert "vllm-main" not in sim.active and "vllm-main" not in sim.enabled and sim.serving_files() == files
    assert only(monkeypatch, DATA, sim, **bad) == {}  # the same evidence: nothing
    back = only(monkeypatch, DATA, sim, **smi.sections())
    assert back["services"][0] == "GPU health quarantine record" and "vllm-main running and enabled" in back["services"]
    assert back["health"] == ["vllm-main healthy"]
    deploy(monkeypatch, plan(DATA, sim, **smi.sections()), sim)
    assert "vllm-main" in sim.active and only(monkeypatch, DATA, sim, **smi.sections()) == {}
