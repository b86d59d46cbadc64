"""End to end: the roll's gates that stop it: a canary that regresses or loses requests, an interrupted roll,
and a registry down during the pre-pull.

Each test starts from the fault tests' inventory it converges itself (``baseline``), so none depends on the
order (test_roll.py has the re-tune and the crash-looping change, on another share). The registry-down test
comes last: it leaves the fleet on a new image tag, which is why this module runs after the share's modules
on inventories/local.py (FLEET_LAST).
"""

from __future__ import annotations

import json
import re
import signal
import urllib.request
from pathlib import Path
from typing import Any

from fleetctl import (
    BASELINE,
    FIGURES,
    FLAG,
    ROOT,
    UNITS,
    Load,
    Probe,
    deploy,
    fleet_tool,
    inventory,
    quiet,
    router_url,
    run_cli,
    serving_files,
    ssh,
    streamed_deploy,
    verify,
)

from instinct_fleet.model import paths

FLEET_SHARE = 2  # its own fleet, beside test_roll's (conftest.py)
FLEET_LAST = True  # it leaves the fleet on another image tag


# A canary profile short enough for a roll and long enough that the stand-in's sleeps, not the machine's
# jitter, make its figures: 2048-token prompts (about 41 ms of prefill) and 64 output tokens, 16 prompts.
CANARY = {
    "bench_profiles": {"canary": {"input_len": 2048, "output_len": 64, "num_prompts": 16, "concurrency": [4]}},
    "canary_profile": "canary",
}


# The demo's own canary: the built-in profile and the accuracy probe, as a user who sets nothing has them.
DEMO = {k: v for k, v in BASELINE.items() if k != "canary_profile"}


def roll_events(fleet: dict[str, Any], host: str) -> dict[str, int]:
    """The roll's events the host's watch counted (its /metrics on watch_port)."""
    address = next(h["address"] for h in fleet["hosts"] if h["name"] == host)
    with urllib.request.urlopen(f"http://{address}:9401/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {k: int(v) for k, v in re.findall(r"^instinct_fleet_watch_(rolls|canaries|rollbacks)_total (\d+)$", text, re.M)}


def test_a_canary_that_regresses_loses_requests_or_answers_wrong_is_rolled_back_and_a_harmless_change_rolls_on(
    baseline: str, fleet: dict[str, Any], tmp_path: Path
) -> None:
    """The canary (the smallest serving unit, sim-gpu-1) is benchmarked before it stops and after its gate, with
    the default warm-up, runs and verdict; a quarter of the decode speed is caught and rolled back, so is a faster
    change that loses requests, and a harmless change (a --max-num-seqs the canary's 4 concurrent requests never
    reach) rolls through the whole fleet (sim-gpu-2 sets its own vllm_env). Every canary also asks the accuracy
    probe: a change that corrupts the replies at full speed is caught by it alone."""
    files = serving_files(fleet)
    events = {host: roll_events(fleet, host) for host in ("sim-gpu-1", "sim-gpu-2")}
    slower = inventory(tmp_path, "slower", {**BASELINE, **CANARY, "vllm_env": {"STANDIN_TOKENS_PER_SECOND": "100"}})
    with Probe(fleet, hz=5) as probe, Load(router_url(fleet), key=fleet["api_key"]) as load:
        caught = deploy(inventory=slower)
    assert caught.rc != 0 and "Traceback" not in caught.stderr
    # (c) The canary left the router's pool before its first measurement and came back after its rollback's gate.
    assert load.failed() == [] and load.served(True) >= 20, (load.failed()[:5], len(load.done))
    canary_ops = {op for host, op in caught.changed_ops() if host == "sim-gpu-1"}
    assert {"Roll: out of the router pools", "Roll: back into the router pools after the rollback"} <= canary_ops, canary_ops
    why = caught.why("sim-gpu-1")
    assert caught.status("sim-gpu-1") == {"rolled-back"} and "canary regressed" in why and "output throughput" in why, caught.roll
    assert "Mann-Whitney p=" in why, why
    for host in ("sim-c1", "sim-c2"):
        assert caught.status(host) == {"not-rolled"}, caught.roll
    (figures, *_) = [row["canary"] for row in caught.roll if row["host"] == "sim-gpu-1"]
    main = next(c for c in figures if c["instance"] == "main")
    assert main["outcome"] == "regressed" and main["runs"] == [3, 3] and main["regressions"], main
    assert main["after"]["output_throughput"] < 0.5 * main["before"]["output_throughput"]
    assert serving_files(fleet) == files
    assert probe.worst() >= len(UNITS) - 1 and sum(probe.samples[-1][1].values()) == len(UNITS), probe.samples[-1]
    # The canary host's watch counted the batch, its canary and its rollback from the roll's marker (the boards'
    # annotations); sim-gpu-2 was not rolled.
    counted = {host: {k: v - events[host][k] for k, v in roll_events(fleet, host).items()} for host in events}
    assert counted == {"sim-gpu-1": {"rolls": 1, "canaries": 1, "rollbacks": 1}, "sim-gpu-2": {"rolls": 0, "canaries": 0, "rollbacks": 0}}

    # Faster, but one streamed request in four gets a 500: the rest would beat the baseline, so the lost
    # requests alone must stop it, and the canary goes back as for a regression.
    faster = {"STANDIN_TOKENS_PER_SECOND": "440", "STANDIN_PREFILL_TOKENS_PER_SECOND": "55000"}
    lossy = deploy(inventory=inventory(tmp_path, "lossy", {**BASELINE, **CANARY, "vllm_env": {**faster, "STANDIN_FAIL_EVERY": "4"}}))
    assert lossy.rc != 0 and "Traceback" not in lossy.stderr
    assert lossy.status("sim-gpu-1") == {"rolled-back"}, lossy.roll
    assert "canary: 4 of 16 requests failed (Internal Server Error) after the change" in lossy.why("sim-gpu-1"), lossy.roll
    assert serving_files(fleet) == files

    # With the demo's own settings (the default canary): as fast, but every reply degenerates into digits from its
    # sixth word on (ROCm/aiter#4855): only the accuracy probe sees it, and the canary goes back before the roll
    # reaches a second host.
    earlier = set((ROOT / "results").glob("*-canary-*"))  # the results/ of the checkout: every share's canaries
    corrupt = deploy(inventory=inventory(tmp_path, "corrupt", {**DEMO, "vllm_env": {"STANDIN_CORRUPT": "6"}}))
    assert corrupt.rc != 0 and "Traceback" not in corrupt.stderr
    assert corrupt.status("sim-gpu-1") == {"rolled-back"}, corrupt.roll
    why = corrupt.why("sim-gpu-1")
    assert "canary regressed: main: probe accuracy " in why and "items right before and wrong after" in why and "McNemar p=" in why, why
    for host in ("sim-gpu-2", "sim-c1", "sim-c2"):
        assert corrupt.status(host) == {"not-rolled"}, corrupt.roll
    (judged, *_) = [row["accuracy"] for row in corrupt.roll if row["host"] == "sim-gpu-1"]
    wrong = next(v for v in judged if v["instance"] == "main")
    assert wrong["outcome"] == "regressed" and wrong["items"] == 200 and wrong["accuracy"][0] >= 80 > 20 >= wrong["accuracy"][1], wrong
    assert [c["outcome"] for row in corrupt.roll for c in row["canary"]] and all(
        c["outcome"] != "regressed" for row in corrupt.roll for c in row["canary"]
    ), corrupt.roll  # its speed passed: the answers alone stopped it
    assert serving_files(fleet) == files

    harmless = {**DEMO, "vllm_args": {FLAG: 200}}
    rolled = deploy(inventory=inventory(tmp_path, "harmless", harmless))
    assert rolled.results["failed_hosts"] == ["sim-nogpu"], rolled.stderr[-3000:]
    for host in ("sim-gpu-1", "sim-gpu-2", "sim-c1", "sim-c2"):
        assert rolled.status(host) == {"rolled"}, rolled.roll
    assert {row["batch"] for row in rolled.roll if row["host"] == "sim-gpu-1"} == {1}  # the canary rolls alone, first
    verdicts = [c for row in rolled.roll for c in row["canary"]]
    assert verdicts and all(c["outcome"] != "regressed" and not c["regressions"] for c in verdicts), verdicts
    answered = [v for row in rolled.roll for v in row["accuracy"]]
    assert answered and all(v["outcome"] != "regressed" and v["accuracy"][0] >= 80 for v in answered), answered
    # Every run of both measurements is stored as bench stores its runs, and report reads them with their spread.
    # This fleet's (its own image's registry; the other shares' fleets store theirs beside them): the corrupt change's
    # two measurements, then the harmless one's.
    configs = {d: d / "sim-gpu-1" / "main" / "config.json" for d in sorted(set((ROOT / "results").glob("*-canary-*")) - earlier)}
    stored = [d for d, c in configs.items() if c.is_file() and json.loads(c.read_text())["image"] == fleet["image"]]
    assert [p.name.rsplit("-", 1)[-1] for p in stored] == ["before", "after", "before", "after"]
    assert len(list((stored[-1] / "sim-gpu-1" / "main").glob("canary-c4*.json"))) == 3
    report = run_cli("report", str(stored[-1]))
    assert report.returncode == 0 and report.stdout.startswith("profile") and "canary" in report.stdout, report.stderr[-2000:]
    assert "3 runs)" in (stored[-1] / "report.md").read_text()
    FIGURES.append(
        f"canary: a change to a quarter of the decode speed was caught and rolled back in {caught.seconds:.0f} s "
        f"({main['before']['output_throughput']:.0f} -> {main['after']['output_throughput']:.0f} output tok/s, "
        f"median TPOT {main['before']['median_tpot_ms']:.2f} -> {main['after']['median_tpot_ms']:.2f} ms, 3 runs a side), lowest capacity "
        f"{probe.worst()}/{len(UNITS)} units; a faster change that lost 4 of 16 requests rolled back in {lossy.seconds:.0f} s; "
        f"a change that corrupted every reply from its sixth word on rolled back in {corrupt.seconds:.0f} s (probe accuracy "
        f"{wrong['accuracy'][0]:.1f}% -> {wrong['accuracy'][1]:.1f}%, {wrong['lost']} items lost, {wrong['gained']} gained); "
        f"a harmless change rolled through in {rolled.seconds:.0f} s"
    )


def test_an_interrupted_roll_finishes_its_batch_exits_non_zero_and_the_next_deploy_completes_it(
    baseline: str, fleet: dict[str, Any], tmp_path: Path
) -> None:
    """SIGINT (a CI runner cancelling the job) inside batch 1: that batch finishes, gate included; no other
    batch opens; the run exits non-zero with each unit's status; every unit serves its old or its new
    configuration; the next deploy rolls the rest."""
    change = inventory(tmp_path, "interrupted", {**BASELINE, "vllm_args": {FLAG: 176}})
    with Probe(fleet, hz=5) as probe:
        # pyinfra names an operation before its gate runs: the first unit file of batch 1 comes after the
        # batch's first gated operation (the roll marker) has opened it.
        rc, output, _ = streamed_deploy(change, "vllm-llama-405b unit", lambda proc: proc.send_signal(signal.SIGINT))
    assert rc != 0 and "Traceback" not in output, output[-3000:]
    assert "SIGINT: finishing roll batch 1" in output, output[-3000:]
    summary = output.split("Roll summary:")[-1]
    rows = {line.split()[0]: line for line in summary.splitlines() if line.strip().startswith("sim-")}
    assert "rolled" in rows["sim-c1"] and "rolled" in rows["sim-c2"], summary  # batch 1: the cluster, finished
    for host in ("sim-gpu-1", "sim-gpu-2"):
        assert "interrupted" in rows[host] and "SIGINT before its batch" in rows[host], summary
        assert f"--{FLAG} 176" not in ssh(fleet, host, "cat /etc/systemd/system/vllm-*.service")  # old configuration
    assert f"--{FLAG} 176" in ssh(fleet, "sim-c1", "cat /etc/systemd/system/vllm-llama-405b.service")  # new configuration
    assert probe.worst() >= len(UNITS) - 1
    done = verify("sim-c*", inventory=change)  # the rolled unit is exactly the new inventory
    assert done.returncode == 0, done.stdout[-4000:]
    resumed = deploy(inventory=change)
    assert resumed.results["failed_hosts"] == ["sim-nogpu"], resumed.stderr[-3000:]
    assert resumed.status("sim-c1") == {"unchanged"} and resumed.status("sim-gpu-1") == {"rolled"}, resumed.roll
    quiet(deploy(inventory=change))


def test_registry_down_during_the_pre_pull_restarts_nothing(baseline: str, fleet: dict[str, Any], tmp_path: Path) -> None:
    """Last: it leaves the fleet on a new image tag."""
    image = fleet_tool("tag", "v0.22.0-rc2")
    release = inventory(tmp_path, "release", {**BASELINE, "vllm_image": image})
    before = {h: ssh(fleet, h, "cat /etc/systemd/system/vllm-*.service") for h in ("sim-gpu-1", "sim-gpu-2", "sim-c1")}
    fleet_tool("registry", "stop")
    try:
        failed = deploy(inventory=release, results=False)  # every host fails: pyinfra stops with no host left
    finally:
        fleet_tool("registry", "start")
    assert failed.rc != 0 and "No hosts remaining" in failed.stderr and "Traceback" not in failed.stderr
    assert failed.stderr.count("vLLM image present") >= 1
    for host, units in before.items():
        assert ssh(fleet, host, "cat /etc/systemd/system/vllm-*.service") == units
        assert failed.status(host) == {"not-rolled"}, failed.roll
    released = deploy(inventory=release)
    assert released.results["failed_hosts"] == ["sim-nogpu"], released.stderr[-3000:]
    assert image in ssh(fleet, "sim-gpu-1", "cat /etc/systemd/system/vllm-main.service")
    # The new image has a compile cache of its own; the old one's stays (compile_cache_keep 2).
    new_cache = paths.compile_cache("/var/cache/instinct-fleet/compile", image)
    assert ssh(fleet, "sim-gpu-1", f"cat {new_cache}/IMAGE_ID").startswith("sha256:")
    assert len(ssh(fleet, "sim-gpu-1", "ls /var/cache/instinct-fleet/compile").split()) == 2
    quiet(deploy(inventory=release))
