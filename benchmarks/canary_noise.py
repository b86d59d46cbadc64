#!/usr/bin/env python3
"""Does the canary tell a regression from noise? 20 harmless changes, 20 at 1.5x slower, 20 at 4x, in one run.

On the simulated fleet (tests/fleet/fleet.py: the stand-in vLLM and its speed model, not an MI300X), two
single-node hosts serve the same instance, as a staging group does; each takes half of the trials, at the same
time (the machine has 2 cores, so each host's runs are measured on a busy machine, as the issue's were). A trial:

1. **before**: one run with no warm-up (what the canary ran until this change), then the canary's own
   measurement: ``canary_warmup`` discarded requests and ``canary_runs`` runs;
2. the change written and restarted behind the deploy's health gate (instinct-fleet tune's path:
   the same files, modes, owners and restarts);
3. **after**: the same two measurements, the first straight after the restart;
4. the deployed configuration restored behind the gate.

Each trial is judged by both rules on the same data: the rule before this change (one run a side, each figure
beyond ``canary_max_regression`` percent is a regression) and the verdict of instinct_fleet/live/noise.py with the
default variables, for 1, 2 and 3 runs a side (the first k runs). The changes: harmless is ``--max-num-seqs 200``
(the profile's 4 concurrent requests never reach either cap); the slowdowns divide the stand-in's decode and
prefill speeds by 1.5 and by 4. The profile is the issue's: 24 prompts at concurrency 4 (128 + 64 tokens).

It writes its section of benchmarks/RESULTS.md (between its markers) and the raw trials to
``benchmarks/canary_noise.json`` (``canary_noise_busy.json`` with ``--busy``). Needs root (dockerd) and the fleet of slot INSTINCT_FLEET_SLOT (started when
missing); it takes about half an hour and is not part of ``make test``. Usage:
``sudo .venv/bin/python benchmarks/canary_noise.py [--busy] [TRIALS_PER_KIND]`` (``--busy``: two busy loops on the
machine for the whole run); ``--rewrite`` writes the section again from both modes' last trials without a fleet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import fleetctl  # noqa: E402  (the simulated fleet's inventories and deploys, as the end-to-end tests use them)

from instinct_fleet.commands import trials, tune  # noqa: E402
from instinct_fleet.commands.sweeps import Point, Sweep  # noqa: E402
from instinct_fleet.live import bench, noise, remote  # noqa: E402
from instinct_fleet.model import workload  # noqa: E402
from instinct_fleet.model.defaults import CANARY_FLOORS, FleetVars  # noqa: E402
from instinct_fleet.model.inventory import load_inventory  # noqa: E402

HOSTS = ("sim-gpu-1", "sim-gpu-2")
# The canary: 24 prompts at concurrency 4, short enough that its median TTFT is a few milliseconds, where the
# machine's own jitter is a large share of every figure (with 2048-token prompts the stand-in's modelled prefill
# dominates TTFT, and both rules judged 33 trials alike).
PROFILE = {"dataset": "random", "input_len": 128, "output_len": 64, "num_prompts": 24, "concurrency": [4]}
KINDS: dict[str, dict[str, Any]] = {
    "harmless": {"--max-num-seqs": 200},
    "1.5x slower": {"STANDIN_TOKENS_PER_SECOND": "267", "STANDIN_PREFILL_TOKENS_PER_SECOND": "33333"},
    "4x slower": {"STANDIN_TOKENS_PER_SECOND": "100", "STANDIN_PREFILL_TOKENS_PER_SECOND": "12500"},
}
DEFAULTS = FleetVars()
RUNS = DEFAULTS.canary_runs
# The trials of each machine state: quiet (the fleet alone), and busy (--busy: two busy loops beside it, as a deploy
# restarting other units and pyinfra's own work load a 2-core controller that also hosts the fleet).
MODES = {"quiet": ROOT / "benchmarks" / "canary_noise.json", "busy": ROOT / "benchmarks" / "canary_noise_busy.json"}
HEADINGS = {"quiet": "The fleet alone on the machine", "busy": "With two busy loops beside the fleet (--busy)"}
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- benchmarks/canary_noise.py writes from here -->", "<!-- benchmarks/canary_noise.py writes up to here -->"


def old_rule(before: dict[str, Any], after: dict[str, Any], limit: float) -> bool:
    """The canary's rule until this change (instinct_fleet/live/canary.py at 98106c2): one run a side, and a
    regression when any figure is worse by more than ``limit`` percent."""
    for metric in noise.METRICS:
        b, a = before.get(metric.key), after.get(metric.key)
        if isinstance(b, int | float) and isinstance(a, int | float) and b:
            delta = noise.change(float(b), float(a))
            if (metric.higher_is_better and delta < -limit) or (not metric.higher_is_better and delta > limit):
                return True
    return False


def verdicts(single: Any, runs: Any) -> dict[str, str]:
    """The old rule's verdict on the single runs, then instinct_fleet/live/noise.py's for the first 1..RUNS runs a side."""
    found = {"old": "regressed" if old_rule(*single, DEFAULTS.canary_max_regression) else "passed"}
    for k in range(1, RUNS + 1):
        verdict = noise.compare(runs[0][:k], runs[1][:k], DEFAULTS.canary_max_regression, dict(CANARY_FLOORS), DEFAULTS.canary_alpha)
        found[f"new {k}"] = verdict.outcome
    return found


@dataclasses.dataclass
class Trial:
    kind: str
    host: str
    single: tuple[dict[str, Any], dict[str, Any]] = ({}, {})  # the one unwarmed run a side
    runs: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])  # the canary's runs a side, after its warm-up
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # per phase
    problem: str | None = None

    def verdicts(self) -> dict[str, str]:
        """The old rule's, then the new one's for 1..RUNS runs a side."""
        return verdicts(self.single, self.runs)

    def summary(self) -> dict[str, Any]:
        keep = ("output_throughput", "median_tpot_ms", "median_ttft_ms")
        return {
            "kind": self.kind,
            "host": self.host,
            "problem": self.problem,
            "verdicts": self.verdicts() if self.problem is None else {},
            "seconds": self.seconds,
            "single": [{k: r.get(k) for k in keep} for r in self.single],
            "runs": [[{k: r.get(k) for k in keep} for r in side] for side in self.runs],
        }


def measure(runner: remote.Hosts, host: str, job: workload.Job, warmup: int, count: int) -> tuple[list[dict[str, Any]], float]:
    """``count`` runs of ``job`` on ``host``, the first after ``warmup`` discarded requests: (vLLM's JSON each, seconds)."""
    started = time.monotonic()
    found = []
    for index in range(count):
        done = runner.run(host, bench.command(job, "canary-noise", None, warmup if index == 0 else 0), workload.time_limit([job]))
        data = bench.result_of(done.stdout) if done.ok else None
        if data is None:
            raise RuntimeError(f"{host}: vllm bench serve failed: {done.error or (done.stderr or done.stdout)[-500:]}")
        found.append(data)
    return found, time.monotonic() - started


def one(tuner: tune.HostTuner, runner: remote.Hosts, kind: str) -> Trial:
    """One trial on the tuner's host (the module docstring's four steps)."""
    trial = Trial(kind, tuner.name)
    deployed = tuner.deployed
    assert deployed is not None
    (job,) = workload.jobs(deployed.spec, tuner.service(deployed), "canary", None, None)
    try:
        (b0,), trial.seconds["old before"] = measure(runner, tuner.name, job, 0, 1)
        before, trial.seconds["new before"] = measure(runner, tuner.name, job, DEFAULTS.canary_warmup, RUNS)
        point = Point(tuple(KINDS[kind].items()), False)
        problem, _ = tuner.install(tuner.plan(point), f"canary noise benchmark: {kind}")
        if problem is not None:
            raise RuntimeError(f"{tuner.name}: the change did not start: {problem}")
        (a0,), trial.seconds["old after"] = measure(runner, tuner.name, job, 0, 1)
        after, trial.seconds["new after"] = measure(runner, tuner.name, job, DEFAULTS.canary_warmup, RUNS)
        trial.single, trial.runs = (b0, a0), (before, after)
    except RuntimeError as exc:
        trial.problem = str(exc)
    finally:
        problem = tuner.restore()
        if problem is not None:
            sys.exit(f"{tuner.name}: NOT restored: {problem}")
    return trial


def table(done: list[dict[str, Any]]) -> str:
    """Per kind: how often each rule rolled the change back (and the new rule's inconclusive verdicts)."""
    rules = ["old", *[f"new {k}" for k in range(1, RUNS + 1)]]
    head = "| change | trials | " + " | ".join(
        ("one run a side, 10% (the old rule)" if r == "old" else f"{r.split()[1]} run(s) a side, the new verdict") for r in rules
    )
    lines = [head + " |", "|---|---:|" + "---:|" * len(rules)]
    for kind in KINDS:
        judged = [verdicts(t["single"], t["runs"]) for t in done if t["kind"] == kind and t["problem"] is None]
        cells = []
        for rule in rules:
            regressed = sum(v[rule] == "regressed" for v in judged)
            inconclusive = sum(v[rule] == "inconclusive" for v in judged)
            cells.append(f"{regressed} rolled back" + (f", {inconclusive} inconclusive" if inconclusive else ""))
        lines.append(f"| {kind} | {len(judged)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def margins(done: list[dict[str, Any]]) -> str:
    """How close the old rule came to a false rollback: the largest worsening of each figure between the single
    runs of a harmless trial, and the smallest of a 1.5x slowdown."""
    parts = []
    for kind, pick in (("harmless", max), ("1.5x slower", min)):
        ok = [t for t in done if t["kind"] == kind and t["problem"] is None]
        if not ok:
            continue
        worst = []
        for metric in noise.METRICS:
            sign = -1 if metric.higher_is_better else 1
            changes = [sign * noise.change(t["single"][0][metric.key], t["single"][1][metric.key]) for t in ok]
            worst.append(f"{metric.label} {pick(changes):+.1f}%")
        parts.append(f"{kind}: {'largest' if pick is max else 'smallest'} worsening {', '.join(worst)}")
    return "; ".join(parts)


def cost(done: list[dict[str, Any]]) -> str:
    """What the canary's measurements take, per kind: the old rule's two runs against the new warm-ups and runs."""
    parts = []
    for kind in KINDS:
        ok = [t for t in done if t["kind"] == kind and t["problem"] is None]
        if not ok:
            continue
        old = statistics.median(t["seconds"]["old before"] + t["seconds"]["old after"] for t in ok)
        new = statistics.median(t["seconds"]["new before"] + t["seconds"]["new after"] for t in ok)
        parts.append(f"{kind}: {old:.0f} s for one run a side, {new:.0f} s for a warm-up and {RUNS} runs a side")
    return "; ".join(parts)


def measured_by() -> str:
    """Where and when the trials were measured: this machine today, after a run."""
    return (
        f"Measured by `benchmarks/canary_noise.py` on {datetime.now(UTC):%Y-%m-%d}: {platform.machine()}, "
        f"Linux {platform.release()}, Python {platform.python_version()};"
    )


def write(measured: str) -> None:
    """This benchmark's section of benchmarks/RESULTS.md, from the trials of each mode's last run (MODES); ``measured``
    says where and when they ran."""
    body = [
        BEGIN,
        f"{measured} two hosts at once (stand-in figures: the "
        f"simulated fleet's speed model, not an MI300X). Defaults: canary_warmup {DEFAULTS.canary_warmup}, canary_runs "
        f"{RUNS}, canary_max_regression {DEFAULTS.canary_max_regression:g}%, canary_floors {dict(CANARY_FLOORS)}, "
        f"canary_alpha {DEFAULTS.canary_alpha:g}. The profile: 24 prompts of 128 + 64 tokens at concurrency 4. Each "
        "trial is judged by both rules on the same runs. The table judges the recorded figures of each run again with "
        "the verdict of this checkout (the run-level test; the per-request test, its second condition, needs the "
        "request records, which the trials do not keep, and can only make a regression rarer).",
    ]
    body += ["", f"Runs a side against the verdict (simulated with the verdict's own code): {runs_simulation()}."]
    for mode, path in MODES.items():
        if not path.is_file():
            continue
        done = json.loads(path.read_text())
        failed = [t for t in done if t["problem"] is not None]
        body += ["", f"**{HEADINGS[mode]}** ({len(done)} trials):", "", table(done), ""]
        body.append(f"The old rule's margins (single runs): {margins(done)}.")
        body.append(f"What the canary's measurements take (medians; the restart is the same for both): {cost(done)}.")
        body += [f"Trials that could not run: {len(failed)} ({failed[0]['problem']})."] if failed else []
    text = "\n".join([*body, END])
    current = RESULTS.read_text()
    if BEGIN in current:
        current = current.split(BEGIN)[0] + text + current.split(END, 1)[1]
    else:
        current = current.replace("## Rolling re-tunes\n", "## Canary against noise\n\n" + text + "\n\n## Rolling re-tunes\n", 1)
    RESULTS.write_text(current)


def runs_simulation(draws: int = 2000) -> str:
    """Runs a side against the verdict: how often a harmless change is judged regressed at 10% run-to-run variation
    (no threshold, no floor: the noise test alone), and how often a 1.5x slowdown is caught at 5% with the defaults."""
    rng = random.Random(0)

    def side(n: int, variation: float, slower: float) -> list[dict[str, float]]:
        made = []
        for _ in range(n):
            factor = math.exp(rng.gauss(0, variation)) * slower
            made.append({"output_throughput": 726.0 / factor, "median_tpot_ms": 4.0 * factor, "median_ttft_ms": 45.0 * factor})
        return made

    floors, limit, alpha = dict(CANARY_FLOORS), DEFAULTS.canary_max_regression, DEFAULTS.canary_alpha
    parts = []
    for n in (2, 3, 5):
        alarms = sum(noise.compare(side(n, 0.1, 1), side(n, 0.1, 1), 0, {}, alpha).outcome == "regressed" for _ in range(draws))
        caught = sum(noise.compare(side(n, 0.05, 1), side(n, 0.05, 1.5), limit, floors, alpha).outcome == "regressed" for _ in range(draws))
        parts.append(f"{n} runs: {alarms / draws:.2%} false alarms, {caught / draws:.0%} of 1.5x slowdowns caught")
    return "; ".join(parts)


@contextlib.contextmanager
def busy(on: bool) -> Iterator[None]:
    """Two busy loops on the machine while the trials run, when ``on``."""
    loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(2 if on else 0)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def main() -> None:
    args = sys.argv[1:]
    if args == ["--rewrite"]:  # the section again from each mode's last trials, where and when they were measured
        found = re.search(r"Measured by `benchmarks/canary_noise.py` on [^;]*;", RESULTS.read_text())
        if found is None:
            sys.exit("benchmarks/RESULTS.md names no measurement of this benchmark to judge again: run it")
        write(f"{found.group(0).split(' (judged again')[0].rstrip(';')} (judged again on {datetime.now(UTC):%Y-%m-%d});")
        return
    mode = "busy" if "--busy" in args else "quiet"
    counts = [a for a in args if a != "--busy"]
    per_kind = int(counts[0]) if counts else 20
    if not fleetctl.FLEET_FILE.is_file():
        subprocess.run([*fleetctl.FLEET, "up"], cwd=ROOT, check=True)
    fleet = json.loads(fleetctl.FLEET_FILE.read_text())
    ports = {h["name"]: h["api_port"] for h in fleet["hosts"]}
    common = {"bench_profiles": {"canary": PROFILE}, "rolling_drain_timeout": 5}
    with tempfile.TemporaryDirectory() as scratch:
        inventory = fleetctl.inventory(
            Path(scratch),
            "canary-noise",
            {},
            {
                "sim-gpu-1": common,
                "sim-gpu-2": {
                    **common,
                    "vllm_env": {"HF_HUB_OFFLINE": "1"},
                    "vllm_instances": [{"name": "main", "recipe": "gpt-oss-120b", "port": ports["sim-gpu-2"]}],
                },
            },
        )
        ready = fleetctl.deploy("--limit", "sim-gpu-*", inventory=inventory)
        if ready.results["failed_hosts"]:
            sys.exit(f"the benchmark's inventory did not deploy: {ready.stderr[-3000:]}")
        hosts = load_inventory(inventory, str(ROOT))
        runner = remote.Hosts(inventory, str(ROOT))
        sweep = Sweep("main", vary_env=(("VLLM_LOGGING_LEVEL", ("INFO",)),))  # the tuner's plan needs a sweep
        results = trials.Results(Path(scratch) / "results")
        results.start(sweep)
        tuners = {h.name: tune.HostTuner(runner, h, sweep, results) for h in hosts if h.name in HOSTS}
        for tuner in tuners.values():
            problem = tuner.prepare()
            if problem is not None:
                sys.exit(f"{tuner.name}: {problem}")
        # Kinds interleaved, so that a drift of the machine's load over the run touches every kind alike.
        queue = [kind for _ in range(per_kind) for kind in KINDS]
        shares = {host: queue[index :: len(HOSTS)] for index, host in enumerate(HOSTS)}
        done: list[Trial] = []
        say: Callable[[str], None] = lambda line: print(line, flush=True)  # noqa: E731
        started = time.monotonic()

        def work(host: str, kinds: list[str]) -> None:
            for kind in kinds:
                trial = one(tuners[host], runner, kind)
                done.append(trial)
                say(f"[{len(done)}/{len(queue)}] {host} {kind}: {trial.problem or trial.verdicts()}")
                MODES[mode].write_text(json.dumps([t.summary() for t in done], indent=1) + "\n")

        with busy(mode == "busy"):
            runner.each(shares, work)
        wall = time.monotonic() - started
    summaries = [t.summary() for t in done]
    write(measured_by())
    print(f"{len(done)} trials in {wall / 60:.0f} min")
    print(table(summaries))
    print(margins(summaries))
    print(cost(summaries))


if __name__ == "__main__":
    main()
