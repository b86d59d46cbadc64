"""What vLLM exports: its Prometheus metric names and kinds, its histograms' buckets, and the finish reasons."""

from __future__ import annotations

import ast
from typing import Any

METRIC_KINDS = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}


def prometheus_metrics(modules: dict[str, str]) -> dict[str, str]:
    """Every ``vllm:`` metric this version's V1 metrics modules create, with its kind (gauge, counter, histogram), as
    written in the source: prometheus_client exposes a counter with ``_total`` added and a histogram as ``_bucket``,
    ``_count`` and ``_sum`` series."""
    found: dict[str, str] = {}
    for path in sorted(p for p in modules if p.startswith("vllm/v1/metrics/")):
        if "_cls(" not in modules[path]:
            continue
        for node in ast.walk(ast.parse(modules[path])):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in METRIC_KINDS):
                continue
            name = next((k.value for k in node.keywords if k.arg == "name"), None)
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("vllm:"):
                found[name.value] = METRIC_KINDS[node.func.attr]
    return dict(sorted(found.items()))


def _bounds(node: ast.expr | None) -> list[float] | None:
    """A literal list or tuple of numbers, as floats; None for anything else."""
    if not isinstance(node, ast.List | ast.Tuple):
        return None
    values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
    numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return numbers if len(numbers) == len(node.elts) else None


def _bucket_families(buckets_py: str) -> dict[str, list[float]]:
    """vllm/v1/metrics/buckets.py (0.33.0 and later): each bucket family's default bounds, from its
    ``_STATIC_FAMILY_DEFAULTS`` table over the module's tuples (a family computed at run time, ``request_tokens``, has none)."""
    if not buckets_py:
        return {}
    tuples: dict[str, list[float]] = {}
    families: dict[str, list[float]] = {}
    for node in ast.parse(buckets_py).body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        value = node.value if isinstance(node, ast.AnnAssign | ast.Assign) else None
        if not isinstance(target, ast.Name):
            continue
        if (bounds := _bounds(value)) is not None:
            tuples[target.id] = bounds
        if target.id == "_STATIC_FAMILY_DEFAULTS" and isinstance(value, ast.Dict):
            for key, named in zip(value.keys, value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(named, ast.Name) and named.id in tuples:
                    families[str(key.value)] = tuples[named.id]
    return families


def histogram_buckets(modules: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The bucket bounds of every ``vllm:`` histogram whose bounds the source fixes: a literal at its constructor, a
    name bound to one in the same function, or (0.33.0 on) ``histogram_buckets("family", ...)``, whose family's
    defaults ``--custom-histogram-buckets`` may replace (``family`` says which key). A histogram whose bounds follow
    the model (``request_tokens``: its max_model_len) is left out. What an SLO's threshold must fall on."""
    families = _bucket_families(modules.get("vllm/v1/metrics/buckets.py", ""))
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in modules if p.startswith("vllm/v1/metrics/")):
        if "_histogram_cls(" not in modules[path]:
            continue
        for function in (n for n in ast.walk(ast.parse(modules[path])) if isinstance(n, ast.FunctionDef)):
            bound: dict[str, dict[str, Any]] = {}
            for node in ast.walk(function):
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                    continue
                call = node.value
                if (bounds := _bounds(call)) is not None:
                    bound[node.targets[0].id] = {"buckets": bounds}
                elif (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name)
                    and call.func.id == "histogram_buckets"
                    and call.args
                    and isinstance(call.args[0], ast.Constant)
                    and call.args[0].value in families
                ):
                    family = str(call.args[0].value)
                    bound[node.targets[0].id] = {"buckets": families[family], "family": family}
            for node in ast.walk(function):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_histogram_cls"):
                    continue
                keywords = {k.arg: k.value for k in node.keywords}
                name = keywords.get("name")
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and name.value.startswith("vllm:")):
                    continue
                given = keywords.get("buckets")
                if (bounds := _bounds(given)) is not None:
                    found[name.value] = {"buckets": bounds}
                elif isinstance(given, ast.Name) and given.id in bound:
                    found[name.value] = bound[given.id]
    return dict(sorted(found.items()))


def finish_reasons(engine_init: str) -> list[str]:
    """The ``finished_reason`` label values of ``vllm:request_success``: ``FINISH_REASON_STRINGS`` of
    vllm/v1/engine/__init__.py, which ``str(FinishReason)`` gives (0.22.0 adds ``error`` and ``repetition``)."""
    for node in ast.parse(engine_init).body:
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Tuple | ast.List):
            continue
        if any(isinstance(t, ast.Name) and t.id == "FINISH_REASON_STRINGS" for t in node.targets):
            return [str(e.value) for e in node.value.elts if isinstance(e, ast.Constant)]
    return []
