"""End to end: instinct-fleet tune on a staging group of two hosts, interrupted, resumed, and restored.

The staging inventory gives both single-node hosts the same instance, ``main`` (the
default recipe, gpt-oss-120b on one GPU), as a staging group has. The stand-in's speed
model (tests/fleet/standin/vllm/vllm_standin.py, ``Engine``) makes --max-num-seqs trade
TPOT for throughput, --max-num-batched-tokens move TTFT, and a --gpu-memory-utilization
below the weights' share refuse to start, as vLLM does. This module runs last and
leaves the fleet on the staging inventory; ``converged`` re-deploys local.py for any
module after it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from fleetctl import CLI, FIGURES, ROOT, Probe, Run, deploy, inventory, quiet, run_cli, serving_files, unleaked, verify

FLEET_SHARE = 1  # beside test_roll
FLEET_LAST = True  # it leaves the fleet on the staging inventory (conftest.py)

HOSTS = ("sim-gpu-1", "sim-gpu-2")
LIMIT = "sim-gpu-*"
# The model's constants for this sweep: a fast prefill with a heavy fixed cost per step, so the budget shows in TTFT.
# Slow tokens keep the stand-in's event rate low: two hosts benchmark at once on the test machine's two cores.
# Modelled steps: 15 ms with 4 sequences running, 50 ms with 32; the SLO lies between them. A prompt of 1024 tokens
# costs 5 ms of prefill plus its share of a 0.4 s step: 50 ms with a budget of 8192, 12.5 ms with 32768, so the median
# TTFT of 32 queued prompts differs by about 0.6 s, far above what a loaded machine adds (0.1 s steps gave 0.15 s,
# which a machine at load 12 turned around once in a clean-clone run).
SLO_TPOT_MS = 25
KNOBS = {"STANDIN_TOKENS_PER_SECOND": "100", "STANDIN_PREFILL_TOKENS_PER_SECOND": "200000", "STANDIN_STEP_SECONDS": "0.4"}
PROFILE = {"dataset": "random", "input_len": 1024, "output_len": 32, "num_prompts": 32, "concurrency": [32]}
SWEEP = [
    "--instance",
    "main",
    "--vary",
    "max-num-seqs=4,32",
    "--vary",
    "max-num-batched-tokens=2048,8192,32768",
    "--vary",
    "gpu-memory-utilization=0.92,0.35",
    "--profile",
    "tune",
    "--slo",
    f"median_tpot_ms<={SLO_TPOT_MS}",
    "--max-out",
    "2",
    "--limit",
    LIMIT,
    "--repeats",  # the points differ by far more than noise; the equal sweep below runs the default repeats
    "1",
]
# Points the stand-in serves alike (vLLM's log level): none may be named best.
EQUAL = ["--instance", "main", "--vary-env", "VLLM_LOGGING_LEVEL=INFO,DEBUG", "--profile", "tune"]
EQUAL += ["--num-prompts", "8", "--concurrency", "8", "--max-out", "2", "--limit", LIMIT]


def staging(fleet: dict[str, Any], tmp_path: Path) -> str:
    ports = {h["name"]: h["api_port"] for h in fleet["hosts"]}
    common = {"bench_profiles": {"tune": PROFILE}, "rolling_drain_timeout": 5}
    return inventory(
        tmp_path,
        "staging",
        {"canary_profile": None},  # the staging deploy puts the tune's starting point in place, slower by design: no canary judges it
        {
            "sim-gpu-1": {**common, "vllm_env": KNOBS},
            # sim-gpu-2 serves the same instance instead of its two Llama halves (offline, with its API key).
            "sim-gpu-2": {
                **common,
                "vllm_env": {"HF_HUB_OFFLINE": "1", **KNOBS},
                "vllm_instances": [{"name": "main", "recipe": "gpt-oss-120b", "port": ports["sim-gpu-2"]}],
            },
        },
    )


def units(fleet: dict[str, Any]) -> dict[str, tuple[tuple[str, int], ...]]:
    ports = {h["name"]: h["api_port"] for h in fleet["hosts"]}
    return {
        "sim-gpu-1": (("sim-gpu-1", ports["sim-gpu-1"]), ("sim-gpu-1", 8081)),
        "sim-gpu-2": (("sim-gpu-2", ports["sim-gpu-2"]),),
        "cluster sim-405b": (("sim-c1", ports["sim-c1"]),),
    }


def trials(out: Path) -> list[dict[str, Any]]:
    path = out / "trials.json"
    return json.loads(path.read_text()) if path.is_file() else []


def test_a_sweep_runs_in_parallel_restores_on_interrupt_resumes_and_finds_the_front(
    converged: Run, fleet: dict[str, Any], tmp_path: Path
) -> None:
    inv = staging(fleet, tmp_path)
    ready = deploy("--limit", LIMIT, inventory=inv)
    assert ready.results["failed_hosts"] == [], ready.stderr[-3000:]
    before = serving_files(fleet, HOSTS)
    out = tmp_path / "sweep"
    argv = [*CLI, "tune", inv, "--project-dir", str(ROOT), *SWEEP, "--output", str(out)]

    # Interrupted as soon as the baselines and one point are in: the host that recorded the point is then
    # writing its next point and restarting, a step the restore must wait for (the tune lock). Every host
    # is restored, the run exits non-zero, and no traceback is shown.
    with Probe(fleet, hz=5, units=units(fleet)) as first_probe:
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while len([t for t in trials(out) if t["status"] != "skipped"]) < 3 and proc.poll() is None and time.monotonic() - started < 300:
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    unleaked(argv, stdout, stderr)
    assert proc.returncode == 130, stdout[-3000:] + stderr[-3000:]
    assert f"interrupted; every host is back on its deployed configuration. Resume with --resume {out}" in stderr, stdout[-3000:] + stderr
    assert "SIGINT: restoring every host" in stdout and "Traceback" not in stderr, stderr
    assert "tune vllm-main: 8 point(s) to measure, 4 skipped as invalid" in stdout
    assert serving_files(fleet, HOSTS) == before
    quiet(deploy("--limit", LIMIT, inventory=inv), failed=())
    measured_first = {(t["host"], json.dumps(t["settings"], sort_keys=True)) for t in trials(out) if t["status"] in ("measured", "failed")}

    with Probe(fleet, hz=5, units=units(fleet)) as probe:
        resumed = run_cli("tune", inv, "--project-dir", str(ROOT), "--resume", str(out))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    ran_again = resumed.stdout.count(": started")
    assert ran_again == 10 - len(measured_first), resumed.stdout  # 8 points and 2 baselines, less what ran before
    assert "(measured earlier)" in resumed.stdout

    done = trials(out)
    by_status: dict[str, list[dict[str, Any]]] = {}
    for t in done:
        by_status.setdefault(t["status"], []).append(t)
    assert {k: len(v) for k, v in by_status.items()} == {"measured": 6, "failed": 4, "skipped": 4}, done
    # The validator refused a budget below --max-model-len (chunked prefill off); the host refused 0.35.
    assert all("scheduler-batched-below-model-len" in t["why"] for t in by_status["skipped"])
    for t in by_status["failed"]:
        assert t["settings"]["--gpu-memory-utilization"] == 0.35 and "not healthy" in t["why"]
        assert any("No available memory for the cache blocks" in line for line in t["journal"]), t["journal"]
    assert sum(t["baseline"] for t in by_status["measured"]) == 2

    # Points ran on both hosts at once.
    spans = {h: [(t["started"], t["seconds"]) for t in done if t["host"] == h and t["status"] != "skipped"] for h in HOSTS}
    assert all(spans.values())

    def interval(item: tuple[str, float]) -> tuple[float, float]:
        begin = time.mktime(time.strptime(item[0], "%Y-%m-%dT%H:%M:%SZ"))
        return begin, begin + item[1]

    assert any(a[0] < b[1] and b[0] < a[1] for a in map(interval, spans["sim-gpu-1"]) for b in map(interval, spans["sim-gpu-2"])), spans

    # The front the model implies: 4 sequences give the lowest TPOT, 32 the most throughput; a bigger budget, a lower TTFT.
    points = [t for t in by_status["measured"] if not t["baseline"]]
    few = [t for t in points if t["settings"]["--max-num-seqs"] == 4]
    many = [t for t in points if t["settings"]["--max-num-seqs"] == 32]
    assert min(t["figures"]["output_throughput"] for t in many) > max(t["figures"]["output_throughput"] for t in few), points
    assert min(t["figures"]["median_tpot_ms"] for t in many) > max(t["figures"]["median_tpot_ms"] for t in few), points
    ttft = {t["settings"]["--max-num-batched-tokens"]: t["figures"]["median_ttft_ms"] for t in many}
    assert ttft[32768] < ttft[8192], many
    report = (out / "tune.md").read_text()
    front = report.split("## Pareto front: output throughput against median TPOT")[1].split("##")[0]
    assert "--max-num-seqs=4 " in front and "--max-num-seqs=32 " in front, report
    assert all(t["meets_slo"] == (t["figures"]["median_tpot_ms"] <= SLO_TPOT_MS) for t in by_status["measured"])
    # best.py holds the fastest point within the SLO, and the model puts a 4-sequence point there.
    winner = max((t for t in by_status["measured"] if t["meets_slo"]), key=lambda t: t["figures"]["output_throughput"])
    assert winner["settings"].get("--max-num-seqs") == 4, by_status["measured"]
    best = (out / "best.py").read_text()
    assert f"measured on {winner['host']} " in best, best
    assert all(f"'{k.removeprefix('--')}': {v!r}" in best for k, v in winner["settings"].items()), best
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"

    # Restored: the files as deployed, a deploy changes nothing, and at most --max-out 2 hosts were ever away.
    assert serving_files(fleet, HOSTS) == before
    quiet(deploy("--limit", LIMIT, inventory=inv), failed=())
    checked = verify(LIMIT, inventory=inv)
    assert checked.returncode == 0, checked.stdout[-4000:]
    worst = min(first_probe.worst(), probe.worst())
    assert worst >= len(units(fleet)) - 2, probe.samples[:5]
    trial_seconds = sum(t["seconds"] for t in done if t["status"] != "skipped")

    # Points equal within noise, each measured with the defaults (a warm-up, then 3 runs): no point beats the
    # deployed configuration, tune.md says so with its evidence, and no best.py is written.
    equal = tmp_path / "equal"
    same = run_cli("tune", inv, "--project-dir", str(ROOT), *EQUAL, "--output", str(equal))
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-3000:]
    measured = [t for t in trials(equal) if t["status"] == "measured"]
    assert len(measured) == 4 and all(len(t["runs"]) == 3 for t in measured), trials(equal)
    said = (equal / "tune.md").read_text().split("## Best point within the SLOs")[1]
    assert "No point beats the deployed configuration" in said and not (equal / "best.py").exists(), said
    assert "3 runs)" in (equal / "tune.md").read_text()
    assert serving_files(fleet, HOSTS) == before
    FIGURES.append(
        f"tune: 8 points (4 skipped as invalid) and 2 baselines on 2 hosts, max-out 2: {resumed.stdout.splitlines()[-2]}; "
        f"trials summed {trial_seconds:.0f} s; worst sample {worst}/{len(units(fleet))} units healthy"
    )
