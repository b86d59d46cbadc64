"""The one progress rule: an instance is live when its engine makes progress, not when ``/health`` answers.

vLLM's ``/health`` and ``/version`` answer 200 while the engine core is deadlocked
(vllm#39863): throughput 0, requests waiting. What a deadlock cannot fake is the
engine's step counters in ``/metrics``. The rule: while requests are running or
waiting (``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` above 0),
some step counter (``vllm:iteration_tokens_total``'s count, one per engine step;
``vllm:prompt_tokens``, ``vllm:generation_tokens``) must advance within the stall
window. An idle engine takes no steps and is never stalled.

Which names a version has comes from its own source (the ``metrics`` table that
``instinct-fleet vllm-facts`` extracts from vllm/v1/metrics/loggers.py), through
:func:`series`. This module uses the standard library alone: the watch on each
serving host runs this same file (``templates/watch.py`` imports it), and the
controller's gate, ``status`` and ``verify`` read the watch's verdict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Counters that advance when the engine steps, in the order they are preferred; and the gauges of pending work.
STEPS = ("vllm:iteration_tokens_total", "vllm:generation_tokens", "vllm:prompt_tokens")
BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# How prometheus_client exposes a metric of each type: a counter's samples end in _total, a histogram's count in _count.
SUFFIX = {"counter": "_total", "histogram": "_count", "gauge": ""}


@dataclass(frozen=True)
class Series:
    """The exposed sample names the rule reads: ``steps`` (any advancing is progress) and ``busy`` (their sum is the work)."""

    steps: tuple[str, ...]
    busy: tuple[str, ...]

    def as_json(self) -> dict[str, list[str]]:
        return {"steps": list(self.steps), "busy": list(self.busy)}


def series(table: dict[str, str]) -> Series | None:
    """The samples of a version's metrics table (name -> gauge, counter or histogram) the rule reads; None when the
    table lacks the gauges of pending work or every step counter (a version the rule cannot judge)."""

    def exposed(name: str) -> str:
        base = name[: -len("_total")] if table[name] == "counter" and name.endswith("_total") else name
        return base + SUFFIX.get(table[name], "")

    steps = tuple(exposed(n) for n in STEPS if n in table and table[n] in ("counter", "histogram"))
    busy = tuple(exposed(n) for n in BUSY if table.get(n) == "gauge")
    if not steps or len(busy) != len(BUSY):
        return None
    return Series(steps, busy)


# One sample line of the Prometheus text format: name, optional labels, value (timestamps are not sent by vLLM).
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{.*\})?\s+(\S+)")


@dataclass(frozen=True)
class Sample:
    """One reading: the step counters' sum and the requests running or waiting, each summed over its label sets."""

    steps: float
    busy: float


def sample(text: str, names: Series) -> Sample | None:
    """A reading of ``/metrics`` text; None when a busy gauge or every step counter is missing from it."""
    values: dict[str, float] = {}
    wanted = set(names.steps) | set(names.busy)
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in wanted:
            continue
        try:
            values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(2))
        except ValueError:
            return None
    if any(b not in values for b in names.busy) or not any(s in values for s in names.steps):
        return None
    return Sample(sum(values.get(s, 0.0) for s in names.steps), sum(values[b] for b in names.busy))


class Progress:
    """Seconds an instance has been busy without a step, from successive readings (one per instance)."""

    def __init__(self) -> None:
        self.steps: float | None = None
        self.since: float | None = None  # when it last stepped, or became busy

    def reset(self) -> None:
        """No reading (the instance is down, starting or paused): nothing is known, nothing is stalled."""
        self.steps, self.since = None, None

    def observe(self, now: float, reading: Sample) -> float:
        """Seconds without progress while busy, as of ``now``; 0 when it stepped since the last reading, or is idle."""
        stepped = self.steps is None or reading.steps != self.steps
        self.steps = reading.steps
        if reading.busy <= 0 or stepped or self.since is None:
            self.since = now
            return 0.0
        return now - self.since


def stalled(seconds: float, window: float) -> bool:
    """The verdict: busy without a step for the whole stall window."""
    return seconds >= window
