#!/usr/bin/env python3
"""A roll whose restarts compile: with the compile cache carried from the first batch to the later ones, and without.

On a light fleet of N hosts (``tests/fleet/fleet.py up --hosts N --clusters K``: K
two-node Ray clusters serving llama-3.1-405b-pp2, the default recipe on every other host;
one compile configuration each, ports aside) whose stand-in compiles for
``STANDIN_COMPILE_S`` seconds on a cache miss (on a cluster, each node its own ranks), it
rolls one flag change through every serving unit, ``rolling_batch`` at a time, three ways:

* ``compile_cache_spread = False``: every host compiles its own (the roll before issue 34);
* ``compile_cache_spread = True``: the first batch compiles, the later ones receive its cache;
* ``instinct-fleet warm`` first (one host compiles, the others receive), then the roll.

Each is a new value of ``--max-num-seqs``, so each starts from a cache that misses. It
reports the wall time of each run and every unit's start (seconds to healthy, cold or
warm) from the roll summary, against the goal "one cold start per compile configuration,
warm starts for the other batches, plus the gates", and writes its section of
``benchmarks/RESULTS.md`` (one without clusters, one with). Needs root
(dockerd); not part of ``make test``.
Usage: ``sudo .venv/bin/python benchmarks/warm_roll.py [HOSTS] [BATCH] [COMPILE_S] [CLUSTERS]`` (default 8 2 20 0).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FLEET = [sys.executable, str(ROOT / "tests" / "fleet" / "fleet.py")]
CLI = str(Path(sys.executable).parent / "instinct-fleet")


def markers(clusters: int) -> tuple[str, str]:
    """Where its section of RESULTS.md starts and ends: one section without clusters, one with them."""
    kind = " (with clusters)" if clusters else ""
    return f"<!-- benchmarks/warm_roll.py{kind} writes from here to the end marker -->", f"<!-- end of benchmarks/warm_roll.py{kind} -->"


def inventory(directory: Path, name: str, extra: dict[str, Any]) -> str:
    """benchmarks/scale_inventory.py with ``extra`` on every host."""
    path = directory / f"{name}.py"
    path.write_text(
        "import runpy\n"
        f"base = runpy.run_path({str(ROOT / 'benchmarks' / 'scale_inventory.py')!r})\n"
        f"scale = [(n, {{**d, **{extra!r}}}) for n, d in base['scale']]\n"
    )
    return str(path)


def run(command: str, inv: str) -> tuple[float, list[dict[str, Any]]]:
    """One ``instinct-fleet deploy|warm -y --json``: its wall time and its roll summary."""
    started = time.monotonic()
    done = subprocess.run([CLI, command, inv, "-y", "--json"], cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"{command} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout)["roll"]


def starts(rows: list[dict[str, Any]]) -> list[tuple[str, int | None, float, str]]:
    """(host, batch, seconds to healthy, cold/warm) of each unit that started in the run."""
    found = [(r["host"], r["batch"], r["start"]["seconds"], r["start"]["cache"] or "?") for r in rows if r.get("start")]
    return sorted(found, key=lambda s: (s[1] or 0, s[0]))


def describe(found: list[tuple[str, int | None, float, str]]) -> str:
    by_batch: dict[int, list[str]] = {}
    for _host, batch, seconds, cache in found:
        by_batch.setdefault(batch or 0, []).append(f"{seconds:.0f} s {cache}")
    return "; ".join(f"batch {b}: " + ", ".join(v) for b, v in sorted(by_batch.items()))


def main() -> None:
    hosts, batch, compile_s, clusters = (int(a) for a in (sys.argv[1:] + ["8", "2", "20", "0"][len(sys.argv) - 1 :])[:4])
    subprocess.run([*FLEET, "down"], check=True)
    subprocess.run([*FLEET, "up", "--hosts", str(hosts), "--clusters", str(clusters)], check=True)
    common = {"rolling_batch": batch, "rolling_drain_timeout": 5, "vllm_env": {"STANDIN_COMPILE_S": str(compile_s)}}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        first, _ = run("deploy", inventory(Path(tmp), "base", {**common, "vllm_args": {"max-num-seqs": 100}}))
        print(f"first converge {first:.0f} s", flush=True)
        for label, command, seqs, spread in (
            ("roll, every host compiles its own", "deploy", 110, False),
            ("roll, caches carried from the first batch", "deploy", 120, True),
            ("instinct-fleet warm", "warm", 130, True),
            ("roll after instinct-fleet warm", "deploy", 130, True),
        ):
            inv = inventory(Path(tmp), f"seqs{seqs}", {**common, "vllm_args": {"max-num-seqs": seqs}, "compile_cache_spread": spread})
            seconds, summary = run(command, inv)
            found = starts(summary)
            rows.append({"run": label, "seconds": seconds, "starts": found})
            print(json.dumps(rows[-1]), flush=True)
    subprocess.run([*FLEET, "down"], check=True)
    write(rows, hosts, batch, compile_s, clusters)


def write(rows: list[dict[str, Any]], hosts: int, batch: int, compile_s: int, clusters: int) -> None:
    cold = [s[2] for r in rows for s in r["starts"] if s[3] == "cold"]
    warm = [s[2] for r in rows for s in r["starts"] if s[3] == "warm"]
    batches = -(-(hosts - clusters) // batch)  # serving units: a cluster's two hosts are one
    table = ["| run | wall s | unit starts (seconds to healthy, cold or warm) |", "| --- | --- | --- |"]
    table += [f"| {r['run']} | {r['seconds']:.0f} | {describe(r['starts'])} |" for r in rows]
    machine = f"{os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}"
    lines = [
        f"Measured by `benchmarks/warm_roll.py` on {time.strftime('%Y-%m-%d')}: {machine}; {hosts} simulated hosts, "
        + (
            f"{clusters} two-node Ray clusters (llama-3.1-405b-pp2) and {hosts - 2 * clusters} single-node hosts "
            if clusters
            else "all single-node "
        )
        + f"(one compile configuration each kind, ports aside), `rolling_batch = {batch}` ({batches} batches), the stand-in "
        f"compiling {compile_s} s on a cache miss, on a cluster each node its own ranks (its speed model, not an MI300X). "
        "A cluster's start is its head's row.",
        "",
        *table,
        "",
        f"Median start: cold {statistics.median(cold):.0f} s, warm {statistics.median(warm):.0f} s."
        if cold and warm
        else "No cold or no warm start was recorded.",
    ]
    if cold and warm:
        kinds = (1 if clusters else 0) + (1 if hosts > 2 * clusters else 0)  # compile configurations: each builds once
        goal = kinds * statistics.median(cold) + (batches - kinds) * statistics.median(warm)
        lines.append(
            f"Goal of issue 34: one cold start per configuration ({kinds}) plus {batches - kinds} warm starts, {goal:.0f} s, "
            "plus the gates and the copies; " + "; ".join(f"{r['run']}: {r['seconds']:.0f} s" for r in rows) + "."
        )
    results = ROOT / "benchmarks" / "RESULTS.md"
    text = results.read_text()
    begin, end = markers(clusters)
    section = begin + "\n" + "\n".join(lines) + "\n" + end
    if begin in text:
        before, rest = text.split(begin, 1)
        text = before + section + rest.split(end, 1)[1]
    elif clusters and markers(0)[1] in text:  # after the section without clusters
        before, rest = text.split(markers(0)[1], 1)
        text = before + markers(0)[1] + "\n\n" + section + rest
    else:
        text = text.rstrip("\n") + "\n\n## Warm restarts: compile caches carried through a roll\n\n" + section + "\n"
    results.write_text(text)


if __name__ == "__main__":
    main()
