"""The series a PromQL expression reads, and where each is written: the helpers that hold the rule file
(tests/unit/test_slo.py) and the Grafana boards (tests/unit/test_boards.py) to the writers of what they query."""

from __future__ import annotations

import ast
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
    """The series the watch's /metrics writes: its tables of series (templates/watch.py's INSTANCE_SERIES and
    HOST_SERIES), read as Python reads them."""
    tree = ast.parse((ROOT / "instinct_fleet" / "templates" / "watch.py").read_text())
    tables = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id.endswith("_SERIES")
    }
    assert set(tables) == {"INSTANCE_SERIES", "HOST_SERIES"}, tables
    return {f"instinct_fleet_watch_{name}" for rows in tables.values() for name, _, _ in rows}


def standin_exposes(text: str, name: str) -> bool:
    """The stand-in's /metrics text has a sample of ``name``."""
    return re.search(rf"^{re.escape(name)}(\{{| )", text, re.M) is not None
