"""What vLLM's HTTP server answers, and which of its routes skip ``--api-key``.

vLLM checks the key in one ASGI middleware (``AuthenticationMiddleware``) and only on paths that start with its
guarded prefixes: ``/v1`` up to 0.11, then ``GUARDED_PREFIX`` (``/v1``, ``/v2``, ``/inference``, and ``/cohere``
from 0.33). Every other route answers without the key: ``/health`` and ``/metrics``, but also ``/tokenize``,
``/detokenize``, ``/invocations``, ``/pooling``, ``/score``, ``/classify``... Read from the source, never guessed,
so that the docs, ``plan`` and the firewall's reasons name exactly what the pinned version exposes.
"""

from __future__ import annotations

import ast
from typing import Any

VERBS = {"get", "post", "put", "delete", "patch"}


def guarded_prefixes(modules: dict[str, str]) -> list[str]:
    """The path prefixes the key guards: the module-level ``GUARDED_PREFIX`` tuple where the version has one, else the
    literal of ``url_path.startswith("...")`` inside ``AuthenticationMiddleware`` (0.11); empty when neither is found
    (the caller then says it cannot tell)."""
    for path in sorted(p for p in modules if p.startswith("vllm/entrypoints/")):
        text = modules[path]
        if "AuthenticationMiddleware" not in text and "GUARDED_PREFIX" not in text:
            continue
        tree = ast.parse(text)
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "GUARDED_PREFIX" for t in node.targets):
                values = node.value.elts if isinstance(node.value, ast.Tuple | ast.List) else [node.value]
                return [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "AuthenticationMiddleware"):
            for call in (n for n in ast.walk(cls) if isinstance(n, ast.Call)):
                if isinstance(call.func, ast.Attribute) and call.func.attr == "startswith" and call.args:
                    arg = call.args[0]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        return [arg.value]
    return []


def _path(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/") else None


def _methods(call: ast.Call, default: list[str]) -> list[str]:
    given = next((k.value for k in call.keywords if k.arg == "methods"), None)
    if isinstance(given, ast.List | ast.Tuple | ast.Set):
        return sorted(str(e.value).upper() for e in given.elts if isinstance(e, ast.Constant))
    return default


def routes(modules: dict[str, str]) -> list[dict[str, Any]]:
    """Every route the server modules declare: ``@router.get("/path")`` and the other verbs, ``api_route``,
    ``add_api_route`` and a ``Mount``/``mount`` (``/metrics``: any method), with the module that declares it.

    Which are attached depends on the model's tasks, a flag or ``VLLM_SERVER_DEV_MODE``: this lists what the version
    can serve, the superset a firewall must assume."""
    found: dict[tuple[str, tuple[str, ...]], str] = {}
    for name in sorted(p for p in modules if p.startswith("vllm/entrypoints/") and "/cli/" not in p):
        text = modules[name]
        if "route" not in text and "ount(" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            attr = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            key: tuple[str, tuple[str, ...]]
            if attr in VERBS and node.args and (path := _path(node.args[0])):
                key = (path, (attr.upper(),))
            elif (attr == "api_route" and node.args and (path := _path(node.args[0]))) or (
                attr == "add_api_route" and node.args and (path := _path(node.args[0]))
            ):
                key = (path, tuple(_methods(node, ["GET"])))
            elif attr in ("Mount", "mount") and node.args and (path := _path(node.args[0])):
                key = (path, ("*",))
            else:
                continue
            found.setdefault(key, name)
    return [{"path": path, "methods": list(methods), "module": module} for (path, methods), module in sorted(found.items())]


def keyless(table_routes: list[dict[str, Any]], prefixes: list[str]) -> list[str]:
    """The paths that answer without the key: those outside every guarded prefix, each once, sorted."""
    return sorted({r["path"] for r in table_routes if not r["path"].startswith(tuple(prefixes))})
