"""The series a PromQL expression reads, and where each is written: the helpers that hold the rule file
(tests/unit/test_slo.py) and the Grafana boards (tests/unit/test_boards.py) to the writers of what they query."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A metric name followed by its selector; PromQL's functions and aggregations are followed by "(", not "{".
SELECTED = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


def read(exprs: list[str]) -> set[str]:
    """Every metric name an expression selects (each is written with a selector here)."""
    return {name for expr in exprs for name in SELECTED.findall(expr)}


def in_table(table: dict[str, str], name: str) -> str | None:
    """The table's metric an exposed sample belongs to (a counter's _total, a histogram's _bucket and _count), as
    prometheus_client exposes it; None when the pinned vLLM's source creates no such metric."""
    for suffix, kind in (("_bucket", "histogram"), ("_count", "histogram"), ("_sum", "histogram"), ("_total", "counter")):
        if name.endswith(suffix) and table.get(name.removesuffix(suffix)) == kind:
            return name.removesuffix(suffix)
    return name if table.get(name) == "gauge" else None


def watch_writes() -> set[str]:
    """The series the watch's /metrics writes (templates/watch.py's TYPE lines)."""
    return set(re.findall(r"# TYPE (instinct_fleet_watch_\w+) ", (ROOT / "instinct_fleet" / "templates" / "watch.py").read_text()))


def standin_exposes(text: str, name: str) -> bool:
    """The stand-in's /metrics text has a sample of ``name``."""
    return re.search(rf"^{re.escape(name)}(\{{| )", text, re.M) is not None
