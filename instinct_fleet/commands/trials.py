"""A sweep's results: each trial, how trials are ranked (SLOs, Pareto fronts, the best point), and trials.json.

trials.json is rewritten after every trial (:class:`Results`), so an
interrupted sweep resumes with ``--resume DIR`` where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from instinct_fleet.commands.sweeps import Point, Slo, Sweep, TuneError, Value
from instinct_fleet.live import noise

# What tune.md and trials.json show of each trial; the Pareto front is output throughput against median TPOT.
SHOWN = ("output_throughput", "median_tpot_ms", "median_ttft_ms", "p99_ttft_ms", "p99_tpot_ms")


# Trials, their results and what they mean.


@dataclass
class Trial:
    """One point measured (or not) on one host; as it appears in trials.json."""

    settings: dict[str, Value]
    host: str
    status: str  # measured, failed or skipped
    baseline: bool = False
    figures: dict[str, float] = dataclasses.field(default_factory=dict)  # the median of each field over the runs
    runs: list[dict[str, float]] = dataclasses.field(default_factory=list)  # every measured run's figures, kept
    meets_slo: bool | None = None
    why: str | None = None
    journal: list[str] = dataclasses.field(default_factory=list)
    started: str | None = None
    seconds: float | None = None

    @property
    def point(self) -> Point:
        return Point(tuple(self.settings.items()), self.baseline)

    @property
    def key(self) -> str:
        return self.point.key

    def label(self) -> str:
        return self.point.label()


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each field's median over the runs that have it: a trial's figures."""
    keys = dict.fromkeys(key for run in runs for key in run)
    return {key: median(run[key] for run in runs if key in run) for key in keys}


def samples(trial: Trial) -> list[dict[str, float]]:
    """A trial's runs (a trials.json from before repeats holds only its one run's figures)."""
    return trial.runs or ([trial.figures] if trial.figures else [])


def gain(trial: Trial, base: Trial, floor: float, alpha: float, points: int) -> noise.Judged | None:
    """The trial's output throughput against the deployed configuration's: ``beyond`` only when it is higher by more
    than ``floor`` tok/s and beyond the noise of the runs (:mod:`instinct_fleet.live.noise`) at ``alpha`` split over
    the ``points`` it was picked from as the best: the best of many harmless points beats the baseline by chance
    more often than any one of them."""
    return noise.judge(noise.THROUGHPUT, samples(base), samples(trial), 0, floor, alpha, "better", max(1, points), "points")


def judge(figures: Mapping[str, Any], slos: tuple[Slo, ...]) -> bool:
    return all(slo.met(figures) for slo in slos)


def dominates(a: Trial, b: Trial, y: str) -> bool:
    ax, bx, ay, by = a.figures["output_throughput"], b.figures["output_throughput"], a.figures[y], b.figures[y]
    return ax >= bx and ay <= by and (ax > bx or ay < by)


def pareto(trials: list[Trial], y: str = "median_tpot_ms") -> list[Trial]:
    """The measured trials no other beats on both output throughput (higher) and ``y`` (lower), by throughput."""
    measured = [t for t in trials if t.status == "measured" and "output_throughput" in t.figures and y in t.figures]
    front = [t for t in measured if not any(dominates(other, t, y) for other in measured if other is not t)]
    return sorted(front, key=lambda t: -t.figures["output_throughput"])


def best(trials: list[Trial]) -> Trial | None:
    """The highest output throughput among the measured trials that meet every SLO."""
    ok = [t for t in trials if t.status == "measured" and t.meets_slo and "output_throughput" in t.figures]
    return max(ok, key=lambda t: t.figures["output_throughput"], default=None)


def baseline_for(trials: list[Trial], host: str) -> Trial | None:
    """The deployed configuration's trial on ``host``, else on any host."""
    bases = [t for t in trials if t.baseline and t.status == "measured"]
    return next((t for t in bases if t.host == host), bases[0] if bases else None)


class Results:
    """The sweep's directory: sweep.json, trials.json (rewritten after each trial), the runs, and the report."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.trials: list[Trial] = []
        path = directory / "trials.json"
        if path.is_file():
            try:
                raw = json.loads(path.read_text())
                self.trials = [Trial(**item) for item in raw]
            except (ValueError, TypeError) as exc:
                raise TuneError(f"{path} cannot be read back ({exc}); start a new sweep in another directory") from None

    @staticmethod
    def sweep_of(directory: Path) -> Sweep:
        path = directory / "sweep.json"
        if not path.is_file():
            raise TuneError(f"{directory} holds no sweep.json: --resume takes the directory of an earlier sweep")
        try:
            return Sweep.from_json(json.loads(path.read_text()))
        except ValueError as exc:
            raise TuneError(f"{path} cannot be read back ({exc})") from None

    def start(self, sweep: Sweep) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "sweep.json").write_text(json.dumps(sweep.as_json(), indent=2) + "\n")

    def done(self) -> set[str]:
        """Points already measured or failed (on any host, the baseline per host) that a resumed sweep skips."""
        return {t.point.done_key(t.host) for t in self.trials if t.status in ("measured", "failed")}

    def record(self, trial: Trial) -> None:
        replaced = trial.point.done_key(trial.host)
        self.trials = [t for t in self.trials if t.point.done_key(t.host) != replaced]
        self.trials.append(trial)
        self.save()

    def save(self) -> None:
        tmp = self.dir / "trials.json.tmp"
        tmp.write_text(json.dumps([dataclasses.asdict(t) for t in self.trials], indent=2) + "\n")
        tmp.replace(self.dir / "trials.json")

    def run_dir(self, point: Point, host: str) -> Path:
        name = "deployed" if point.baseline else re.sub(r"[^A-Za-z0-9_.=-]+", "_", point.label().replace(" ", "_"))
        return self.dir / "runs" / name / host
