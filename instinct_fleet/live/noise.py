"""Telling a change from noise: the verdict the canary, ``tune`` and ``report`` give when two configurations are compared.

One run of a benchmark against one other run says little: on a busy host two runs of the same configuration
differ by a fifth or more, and the first requests after a restart are slow for reasons that have nothing to do
with the change (a measured run with no warm-up inflated an MI300X baseline about 3.9x in ROCm/iris PR #535).
So a difference counts only when all of these hold:

- it is beyond the relative threshold (the canary's ``canary_max_regression``);
- it is beyond an absolute floor per metric (``canary_floors``: a 0.9 ms TTFT change is not a regression of a
  serving fleet, whatever its percentage);
- it is beyond what the repeated runs show as noise. **The unit is the run**: the requests of one run share its
  conditions (a busy neighbour, a warm or a cold cache), so they are not independent draws, and a test that pools
  them sees a run-to-run difference as a real one (simulated with 5-25% run-to-run variation, a Mann-Whitney test
  over the pooled requests gave p < 0.001 in a fifth of harmless comparisons). The test is Student's two-sample
  t on the logarithm of each run's figure (the run's median TTFT, median TPOT, output throughput), pooled variance
  (a harmless change leaves the noise as it was), one-sided; it needs three runs in all. Where vLLM's per-request
  records are there (``--save-detailed``), the one-sided Mann-Whitney U test over them must agree as a second
  condition: it can only make a false alarm rarer.
- **Corrected for the comparisons made at once** (Bonferroni): the canary judges three figures, so each is tested
  at ``canary_alpha / 3`` and the canary as a whole raises a false alarm at most ``canary_alpha`` of the time;
  ``tune`` picks the best of K points, so the winner is tested at ``alpha / K``.

tests/unit/test_noise.py simulates harmless changes with run-to-run variation from 0 to 25% and measures the false
alarms against alpha, and measures how often 1.5x and 4x slowdowns are caught.

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


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz, as Numerical Recipes)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def _beta_regularised(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def student_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (no SciPy on the control machine)."""
    tail = 0.5 * _beta_regularised(df / 2, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1 - tail


def runs_greater(x: Sequence[float], y: Sequence[float]) -> float | None:
    """One-sided p that ``y``'s runs tend to be greater than ``x``'s: Student's two-sample t with pooled variance
    on the logarithms (a slowdown multiplies a figure), on the values themselves where one is not positive. None
    with fewer than three runs in all, or a side with none: no variance to judge by."""
    if not x or not y or len(x) + len(y) < 3:
        return None
    if min(*x, *y) > 0:
        x, y = [math.log(v) for v in x], [math.log(v) for v in y]
    n1, n2 = len(x), len(y)
    m1, m2 = sum(x) / n1, sum(y) / n2
    df = n1 + n2 - 2
    pooled = (sum((v - m1) ** 2 for v in x) + sum((v - m2) ** 2 for v in y)) / df
    if pooled <= 0:  # every run alike on each side: the difference is all there is
        return 0.5 if m1 == m2 else (0.0 if m2 > m1 else 1.0)
    return student_sf((m2 - m1) / math.sqrt(pooled * (1 / n1 + 1 / n2)), df)


@dataclass(frozen=True)
class Judged:
    """One metric compared: the figures (median over each side's runs), and which tests the difference passed."""

    metric: Metric
    before: float
    after: float
    runs: tuple[int, int]  # runs on each side
    beyond_limit: bool
    beyond_floor: bool
    p_runs: float | None  # Student's t over the runs, one-sided in the difference's direction (None: too few runs)
    p: float | None  # Mann-Whitney's one-sided p over the requests, the second condition (None: no per-request records)
    requests: tuple[int, int]  # per-request values on each side
    limit: float
    floor: float
    alpha: float  # the false-alarm rate of the whole comparison, split evenly over ``tests``
    tests: int = 1
    of: str = "figures"  # what the tests made at once are: the canary's figures, tune's points

    @property
    def level(self) -> float:
        """The significance level of this one test: ``alpha`` split over the tests made at once (Bonferroni)."""
        return self.alpha / self.tests

    @property
    def beyond_noise(self) -> bool:
        """The runs tell the difference at :attr:`level`, and the requests, where recorded, agree."""
        return self.p_runs is not None and self.p_runs < self.level and (self.p is None or self.p < self.level)

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
        if self.p_runs is None:
            return f"{self.runs[0]} and {self.runs[1]} runs: too few to judge the noise (3 in all at least)"
        split = f"alpha {self.alpha:g}" + (f" / {self.tests} {self.of} = {self.level:.2g}" if self.tests > 1 else "")
        said = f"t-test p={self.p_runs:.3g} over the {self.runs[0]} and {self.runs[1]} runs"
        if self.p is not None:
            said += f", Mann-Whitney p={self.p:.3g} over {self.requests[0]} and {self.requests[1]} requests"
        return f"{said} ({split})"

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


def figures(metric: Metric, runs: Sequence[Mapping[str, Any]]) -> list[float] | None:
    """Each run's figure of ``metric``; None when there are no runs or one lacks it (a side is judged whole)."""
    found = [float(r[metric.key]) for r in runs if isinstance(r.get(metric.key), int | float)]
    return found if found and len(found) == len(runs) else None


def judge(
    metric: Metric,
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    limit: float,
    floor: float,
    alpha: float,
    direction: Literal["worse", "better"] = "worse",
    tests: int = 1,
    of: str = "figures",
) -> Judged | None:
    """Compare one metric of two sides' runs (vLLM's result JSON each); None when a side lacks the figure.

    ``direction``: the canary asks whether the change made things worse; ``tune`` whether a point is better.
    ``alpha`` is split over ``tests``, the comparisons made at once (``of`` says what they are).
    """
    b, a = figures(metric, before), figures(metric, after)
    if b is None or a is None:
        return None
    mb, ma = median(b), median(a)
    bad = (mb - ma) if metric.higher_is_better else (ma - mb)  # > 0: worse
    moved = bad if direction == "worse" else -bad
    # Worse for a latency is larger; better is smaller: test the side that should be greater.
    larger_after = (direction == "worse") != metric.higher_is_better
    p_runs = runs_greater(b, a) if larger_after else runs_greater(a, b)
    p = None
    requests = (0, 0)
    if metric.per_request is not None:
        xb = [v for r in before for v in per_request(r, metric.per_request)]
        xa = [v for r in after for v in per_request(r, metric.per_request)]
        requests = (len(xb), len(xa))
        if xb and xa:
            p = mann_whitney_greater(xb, xa) if larger_after else mann_whitney_greater(xa, xb)
    return Judged(
        metric=metric,
        before=mb,
        after=ma,
        runs=(len(b), len(a)),
        beyond_limit=mb != 0 and moved / abs(mb) * 100 > limit,
        beyond_floor=moved > floor,
        p_runs=p_runs,
        p=p,
        requests=requests,
        limit=limit,
        floor=floor,
        alpha=alpha,
        tests=tests,
        of=of,
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
    """Judge every metric both sides report (``floors``: the absolute floor per metric key, 0 when absent), each at
    ``alpha`` over the number of metrics judged, so that the verdict is a false alarm at most ``alpha`` of the time."""
    judged = [m for m in METRICS if figures(m, before) is not None and figures(m, after) is not None]
    found = (judge(m, before, after, limit, floors.get(m.key, 0.0), alpha, direction, len(judged)) for m in judged)
    return Verdict(tuple(j for j in found if j is not None))


def spread(values: Sequence[float], digits: int = 1) -> str:
    """A figure over repeated runs as ``median (min-max, n runs)``; one run is just its value."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f}, {len(values)} runs)"
