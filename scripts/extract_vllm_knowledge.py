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


def _identifiers(node: ast.AST) -> set[str]:
    """Every name or attribute that ``node`` loads."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Load):
            found.add(sub.attr)
    return found


def _carriers(tree: ast.Module, index: dict[str, set[str | None]]) -> None:
    """Add, for every identifier ``tree`` loads, the symbols whose value that load feeds.

    A load inside an assignment feeds the assigned name (or attribute); a load
    elsewhere inside a function feeds the function; a load anywhere else is used
    as the module runs, which is written ``None``.
    """

    def visit(node: ast.AST, scope: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in node.body:
                visit(stmt, node.name)
            for outer in (*node.decorator_list, *node.args.defaults, *[d for d in node.args.kw_defaults if d is not None]):
                visit(outer, scope)  # evaluated where the function is defined
            return
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                visit(stmt, scope)
            return
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id if isinstance(t, ast.Name) else t.attr for t in targets if isinstance(t, (ast.Name, ast.Attribute))]
            if len(names) == 1:
                for ident in _identifiers(node.value):
                    index.setdefault(ident, set()).add(names[0])
                return
        if isinstance(node, ast.expr):
            for ident in _identifiers(node):
                index.setdefault(ident, set()).add(scope)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, None)


def unread_env_vars(names: list[str], modules: dict[str, str]) -> list[str]:
    """The env vars vLLM defines in envs.py but never lets reach running code.

    Why: a variable that is parsed but never read silently does nothing (0.22.0
    reads VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION into a class attribute whose only
    reader is a method nobody calls). A variable is read when a load of
    ``envs.NAME`` (or its name as a string) outside envs.py feeds, through
    assignments and functions, code that something else uses. Symbols are matched
    by name across the whole tree, so the answer errs towards "read".
    """
    index: dict[str, set[str | None]] = {}
    strings: set[str] = set()
    for path, text in modules.items():
        if path == "vllm/envs.py":
            continue
        tree = ast.parse(text)
        _carriers(tree, index)
        strings |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    def used(symbol: str, depth: int, seen: frozenset[str]) -> bool:
        # Followed until module-level code, deep enough for attribute -> accessor -> caller
        # chains; anything deeper is taken as read.
        if depth > 6:
            return True
        return any(c is None or (c not in seen and used(c, depth + 1, seen | {c})) for c in index.get(symbol, set()) - {symbol})

    # os.environ["NAME"] or a list of names counts as read.
    return [name for name in names if name not in strings and not used(name, 0, frozenset({name}))]


class _Types:
    """Field annotations of every class, the Literal aliases and the Enum members of the scanned modules."""

    def __init__(self) -> None:
        self.fields: dict[str, dict[str, ast.expr]] = {}
        self.bases: dict[str, list[str]] = {}
        self.literals: dict[str, list[str]] = {}
        self.enums: dict[str, list[str]] = {}
        self.defaults: dict[str, dict[str, object]] = {}

    def add_enums(self, source: str) -> None:
        """Enum classes anywhere in vLLM: configs convert names to members with ``Enum[value.upper()]``."""
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id == "Enum") or (isinstance(b, ast.Attribute) and b.attr == "Enum") for b in node.bases
            ):
                members = [
                    t.id
                    for item in node.body
                    if isinstance(item, ast.Assign)
                    for t in item.targets
                    if isinstance(t, ast.Name) and t.id.isupper()
                ]
                if members:
                    self.enums[node.name] = members

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
                self.defaults[node.name] = {
                    item.target.id: item.value.value
                    for item in node.body
                    if isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and isinstance(item.value, ast.Constant)
                    and isinstance(item.value.value, (str, int, float, bool))
                }
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                value = node.value
                if isinstance(target, ast.Name) and value is not None:
                    choices = _literal_choices(value)
                    if choices:
                        self.literals[target.id] = choices

    def owner(self, cls: str, name: str) -> str | None:
        """The class, ``cls`` or one of its bases, that declares field ``name``."""
        seen: set[str] = set()
        todo = [cls]
        while todo:
            current = todo.pop(0)
            if current in seen:
                continue
            seen.add(current)
            if name in self.fields.get(current, {}):
                return current
            todo.extend(self.bases.get(current, []))
        return None

    def field(self, cls: str, name: str) -> ast.expr | None:
        owner = self.owner(cls, name)
        return None if owner is None else self.fields[owner][name]

    def default(self, cls: str, name: str) -> object | None:
        """The field's default when it is a plain constant (None otherwise, or when it is None)."""
        owner = self.owner(cls, name)
        return None if owner is None else self.defaults.get(owner, {}).get(name)

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
        if choices:
            return {"kind": "value", "choices": choices}
        enums = [self.enums[n] for n in sorted(names) if n in self.enums]
        if len(enums) == 1:
            return {"kind": "value", "choices": enums[0], "choices_case": "upper"}
        configs = [n for n in sorted(names) if n.endswith("Config") and n in self.fields]
        if len(configs) == 1 and isinstance(annotation, ast.Name):
            return {"kind": "value", "json_fields": self.json_fields(configs[0])}
        return {"kind": "value"}

    def json_fields(self, cls: str) -> dict[str, dict[str, object]]:
        """The keys a JSON config flag accepts (its config forbids others) and their choices."""
        out: dict[str, dict[str, object]] = {}
        for name in self.all_fields(cls):
            if name.startswith("_"):
                continue
            annotation = self.field(cls, name)
            if annotation is None or any(isinstance(n, ast.Name) and n.id == "InitVar" for n in ast.walk(annotation)):
                continue
            info = self.describe(annotation) if not (isinstance(annotation, ast.Name) and annotation.id.endswith("Config")) else {}
            out[name] = {k: v for k, v in info.items() if k in ("choices", "choices_case")}
        return out


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
                            default = types.default(kw_sources[sub.value.id], str(sub.slice.value))
                            if default is not None:
                                info["default"] = default
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
        modules = {name: read(name) for name in names if name.startswith("vllm/") and name.endswith(".py")}
        for text in modules.values():
            types.add_enums(text)
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
        env_vars = env_var_names(envs)
        return {
            "version": version,
            "source": f"{wheel.name}: vllm/envs.py, " + ", ".join(parser_files) + "; reads and enums: every vllm/*.py",
            "env_vars": env_vars,
            "env_unread": unread_env_vars(env_vars, modules),
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
