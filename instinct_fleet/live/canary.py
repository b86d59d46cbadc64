"""The canary: a re-tune's first restart is one serving unit, measured before it stops and after its gate.

With ``canary_profile`` set, the roll's first restart batch holds exactly one
serving unit (instinct_fleet/roll/roll.py). Before it stops, each of its instances is
benchmarked with that profile (``vllm bench serve`` from the instance's own
image, on its host, as ``instinct-fleet bench`` runs it); after the health gate,
again, with the same profile, on the same host, from the same client. Each side is
``canary_warmup`` discarded requests, then ``canary_runs`` measured runs, every one kept.

The verdict (:mod:`instinct_fleet.live.noise`) counts a change as a regression only
when output throughput fell, or median TPOT or median TTFT rose, beyond
``canary_max_regression`` percent, beyond ``canary_floors`` and beyond the noise of the
runs. A regression is a failed batch: it is rolled back to its last healthy generation
and the roll stops, with the evidence in the summary. A change beyond the threshold and
the floor but within the noise is inconclusive: ``canary_inconclusive`` says whether the
roll proceeds (and says so) or treats it as a regression.

The runs are stored as ``bench`` stores its runs, under
``results/<UTC stamp>-canary-before`` and ``-canary-after``, so that
``instinct-fleet report`` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from instinct_fleet.live import accuracy, bench, noise
from instinct_fleet.model import probe, workload
from instinct_fleet.model.defaults import FleetVars
from instinct_fleet.model.spec import HostSpec, ServiceSpec

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
class Rule:
    """How the canary judges (the canary host's variables; validation keeps them one for the fleet)."""

    limit: float  # canary_max_regression
    floors: Mapping[str, float]  # canary_floors
    alpha: float  # canary_alpha
    inconclusive: Literal["proceed", "rollback"]  # canary_inconclusive
    probe_floor: float = 2.0  # canary_probe_floor
    probe_alpha: float = 0.001  # canary_probe_alpha

    @classmethod
    def of(cls, v: FleetVars) -> Rule:
        return cls(
            v.canary_max_regression,
            v.canary_floors.model_dump(),
            v.canary_alpha,
            v.canary_inconclusive,
            v.canary_probe_floor,
            v.canary_probe_alpha,
        )

    def compare(self, instance: str, before: list[dict[str, Any]], after: list[dict[str, Any]], comparisons: int = 1) -> Comparison:
        """The speed verdict on one of the canary's ``comparisons`` (each instance, each job of a multi-concurrency
        profile): each is judged at ``alpha / comparisons``, and within it over the figures it judges, so that the
        canary as a whole raises a false alarm at most ``alpha`` of the time (Bonferroni)."""
        return Comparison(instance, noise.compare(before, after, self.limit, self.floors, self.alpha / max(1, comparisons)))

    def compare_answers(
        self,
        instance: str,
        items: Sequence[probe.Item],
        before: Sequence[accuracy.Answer],
        after: Sequence[accuracy.Answer],
        instances: int,
    ) -> accuracy.Verdict:
        """The paired verdict on one of the canary's ``instances``: each is judged at ``probe_alpha / instances``, so
        that the canary as a whole raises a false alarm at most ``probe_alpha`` of the time (Bonferroni)."""
        return accuracy.compare(instance, items, before, after, self.probe_floor, self.probe_alpha / max(1, instances))

    def judged(self, found: Comparison | accuracy.Verdict) -> tuple[str | None, str]:
        """(why the canary fails, None when it passes or is inconclusive and the roll proceeds; the summary's line
        for a canary that did not fail), on speed or on answers."""
        outcome = found.verdict.outcome if isinstance(found, Comparison) else found.outcome
        evidence = found.evidence() if isinstance(found, Comparison) else f"{found.instance}: {found.evidence()}"
        if outcome == "passed" or (outcome == "inconclusive" and self.inconclusive == "proceed"):
            return None, f"canary {outcome}" + (", proceeding" if outcome == "inconclusive" else "") + f": {evidence}"
        return f"canary {outcome}" + (" (canary_inconclusive = rollback)" if outcome == "inconclusive" else "") + f": {evidence}", ""

    def problem(self, found: Comparison | accuracy.Verdict) -> str | None:
        """Why the canary fails (None: it passes, or is inconclusive and the roll proceeds)."""
        return self.judged(found)[0]


@dataclass(frozen=True)
class Comparison:
    """The canary's verdict on one instance: every run before and after the change, judged."""

    instance: str
    verdict: noise.Verdict

    def evidence(self) -> str:
        return f"{self.instance}: {self.verdict.evidence()}"

    def as_json(self) -> dict[str, Any]:
        """The summary's entry (``instinct-fleet deploy --json``)."""
        judged = self.verdict.judged
        return {
            "instance": self.instance,
            "outcome": self.verdict.outcome,
            "runs": list(judged[0].runs) if judged else [0, 0],
            "before": {j.metric.key: j.before for j in judged},
            "after": {j.metric.key: j.after for j in judged},
            "evidence": [j.evidence() for j in judged],
            "regressions": [j.evidence() for j in self.verdict.beyond()],
            "inconclusive": [j.evidence() for j in self.verdict.inconclusive()],
        }
