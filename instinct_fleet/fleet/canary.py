"""The canary: a re-tune's first restart is one serving unit, measured before it stops and after its gate.

With ``canary_profile`` set, the roll's first restart batch holds exactly one
serving unit (instinct_fleet/fleet/roll.py). Before it stops, each of its instances is
benchmarked with that profile (``vllm bench serve`` from the instance's own
image, on its host, as ``instinct-fleet bench`` runs it); after the health gate,
again, with the same profile, on the same host, from the same client. When
output throughput falls, or median TPOT or median TTFT rises, by more than
``canary_max_regression`` percent, the canary counts as a failed batch: it is
rolled back to its last healthy generation and the roll stops, with both
measurements in the summary. ``canary_runs`` repeats each measurement and
compares the means, for a profile too short to beat noise in one run.

Both measurements are stored as ``bench`` stores its runs, under
``results/<UTC stamp>-canary-before`` and ``-canary-after``, so that
``instinct-fleet report`` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import mean
from typing import Any

from instinct_fleet.fleet import bench
from instinct_fleet.model import workload
from instinct_fleet.model.spec import HostSpec, ServiceSpec

# vLLM's result fields the canary compares, and which way is better.
METRICS: tuple[tuple[str, str, str, bool], ...] = (
    ("output_throughput", "output throughput", "tok/s", True),
    ("median_tpot_ms", "median TPOT", "ms", False),
    ("median_ttft_ms", "median TTFT", "ms", False),
)
RESULTS = Path("results")


def runs(spec: HostSpec, svc: ServiceSpec, profile: str) -> list[tuple[workload.Job, int]]:
    """The canary's runs of one instance: each of the profile's jobs, ``canary_runs`` times (job, repeat)."""
    return [(job, repeat) for job in workload.jobs(spec, svc, profile, None, None) for repeat in range(spec.vars.canary_runs)]


def stamp(phase: str) -> str:
    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-canary-{phase}"


def store(results: Path, job: workload.Job, run: int, data: dict[str, Any]) -> None:
    """One run's JSON and the instance's config.json, where ``bench`` puts them (``run``: the repeat)."""
    started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    bench.save(results, job, data, bench.config(job, dict(job.svc.env), "", None, started), run)


@dataclass(frozen=True)
class Comparison:
    """The canary's two measurements of one instance (the mean over its runs) and what got worse."""

    instance: str
    before: dict[str, float]
    after: dict[str, float]
    regressions: tuple[str, ...]

    def figures(self) -> str:
        parts = []
        for key, label, unit, _ in METRICS:
            if key in self.before and key in self.after:
                parts.append(
                    f"{label} {self.before[key]:.1f} -> {self.after[key]:.1f} {unit} ({change(self.before[key], self.after[key]):+.1f}%)"
                )
        return f"{self.instance}: " + ", ".join(parts)


def change(before: float, after: float) -> float:
    """The change in percent; 0 when there was nothing to compare with."""
    return (after - before) / before * 100 if before else 0.0


def means(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        key: mean(float(r[key]) for r in runs) for key, *_ in METRICS if runs and all(isinstance(r.get(key), int | float) for r in runs)
    }


def compare(instance: str, before: list[dict[str, Any]], after: list[dict[str, Any]], limit: float) -> Comparison:
    """Whether the change made serving worse by more than ``limit`` percent, from vLLM's result JSON."""
    b, a = means(before), means(after)
    worse = []
    for key, label, unit, higher_is_better in METRICS:
        if key not in b or key not in a:
            continue
        delta = change(b[key], a[key])
        if (higher_is_better and delta < -limit) or (not higher_is_better and delta > limit):
            worse.append(f"{label} {b[key]:.1f} -> {a[key]:.1f} {unit} ({delta:+.1f}%, more than {limit:g}%)")
    return Comparison(instance, b, a, tuple(worse))
