"""Telling a change from noise: the verdict the canary, ``tune`` and ``report`` give when two configurations are compared.

One run of a benchmark against one other run says little: on a busy host two runs of the same configuration
differ by a fifth or more, and the first requests after a restart are slow for reasons that have nothing to do
with the change (a measured run with no warm-up inflated an MI300X baseline about 3.9x in ROCm/iris PR #535).
So a difference counts only when all of these hold:

- it is beyond the relative threshold (the canary's ``canary_max_regression``);
- it is beyond an absolute floor per metric (``canary_floors``: a 0.9 ms TTFT change is not a regression of a
  serving fleet, whatever its percentage);
- it is beyond what the repeated runs show as noise. For TTFT and TPOT that is a one-sided Mann-Whitney U test over
  the requests of every run on each side (vLLM's per-request records, ``vllm bench serve --save-detailed``); for
  output throughput, which is one figure per run, the difference of the medians must exceed the spreads (max - min)
  of both sides' runs added up, so it needs two runs or more a side. Simulated with three runs a side of one
  configuration, that band is crossed by chance in 0.7% of comparisons (the spread of the baseline alone: 8.6%).

A difference beyond the threshold and the floor but not beyond the noise is *inconclusive*: what happens then is
the caller's setting (the canary's ``canary_inconclusive``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any, Literal

Status = Literal["within", "beyond", "inconclusive"]
Outcome = Literal["passed", "regressed", "inconclusive"]


@dataclass(frozen=True)
class Metric:
    """One figure of vLLM's result JSON that a comparison judges, and where its per-request values are."""

    key: str  # the run-level field of vLLM's result JSON (vllm/benchmarks/serve.py)
    label: str
    unit: str
    higher_is_better: bool
    per_request: Literal["ttft", "tpot"] | None  # the per-request series behind it, in --save-detailed's records


THROUGHPUT = Metric("output_throughput", "output throughput", "tok/s", True, None)
TPOT = Metric("median_tpot_ms", "median TPOT", "ms", False, "tpot")
TTFT = Metric("median_ttft_ms", "median TTFT", "ms", False, "ttft")
METRICS: tuple[Metric, ...] = (THROUGHPUT, TPOT, TTFT)


def change(before: float, after: float) -> float:
    """The change in percent; 0 when there was nothing to compare with."""
    return (after - before) / before * 100 if before else 0.0


def per_request(run: Mapping[str, Any], series: Literal["ttft", "tpot"]) -> list[float]:
    """One run's per-request TTFT or TPOT in ms, from vLLM's ``--save-detailed`` records (empty without them).

    vLLM saves ``ttfts`` (s) and ``itls`` (s, per request) for every request, and counts a request's TPOT as
    ``(latency - ttft) / (output_len - 1)`` where its latency is ``ttft + sum(itl)``; a request with an error, or
    with one output token (no TPOT), is left out as vLLM leaves it out of its medians.
    """
    ttfts, itls, lens = run.get("ttfts"), run.get("itls"), run.get("output_lens")
    errors = run.get("errors") or []
    if not isinstance(ttfts, list) or not isinstance(itls, list) or not isinstance(lens, list):
        return []
    values = []
    for i, (ttft, itl, length) in enumerate(zip(ttfts, itls, lens, strict=False)):
        if i < len(errors) and errors[i]:
            continue
        if series == "ttft":
            values.append(float(ttft) * 1000)
        elif isinstance(length, int) and length > 1 and isinstance(itl, list):
            values.append(sum(float(x) for x in itl) / (length - 1) * 1000)
    return values


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value that ``y`` tends to be greater than ``x`` (Mann-Whitney U, normal approximation with the
    tie correction and a continuity correction; 1.0 when a side is empty).

    The normal approximation is what SciPy uses by default for samples this size (a canary compares tens to
    hundreds of requests per side); tests/unit/test_noise.py checks it against the exact permutation
    distribution.
    """
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        return 1.0
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    n = n1 + n2
    rank_y = 0.0
    ties = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        rank = (i + j) / 2 + 1  # the mean rank of a run of ties
        rank_y += rank * sum(1 for k in range(i, j + 1) if pooled[k][1] == 1)
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    u = rank_y - n2 * (n2 + 1) / 2
    mean = n1 * n2 / 2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return 0.5 if u == mean else (0.0 if u > mean else 1.0)
    z = (u - mean - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass(frozen=True)
class Judged:
    """One metric compared: the figures (median over each side's runs), and which tests the difference passed."""

    metric: Metric
    before: float
    after: float
    runs: tuple[int, int]  # runs on each side
    beyond_limit: bool
    beyond_floor: bool
    band: float | None  # the spreads (max - min) of both sides' runs, added up (None: a side ran once)
    p: float | None  # Mann-Whitney's one-sided p in the difference's direction (None: no per-request records)
    requests: tuple[int, int]  # per-request values on each side
    limit: float
    floor: float
    alpha: float

    @property
    def beyond_noise(self) -> bool:
        if self.p is not None:
            return self.p < self.alpha
        return self.band is not None and abs(self.after - self.before) > self.band

    @property
    def status(self) -> Status:
        """``within`` the threshold or the floor; ``beyond`` all three; ``inconclusive``: beyond the threshold and
        the floor, not beyond the noise."""
        if not (self.beyond_limit and self.beyond_floor):
            return "within"
        return "beyond" if self.beyond_noise else "inconclusive"

    def figures(self) -> str:
        m = self.metric
        return f"{m.label} {self.before:.1f} -> {self.after:.1f} {m.unit} ({change(self.before, self.after):+.1f}%)"

    def noise(self) -> str:
        """The noise evidence, as the summary gives it."""
        if self.p is not None:
            return f"Mann-Whitney p={self.p:.3g} over {self.requests[0]} and {self.requests[1]} requests (alpha {self.alpha:g})"
        if self.band is not None:
            return f"the {self.runs[0]} and {self.runs[1]} runs' spreads add up to {self.band:.1f} {self.metric.unit}"
        return "one run a side: no noise band"

    def evidence(self) -> str:
        """The figures, and why they count or not."""
        head = self.figures()
        if not self.beyond_limit:
            return f"{head}: within {self.limit:g}%"
        if not self.beyond_floor:
            return f"{head}: within the floor of {self.floor:g} {self.metric.unit}"
        if self.beyond_noise:
            return f"{head}: beyond {self.limit:g}%, {self.floor:g} {self.metric.unit} and the noise ({self.noise()})"
        return f"{head}: beyond {self.limit:g}% and {self.floor:g} {self.metric.unit}, but within the noise ({self.noise()})"


def judge(
    metric: Metric,
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    limit: float,
    floor: float,
    alpha: float,
    direction: Literal["worse", "better"] = "worse",
) -> Judged | None:
    """Compare one metric of two sides' runs (vLLM's result JSON each); None when a side lacks the figure.

    ``direction``: the canary asks whether the change made things worse; ``tune`` whether a point is better.
    """
    b = [float(r[metric.key]) for r in before if isinstance(r.get(metric.key), int | float)]
    a = [float(r[metric.key]) for r in after if isinstance(r.get(metric.key), int | float)]
    if not b or not a or len(b) != len(before) or len(a) != len(after):
        return None
    mb, ma = median(b), median(a)
    bad = (mb - ma) if metric.higher_is_better else (ma - mb)  # > 0: worse
    moved = bad if direction == "worse" else -bad
    p = None
    requests = (0, 0)
    if metric.per_request is not None:
        xb = [v for r in before for v in per_request(r, metric.per_request)]
        xa = [v for r in after for v in per_request(r, metric.per_request)]
        requests = (len(xb), len(xa))
        if xb and xa:
            # Worse for a latency is larger; better is smaller: test the side that should be greater.
            larger_after = (direction == "worse") != metric.higher_is_better
            p = mann_whitney_greater(xb, xa) if larger_after else mann_whitney_greater(xa, xb)
    return Judged(
        metric=metric,
        before=mb,
        after=ma,
        runs=(len(b), len(a)),
        beyond_limit=mb != 0 and moved / abs(mb) * 100 > limit,
        beyond_floor=moved > floor,
        band=(max(b) - min(b)) + (max(a) - min(a)) if len(b) > 1 and len(a) > 1 else None,
        p=p,
        requests=requests,
        limit=limit,
        floor=floor,
        alpha=alpha,
    )


@dataclass(frozen=True)
class Verdict:
    """Every metric judged, and what they add up to: ``regressed`` when one is beyond all three tests (for
    ``direction="better"``: improved), ``inconclusive`` when one is beyond the threshold and the floor only."""

    judged: tuple[Judged, ...]

    @property
    def outcome(self) -> Outcome:
        statuses = {j.status for j in self.judged}
        if "beyond" in statuses:
            return "regressed"
        return "inconclusive" if "inconclusive" in statuses else "passed"

    def beyond(self) -> list[Judged]:
        return [j for j in self.judged if j.status == "beyond"]

    def inconclusive(self) -> list[Judged]:
        return [j for j in self.judged if j.status == "inconclusive"]

    def evidence(self) -> str:
        return "; ".join(j.evidence() for j in self.judged)


def compare(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    limit: float,
    floors: Mapping[str, float],
    alpha: float,
    direction: Literal["worse", "better"] = "worse",
) -> Verdict:
    """Judge every metric both sides report (``floors``: the absolute floor per metric key, 0 when absent)."""
    found = (judge(m, before, after, limit, floors.get(m.key, 0.0), alpha, direction) for m in METRICS)
    return Verdict(tuple(j for j in found if j is not None))


def spread(values: Sequence[float], digits: int = 1) -> str:
    """A figure over repeated runs as ``median (min-max, n runs)``; one run is just its value."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f}, {len(values)} runs)"
