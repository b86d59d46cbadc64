#!/usr/bin/env python3
"""Extract the env vars and ``vllm serve`` flags a vLLM release knows, from its own source.

Why: validation must not guess which names a pinned vLLM accepts. vLLM keeps its
env vars in one registry (``vllm/envs.py``: ``environment_variables``) and builds
the ``vllm serve`` parser from ``add_argument`` calls and config dataclasses. This
script reads those files with ``ast`` (it never imports vLLM, which needs a GPU
stack) and writes ``instinct_fleet/knowledge/vllm-<version>.json``.

Usage, from the repository root (pip fetches the wheel from the package registry):

    python scripts/extract_vllm_knowledge.py 0.33.0
    python scripts/extract_vllm_knowledge.py path/to/vllm-0.33.0-...whl

The wheel is read as a zip file; nothing from it is installed or executed.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent.parent / "instinct_fleet" / "knowledge"


def env_var_names(envs_source: str) -> list[str]:
    """Return the keys of ``environment_variables`` in vllm/envs.py."""
    tree = ast.parse(envs_source)
    for node in ast.walk(tree):
        value: ast.expr | None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "environment_variables" and isinstance(value, ast.Dict):
            return sorted(k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    raise SystemExit("environment_variables not found in vllm/envs.py")


class _Types:
    """Field annotations of every class and the Literal aliases of the scanned modules."""

    def __init__(self) -> None:
        self.fields: dict[str, dict[str, ast.expr]] = {}
        self.bases: dict[str, list[str]] = {}
        self.literals: dict[str, list[str]] = {}

    def add_module(self, source: str) -> None:
        tree = ast.parse(source)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
                self.fields[node.name] = {
                    item.target.id: item.annotation
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                }
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                value = node.value
                if isinstance(target, ast.Name) and value is not None:
                    choices = _literal_choices(value)
                    if choices:
                        self.literals[target.id] = choices

    def field(self, cls: str, name: str) -> ast.expr | None:
        seen: set[str] = set()
        todo = [cls]
        while todo:
            current = todo.pop(0)
            if current in seen:
                continue
            seen.add(current)
            if name in self.fields.get(current, {}):
                return self.fields[current][name]
            todo.extend(self.bases.get(current, []))
        return None

    def all_fields(self, cls: str) -> list[str]:
        names: list[str] = []
        for base in self.bases.get(cls, []):
            names.extend(n for n in self.all_fields(base) if n not in names)
        names.extend(n for n in self.fields.get(cls, {}) if n not in names)
        return names

    def describe(self, annotation: ast.expr | None) -> dict[str, object]:
        """Classify an annotation the way vLLM's ``get_kwargs`` does."""
        if annotation is None:
            return {"kind": "value"}
        names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
        names |= {n.value for n in ast.walk(annotation) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        if "bool" in names and "str" in names:
            return {"kind": "optional_value"}
        if "bool" in names:
            return {"kind": "bool"}
        choices = _literal_choices(annotation) or []
        for name in sorted(names):
            choices += [c for c in self.literals.get(name, []) if c not in choices]
        return {"kind": "value", "choices": choices} if choices else {"kind": "value"}


def _literal_choices(node: ast.expr) -> list[str] | None:
    """Return the string members of ``Literal[...]`` if ``node`` is one."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None


def _kwargs_sources(func: ast.AST) -> dict[str, str]:
    """Map ``x_kwargs`` variables to the class passed to ``get_kwargs(Class)``."""
    found: dict[str, str] = {}
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "get_kwargs"
            and node.value.args
            and isinstance(node.value.args[0], ast.Name)
        ):
            found[node.targets[0].id] = node.value.args[0].id
    return found


def serve_flags(parser_sources: list[str], types: _Types) -> tuple[dict[str, dict[str, object]], dict[str, str]]:
    """Collect every ``add_argument`` flag of the serve parser, and the frontend dataclass flags."""
    flags: dict[str, dict[str, object]] = {}
    aliases: dict[str, str] = {}
    for source in parser_sources:
        tree = ast.parse(source)
        kw_sources = _kwargs_sources(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
                continue
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")]
            if not names:
                continue
            long_names = [n for n in names if n.startswith("--")] or names
            info: dict[str, object] = {"kind": "value"}
            for kw in node.keywords:
                if kw.arg == "action":
                    value = kw.value
                    if isinstance(value, ast.Attribute) and value.attr == "BooleanOptionalAction":
                        info = {"kind": "bool"}
                    elif isinstance(value, ast.Constant) and value.value in ("store_true", "store_false"):
                        info = {"kind": "switch"}
                elif kw.arg == "choices" and isinstance(kw.value, (ast.List, ast.Tuple)):
                    info["choices"] = [e.value for e in kw.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                elif kw.arg is None:
                    # ``**x_kwargs["field"]``, possibly inside ``**{**x_kwargs["field"], ...}``
                    for sub in ast.walk(kw.value):
                        if (
                            isinstance(sub, ast.Subscript)
                            and isinstance(sub.value, ast.Name)
                            and sub.value.id in kw_sources
                            and isinstance(sub.slice, ast.Constant)
                        ):
                            field = types.field(kw_sources[sub.value.id], str(sub.slice.value))
                            info = types.describe(field)
                            break
            flags[long_names[0]] = info
            for other in names:
                if other != long_names[0]:
                    aliases[other] = long_names[0]
    for cls in types.fields:
        if cls.endswith("FrontendArgs") and cls != "BaseFrontendArgs":
            for name in types.all_fields(cls):
                flags.setdefault("--" + name.replace("_", "-"), types.describe(types.field(cls, name)))
    return dict(sorted(flags.items())), dict(sorted(aliases.items()))


def extract(wheel: Path) -> dict[str, object]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()

        def read(name: str) -> str:
            return zf.read(name).decode()

        envs = read("vllm/envs.py")
        types = _Types()
        parser_files = ["vllm/engine/arg_utils.py"]
        for name in names:
            if not name.endswith(".py"):
                continue
            if name.startswith("vllm/config/") or name == "vllm/engine/arg_utils.py":
                types.add_module(read(name))
            elif name.startswith("vllm/entrypoints/") and name.endswith("cli_args.py"):
                text = read(name)
                types.add_module(text)
                if "def make_arg_parser" in text:
                    parser_files.append(name)
        flags, aliases = serve_flags([read(n) for n in parser_files], types)
        version = wheel.name.split("-")[1]
        return {
            "version": version,
            "source": f"{wheel.name}: vllm/envs.py, " + ", ".join(parser_files),
            "env_vars": env_var_names(envs),
            "flags": flags,
            "aliases": aliases,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", help="a vLLM version (pip downloads its wheel) or a wheel path")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = Path(args.release)
        if not wheel.is_file():
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", f"vllm=={args.release}", "-d", tmp],
                check=True,
            )
            wheel = next(Path(tmp).glob("vllm-*.whl"))
        data = extract(wheel)
    out = args.out / f"vllm-{data['version']}.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"wrote {out}: {len(data['env_vars'])} env vars, {len(data['flags'])} flags")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
