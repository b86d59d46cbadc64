#!/usr/bin/env python3
"""What the default canary costs a deploy: the same harmless roll with it and without it.

On a light fleet of N single-node hosts (``tests/fleet/fleet.py up --hosts N``, the default recipe on each), it rolls
a new ``--max-num-seqs`` through every serving unit, ``rolling_batch`` at a time, alternately with the default canary
(the built-in ``canary`` profile, ``canary_runs`` runs a side after ``canary_warmup`` requests, and the accuracy
probe's ``canary_probe_size`` items) and with ``canary_profile = None``, ROUNDS times each. The canary's cost is the
difference of the medians of the wall times; it also reports the canary's verdicts, which must all pass (the change
is harmless). It writes its section of ``benchmarks/RESULTS.md``. Needs root (dockerd); not part of ``make test``.
Usage: ``sudo .venv/bin/python benchmarks/canary_cost.py [HOSTS] [BATCH] [ROUNDS]`` (default 4 2 3).
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

from warm_roll import FLEET, ROOT, inventory, run  # the light fleet's inventory and one deploy, as that benchmark runs them

BEGIN, END = "<!-- benchmarks/canary_cost.py writes from here to the end marker -->", "<!-- end of benchmarks/canary_cost.py -->"


def main() -> None:
    hosts, batch, rounds = (int(a) for a in (sys.argv[1:] + ["4", "2", "3"][len(sys.argv) - 1 :])[:3])
    subprocess.run([*FLEET, "down"], check=True)
    subprocess.run([*FLEET, "up", "--hosts", str(hosts)], check=True)
    common: dict[str, Any] = {"rolling_batch": batch, "rolling_drain_timeout": 5}
    times: dict[str, list[float]] = {"with the default canary": [], "canary_profile = None": []}
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        first, _ = run("deploy", inventory(Path(tmp), "base", {**common, "vllm_args": {"max-num-seqs": 100}}))
        print(f"first converge {first:.0f} s", flush=True)
        seqs = 100
        for _ in range(rounds):
            for label, extra in (("with the default canary", {}), ("canary_profile = None", {"canary_profile": None})):
                seqs += 8
                seconds, rows = run("deploy", inventory(Path(tmp), f"seqs{seqs}", {**common, **extra, "vllm_args": {"max-num-seqs": seqs}}))
                times[label].append(seconds)
                bad = [r for r in rows if r["status"] not in ("rolled", "unchanged")]
                if bad:
                    sys.exit(f"the harmless roll did not roll everywhere: {bad}")
                verdicts += [c["outcome"] for r in rows for c in r["canary"]] + [v["outcome"] for r in rows for v in r["accuracy"]]
                print(json.dumps({"run": label, "seconds": round(seconds, 1)}), flush=True)
    subprocess.run([*FLEET, "down"], check=True)
    write(times, verdicts, hosts, batch, rounds)


def write(times: dict[str, list[float]], verdicts: list[str], hosts: int, batch: int, rounds: int) -> None:
    on, off = (statistics.median(times[k]) for k in times)
    machine = f"{os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}"
    table = ["| roll | wall s, each round | median s |", "| --- | --- | --- |"]
    table += [f"| {label} | {', '.join(f'{s:.0f}' for s in runs)} | {statistics.median(runs):.0f} |" for label, runs in times.items()]
    counted = ", ".join(f"{verdicts.count(v)} {v}" for v in sorted(set(verdicts))) or "none"
    lines = [
        f"Measured by `benchmarks/canary_cost.py` on {time.strftime('%Y-%m-%d')}: {machine}; {hosts} single-node simulated "
        f"hosts (the default recipe on the stand-in, its speed model, not an MI300X), `rolling_batch = {batch}`, a harmless "
        f"new `--max-num-seqs` rolled {rounds} times each way, alternately.",
        "",
        *table,
        "",
        f"The default canary cost {on - off:.0f} s per deploy (the difference of the medians); its verdicts: {counted}.",
    ]
    results = ROOT / "benchmarks" / "RESULTS.md"
    text = results.read_text()
    section = BEGIN + "\n" + "\n".join(lines) + "\n" + END
    if BEGIN in text:
        before, rest = text.split(BEGIN, 1)
        text = before + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## The default canary's cost\n\n" + section + "\n"
    results.write_text(text)


if __name__ == "__main__":
    main()
