"""End to end: re-tuning the live simulated fleet rolls one serving unit at a time, behind gates that roll back.

Each test starts from a fleet it converges itself (``on_local``: inventories/local.py;
``baseline``: the fault tests' inventory), so none depends on the order: the re-tune
rolls to --max-num-seqs 192, the crash-looping attempt ends on 160 (``BASELINE``). A gate that
fails one host alone (never healthy, a failing first completion) is in test_faults.py; the registry-down
test is in test_roll_gates.py, with the canary and the interrupted roll, on a share of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetctl import (
    BASELINE,
    FIGURES,
    FLAG,
    SERVING,
    UNITS,
    Load,
    Probe,
    Run,
    deploy,
    inventory,
    quiet,
    router_url,
    serving_files,
    ssh,
    started_at,
    verify,
)

from instinct_fleet.model import paths

FLEET_SHARE = 1  # with the bench, GPU health and tune modules; the roll's gates are on share 2 (conftest.py)
# A cache miss compiles for STANDIN_COMPILE_S. sim-gpu-1's main and sim-gpu-2's oss serve gpt-oss-120b with one
# configuration once both have the API key (vLLM 0.22.0 hashes VLLM_API_KEY into its compile key), so the host
# that restarts oss after sim-gpu-1 can start it on the cache sim-gpu-1 built.
COMPILING = {
    "sim-gpu-1": {"vllm_api_key_path": "/etc/instinct-fleet/api-key", "vllm_env": {"STANDIN_COMPILE_S": "3"}},
    "sim-gpu-2": {"vllm_env": {"HF_HUB_OFFLINE": "1", "STANDIN_COMPILE_S": "3"}},
}
SPOOL = "/var/cache/instinct-fleet/compile/.spread"  # where a host receives a cache copy (paths.spread_bundle)


def test_a_retune_rolls_one_serving_unit_at_a_time_behind_the_health_gate(on_local: Run, fleet: dict[str, Any], tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.log"
    log = 'echo "{} $INSTINCT_FLEET_HOST $INSTINCT_FLEET_UNITS" >> {}'
    files = serving_files(fleet)  # the fleet on inventories/local.py (``on_local``)
    ssh(fleet, "sim-gpu-1", "rm -f /var/log/hooks.log")  # a kept fleet (INSTINCT_FLEET_REUSE) ran this test before
    retune = inventory(
        tmp_path,
        "retune",
        {
            "vllm_args": {FLAG: 192},
            "canary_profile": None,  # the batches by rolling_batch alone (the canary's own batch: test_roll_gates)
            "rolling_pre_stop": {"control": log.format("pre", hooks), "host": log.format("pre", "/var/log/hooks.log")},
            "rolling_post_start": {"control": log.format("post", hooks)},
        },
        hosts=COMPILING,
    )
    # A build lock a killed container left in the image's compile cache (its PID namespace is gone): the unit's
    # ExecStartPre removes it, where AITER would wait on it forever (aiter#5266).
    env_file = paths.unit_env_path(paths.vllm_unit("main"))
    jit = ssh(fleet, "sim-gpu-1", f"sed -n 's/^AITER_JIT_DIR=//p' {env_file}").strip()
    assert jit.startswith("/var/cache/instinct-fleet/compile/") and ssh(fleet, "sim-gpu-1", f"cat {jit}/../IMAGE_ID").startswith("sha256:")
    ssh(fleet, "sim-gpu-1", f"mkdir -p {jit}/module_moe && printf '4242\\nsim-gpu-1\\npid:[1]\\n0\\n' > {jit}/module_moe/lock")
    with Probe(fleet, hz=5) as probe, Load(router_url(fleet), key=fleet["api_key"]) as load:
        rolled = deploy(inventory=retune)
    assert rolled.results["failed_hosts"] == ["sim-nogpu"], rolled.stderr[-3000:]
    assert ssh(fleet, "sim-gpu-1", f"test -e {jit}/module_moe/lock && echo left || echo gone") == "gone\n"
    # (a) Through the router, while every unit rolled: not one client request failed.
    assert load.failed() == [] and load.served(True) >= 20 and load.served(False) >= 20, (load.failed()[:5], len(load.done))
    # Every unit restarted, and the probe saw each one down: its samples resolve a restart, so the bound below is not
    # vacuous (its rate, about 5 Hz, falls on a loaded machine and goes to the figures, not to an assertion).
    assert probe.seen_down() == set(UNITS), (probe.seen_down(), f"{probe.rate():.1f} Hz")
    # rolling_batch = 1: at every sample, every serving unit but at most one answered on all its endpoints.
    assert probe.worst() >= len(UNITS) - 1, [s for s in probe.samples if sum(s[1].values()) < len(UNITS) - 1][:5]
    for host in ("sim-gpu-1", "sim-gpu-2", "sim-c1", "sim-c2"):
        assert rolled.status(host) == {"rolled"}, rolled.roll
    # Each unit that restarted says how it started: seconds to healthy and the phases from its journal (the
    # stand-in logs vLLM's own lines; with no STANDIN_COMPILE_S it compiles nothing, so no cache verdict).
    starts = {(r["host"], r["instance"]): r["start"] for r in rolled.roll if r["status"] == "rolled" and r["instance"].startswith("vllm-")}
    assert starts and all(s and s["seconds"] > 0 and s["weights"] is not None for s in starts.values()), starts
    # The changed flag misses on the first host that restarts it and hits on the later one, which received the cache.
    cache = {row["host"]: row["cache"] for row in rolled.roll}
    assert starts[("sim-gpu-1", "vllm-main")]["cache"] == "cold" and starts[("sim-gpu-2", "vllm-oss")]["cache"] == "warm", starts
    assert starts[("sim-gpu-2", "vllm-llama-a")]["cache"] == "cold"  # nobody had built Llama 3.1 70B before it
    assert [c for c in cache["sim-gpu-1"] if "sent to 1 host(s)" in c], cache
    assert [c for c in cache["sim-gpu-2"] if "compile cache from sim-gpu-1 received" in c], cache
    assert starts[("sim-gpu-2", "vllm-oss")]["compile"] < 3 <= starts[("sim-gpu-1", "vllm-main")]["compile"], starts
    assert "started in " in rolled.stderr.split("Roll summary:")[-1]
    batches = {row["serving_unit"]: row["batch"] for row in rolled.roll if row["status"] == "rolled"}
    assert sorted(batches.values()) == [1, 2, 3] and set(batches) == set(UNITS)
    # The hooks ran once per serving unit, on its head or single host, around its own batch, in batch order.
    assert hooks.read_text().splitlines() == [
        "pre sim-c1 vllm-llama-405b",
        "post sim-c1 vllm-llama-405b",
        "pre sim-gpu-1 vllm-main vllm-batch",
        "post sim-gpu-1 vllm-main vllm-batch",
        "pre sim-gpu-2 vllm-llama-a vllm-oss",
        "post sim-gpu-2 vllm-llama-a vllm-oss",
    ]
    assert ssh(fleet, "sim-gpu-1", "cat /var/log/hooks.log") == "pre sim-gpu-1 vllm-main vllm-batch\n"
    unit = ssh(fleet, "sim-gpu-1", "cat /etc/systemd/system/vllm-main.service")
    assert f"--{FLAG} 192" in unit and "--shutdown-timeout 60" in unit
    done = verify(SERVING, inventory=retune)
    assert done.returncode == 0, done.stdout[-4000:]
    quiet(deploy(inventory=retune))
    # instinct-fleet rollback: the generation before the re-tune comes back through the same batches and gates.
    back = deploy(inventory=retune, command="rollback")
    assert back.results["failed_hosts"] == ["sim-nogpu"], back.stderr[-3000:]
    for host in ("sim-gpu-1", "sim-gpu-2", "sim-c1", "sim-c2"):
        assert back.status(host) == {"rolled"}, back.roll
    assert "rolls them forward again" in back.stderr
    assert serving_files(fleet) == files  # byte for byte the files of inventories/local.py, each unit healthy behind its gate
    quiet(deploy())
    FIGURES.append(
        f"roll of {len(UNITS)} serving units, rolling_batch 1: {rolled.seconds:.0f} s; worst sample {probe.worst()}/{len(UNITS)} "
        f"units healthy ({len(probe.samples)} samples at {probe.rate():.1f} Hz); instinct-fleet rollback: {back.seconds:.0f} s"
    )


def test_a_crash_looping_change_is_rolled_back_on_its_first_batch(on_local: Run, fleet: dict[str, Any], tmp_path: Path) -> None:
    """rolling_on_failure = "rollback" (the default): the batch whose gate fails goes back to its last healthy
    generation, byte for byte, answers again, and the roll stops; the run exits non-zero."""
    good = inventory(tmp_path, "good", BASELINE, hosts=COMPILING)
    broken = inventory(tmp_path, "broken", {**BASELINE, "vllm_env": {"STANDIN_CRASH_AT_START": "1"}})
    before = {(h, c): started_at(fleet, h, c) for h, c in (("sim-gpu-1", "vllm-main"), ("sim-gpu-2", "vllm-llama-a"))}
    files = serving_files(fleet)
    with Probe(fleet, hz=5) as probe, Load(router_url(fleet), key=fleet["api_key"]) as load:
        stopped = deploy(inventory=broken)
    assert stopped.rc != 0
    assert load.failed() == [] and load.served(True) >= 5, (load.failed()[:5], len(load.done))  # (b)
    # Batch 1 is the cluster (units roll in name order); its health gate sees the crash loop, and both members go back.
    assert stopped.status("sim-c1") == {"rolled-back"} and "crash loop" in stopped.why("sim-c1"), stopped.roll
    assert stopped.status("sim-c2") == {"rolled-back"}, stopped.roll
    assert "rolled back to generation" in stopped.why("sim-c1") and "differs from the inventory" in stopped.why("sim-c1")
    assert "sim-c1" in stopped.results["failed_hosts"]
    assert serving_files(fleet) == files  # every host's serving files as before the run
    assert probe.worst() >= len(UNITS) - 1, [s for s in probe.samples if sum(s[1].values()) < len(UNITS) - 1][:5]
    assert sum(probe.samples[-1][1].values()) == len(UNITS), probe.samples[-1]  # every unit answers again
    for host in ("sim-gpu-1", "sim-gpu-2"):
        assert stopped.status(host) == {"not-rolled"}, stopped.roll
        assert "roll stopped after batch 1" in stopped.why(host)
        # Untouched: old unit and env files, the same container, still serving.
        assert "STANDIN_CRASH" not in ssh(fleet, host, "cat /etc/instinct-fleet/vllm-*.env")
        assert f"--{FLAG} 160" not in ssh(fleet, host, "cat /etc/systemd/system/vllm-*.service")
    for (host, container), at in before.items():
        assert started_at(fleet, host, container) == at, f"{container} on {host} was restarted by a stopped roll"
        assert "STANDIN_CRASH" not in ssh(fleet, host, f"docker inspect --format '{{{{.Config.Env}}}}' {container}")
    # Fixed, warmed, then rolled. instinct-fleet warm builds each changed configuration once: sim-gpu-1 restarts main
    # and batch, sim-gpu-2 only llama-a (nobody else serves it); sim-gpu-2's oss is main's configuration, so it stays
    # as it is and receives sim-gpu-1's cache. Its disk has no room for it (a 4 KiB filesystem where copies land):
    # the partial copy is removed, never used, and oss compiles at the next deploy as it would have.
    ssh(fleet, "sim-gpu-2", f"mkdir -p {SPOOL} && mount -t tmpfs -o size=4k tmpfs {SPOOL}")
    try:
        warmed = deploy(inventory=good, command="warm")
    finally:
        ssh(fleet, "sim-gpu-2", f"umount {SPOOL}")
    assert warmed.results["failed_hosts"] == ["sim-nogpu"], warmed.stderr[-3000:]
    rows = {(r["host"], r["instance"]): r for r in warmed.roll}
    assert [k for k, r in rows.items() if r["status"] == "rolled"] == [
        ("sim-gpu-1", "vllm-main"),
        ("sim-gpu-1", "vllm-batch"),
        ("sim-gpu-2", "vllm-llama-a"),
    ], warmed.roll
    assert rows[("sim-gpu-2", "vllm-oss")]["status"] == rows[("sim-c1", "vllm-llama-405b")]["status"] == "not-rolled"
    refused = rows[("sim-gpu-2", "vllm-oss")]["cache"]
    assert refused and all("not received" in c and "the partial copy was removed" in c for c in refused), refused
    assert f"--{FLAG} 160" not in ssh(fleet, "sim-gpu-2", "cat /etc/systemd/system/vllm-oss.service")  # left as it was
    # The deploy rolls the rest: the Ray cluster and oss, which compiles (nothing of the partial copy was used).
    fixed = deploy(inventory=good)
    assert fixed.results["failed_hosts"] == ["sim-nogpu"], fixed.stderr[-3000:]
    assert fixed.status("sim-gpu-1") == {"unchanged"} and fixed.status("sim-c1") == {"rolled"}, fixed.roll
    oss = next(row["start"] for row in fixed.roll if (row["host"], row["instance"]) == ("sim-gpu-2", "vllm-oss"))
    assert oss["cache"] == "cold", oss
    quiet(deploy(inventory=good))
    FIGURES.append(
        f"crash-looping change rolled back on batch 1 (the Ray cluster) in {stopped.seconds:.0f} s, lowest capacity "
        f"{probe.worst()}/{len(UNITS)} units; fixed: warm {warmed.seconds:.0f} s, then the roll {fixed.seconds:.0f} s"
    )
