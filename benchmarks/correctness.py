#!/usr/bin/env python3
"""Does the canary's accuracy probe tell a corrupting change from a harmless one, through real deploys?

On the simulated fleet (tests/fleet/fleet.py: the stand-in vLLM, whose answers to the probe are right for about
90 items in 100, deterministically per configuration, and degenerate into digits from the Nth word on with
STANDIN_CORRUPT=N, as ROCm/aiter#4855 did). Each trial is one ``instinct-fleet deploy`` limited to sim-gpu-1 (the
canary: its two instances, main and batch) with the canary profile of tests/e2e/test_roll_gates.py, every
accuracy default, and speed floors raised beyond this machine's jitter so that the probe alone judges; trials
alternate:

- **harmless**: another ``--max-num-seqs`` (a new configuration, so the stand-in's configuration-dependent
  wrong answers are drawn again and a few items flip both ways, as greedy paths move under a harmless kernel
  change);
- **corrupting**: another ``--max-num-seqs`` and STANDIN_CORRUPT at a word drawn from 1 to 12. It must be caught
  on the canary and rolled back, with sim-gpu-1's serving files byte-identical to before.

It also times ``instinct-fleet bench --accuracy`` on one instance (the probe alone, as the canary asks it on
each side), and writes its section of benchmarks/RESULTS.md (between its markers) and the trials to
``benchmarks/correctness.json``. Needs root (dockerd) and the fleet of slot INSTINCT_FLEET_SLOT (started when
missing). Usage: ``sudo .venv/bin/python benchmarks/correctness.py [TRIALS_PER_KIND]`` (default 20: about 40
minutes); ``--rewrite`` writes the section again from the last trials without a fleet.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import fleetctl  # noqa: E402  (the simulated fleet's inventories and deploys, as the end-to-end tests use them)
import sections  # noqa: E402  (benchmarks/sections.py)

from instinct_fleet.live import accuracy  # noqa: E402
from instinct_fleet.model.defaults import FleetVars  # noqa: E402

CANARY = {
    "bench_profiles": {"canary": {"input_len": 2048, "output_len": 64, "num_prompts": 16, "concurrency": [4]}},
    "canary_profile": "canary",
    # Floors no figure of this machine's jitter reaches (TTFTs of a few ms on 2 busy cores): only the probe judges here.
    "canary_floors": {"output_throughput": 300.0, "median_tpot_ms": 5.0, "median_ttft_ms": 50.0},
}
HOST = "sim-gpu-1"
RAW = ROOT / "benchmarks" / "correctness.json"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- benchmarks/correctness.py writes from here -->", "<!-- benchmarks/correctness.py writes up to here -->"
# Seed 001's gpt-oss-120b on one MI300X (random 4096/1024, concurrency 8): the median TPOT the estimate starts from.
SEED_TPOT_MS = 15.85  # 001:94


def trial(fleet: dict[str, Any], kind: str, directory: Path, number: int, draw: random.Random) -> dict[str, Any]:
    seqs = 161 + number
    env = {"STANDIN_CORRUPT": str(draw.randint(1, 12))} if kind == "corrupting" else {}
    data = {**fleetctl.BASELINE, **CANARY, "vllm_args": {fleetctl.FLAG: seqs}, "vllm_env": env}
    before = fleetctl.serving_files(fleet, (HOST,))
    # A caught change fails its one host: pyinfra then ends with no host left (no results), which is the point here.
    started = time.monotonic()
    argv = [*fleetctl.CLI, "deploy", fleetctl.inventory(directory, f"{kind}-{number}", data), "--project-dir", str(ROOT), "--json", "-y"]
    done = subprocess.run([*argv, "--limit", HOST], cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - started
    roll = json.loads(done.stdout)["roll"]
    after = fleetctl.serving_files(fleet, (HOST,))
    rows = [row for row in roll if row["host"] == HOST]
    verdicts = [v for row in rows[:1] for v in row["accuracy"]]
    return {
        "kind": kind,
        "max_num_seqs": seqs,
        "corrupt_from": env.get("STANDIN_CORRUPT"),
        "status": sorted({row["status"] for row in rows}),
        "accuracy": verdicts,
        "speed": [c["outcome"] for row in rows[:1] for c in row["canary"]],
        "files_unchanged": before == after,
        "seconds": round(seconds, 1),
        "why": rows[0]["why"] if rows else done.stderr[-500:],
    }


def probe_seconds(repeats: int = 3) -> list[float]:
    """``bench --accuracy`` on the canary's main instance: the probe alone, container start included."""
    times = []
    for _ in range(repeats):
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run(
                [*fleetctl.CLI, "bench", fleetctl.INVENTORY, "--accuracy", "--limit", HOST, "--instance", "main", "--output", out],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
        assert done.returncode == 0, done.stderr[-2000:]
        times.append(time.monotonic() - started)
    return times


def section(data: dict[str, Any]) -> str:
    v = FleetVars()
    trials = data["trials"]
    harmless = [t for t in trials if t["kind"] == "harmless"]
    corrupting = [t for t in trials if t["kind"] == "corrupting"]
    tripped = [t for t in harmless if any(v["outcome"] == "regressed" for v in t["accuracy"])]
    rolled = [t for t in harmless if t["status"] == ["rolled"]]
    caught = [t for t in corrupting if t["status"] == ["rolled-back"] and any(v["outcome"] == "regressed" for v in t["accuracy"])]
    intact = [t for t in caught if t["files_unchanged"]]
    flips = [v["lost"] + v["gained"] for t in harmless for v in t["accuracy"]]
    drops = [v["accuracy"][0] - v["accuracy"][1] for t in harmless for v in t["accuracy"]]
    wrong_after = [v["accuracy"][1] for t in corrupting for v in t["accuracy"] if v["outcome"] == "regressed"]
    seconds = data["probe_seconds"]
    waves = -(-v.canary_probe_size // accuracy.CONCURRENCY)
    estimate = waves * v.canary_probe_max_tokens * SEED_TPOT_MS / 1000
    return "\n".join(
        [
            BEGIN,
            "",
            f"`benchmarks/correctness.py`, {data['date']} on {data['machine']}: {len(trials)} deploys limited to {HOST} (the canary, two "
            f"instances), each a new configuration, with every accuracy default (200 built-in items, floor {v.canary_probe_floor:g} points, "
            f"alpha {v.canary_probe_alpha:g} for the canary, split over its two instances).",
            "",
            "| changes | rolled through | rolled back on accuracy | caught and rolled back | serving files byte-identical after |",
            "| --- | --- | --- | --- | --- |",
            f"| {len(harmless)} harmless (another `--max-num-seqs`) | {len(rolled)} | {len(tripped)} | - | - |",
            f"| {len(corrupting)} corrupting (STANDIN_CORRUPT from a word in 1-12) | - | - | {len(caught)} | {len(intact)} of {len(caught)} |",
            "",
            f"A harmless change flipped {min(flips)}-{max(flips)} items per instance (median {statistics.median(flips):g}), both ways; "
            f"its accuracy moved by {min(drops):+.1f} to {max(drops):+.1f} points. A caught corruption answered "
            f"{min(wrong_after):.1f}-{max(wrong_after):.1f}% after the change. Deploys took {min(t['seconds'] for t in trials):.0f}-"
            f"{max(t['seconds'] for t in trials):.0f} s.",
            "",
            f"What the probe adds: `bench --accuracy` on one stand-in instance took {statistics.median(seconds):.1f} s "
            f"(median of {len(seconds)}; {min(seconds):.1f}-{max(seconds):.1f} s, most of it the client's container start); a canary "
            "asks it of each canary instance on both sides. On an MI300X the decode dominates: 200 items at 32 at a time are "
            f"{waves} waves of at most {v.canary_probe_max_tokens} tokens; at seed 001's median TPOT of {SEED_TPOT_MS} ms "
            f"(gpt-oss-120b, concurrency 8; TPOT grows with the batch, so this is a floor) a wave of full-length replies "
            f"takes {v.canary_probe_max_tokens * SEED_TPOT_MS / 1000:.1f} s, about {estimate:.0f} s a side for the probe at most, "
            "less when the replies end early. An estimate, not a measurement.",
            "",
            "The verdict's false-alarm rate on the stand-in's answer model without the fleet: tests/unit/test_accuracy.py simulates "
            "60 harmless changes and 20 corruptions on every `make test`.",
            "",
            END,
        ]
    )


def write(data: dict[str, Any]) -> None:
    sections.replace(RESULTS, BEGIN, END, section(data), "Accuracy probe")


def main(argv: list[str]) -> int:
    if argv == ["--rewrite"]:
        write(json.loads(RAW.read_text()))
        return 0
    if not fleetctl.FLEET_FILE.is_file():
        subprocess.run([sys.executable, str(ROOT / "tests" / "fleet" / "fleet.py"), "up"], check=True)
    fleet = json.loads(fleetctl.FLEET_FILE.read_text())
    per_kind = int(argv[0]) if argv else 20
    draw = random.Random(45)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        # The whole fleet first (its routers included), as the end-to-end tests converge it; then the canary alone.
        start = fleetctl.deploy(inventory=fleetctl.inventory(directory, "start", {**fleetctl.BASELINE, **CANARY}))
        assert start.results["failed_hosts"] == ["sim-nogpu"], start.stderr[-3000:]
        trials = []
        for number in range(2 * per_kind):
            kind = "harmless" if number % 2 == 0 else "corrupting"
            trials.append(trial(fleet, kind, directory, number, draw))
            print(json.dumps(trials[-1])[:400], flush=True)
    data = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "trials": trials,
        "probe_seconds": [round(s, 2) for s in probe_seconds()],
    }
    RAW.write_text(json.dumps(data, indent=1) + "\n")
    write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
