#!/usr/bin/env python3
"""Extract the env vars and ``vllm serve`` flags a vLLM release knows, from its own source.

Why: validation must not guess which names a pinned vLLM accepts. vLLM keeps its
env vars in one registry (``vllm/envs.py``: ``environment_variables``) and builds
the ``vllm serve`` parser from ``add_argument`` calls and config dataclasses. This
module reads those files with ``ast`` (it never imports vLLM, which needs a GPU
stack) from a wheel (a zip file: nothing is installed or executed) and returns the
table ``instinct_fleet/model/knowledge/vllm-<version>.json`` holds for the shipped
versions. ``instinct-fleet vllm-facts VERSION`` stores one in a project;
``scripts/extract_vllm_knowledge.py VERSION`` regenerates a shipped one.
"""

from __future__ import annotations

import ast
import base64
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any


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


def compile_env(envs_source: str, env_vars: list[str]) -> list[str]:
    """The env vars vLLM folds into its torch.compile cache key: ``compile_factors`` hashes every known one but
    its ``ignored_factors`` set; older releases' ``compute_hash`` hashes the ``environment_variables_to_hash`` list."""
    for node in ast.walk(ast.parse(envs_source)):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if not isinstance(target, ast.Name) or not isinstance(node.value, (ast.Set, ast.List)):
            continue
        names = {e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if target.id == "ignored_factors":
            return sorted(set(env_vars) - names)
        if target.id == "environment_variables_to_hash":
            return sorted(names & set(env_vars))
    raise SystemExit("neither ignored_factors nor environment_variables_to_hash found in vllm/envs.py")


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
        self.literal_nodes: dict[str, ast.expr] = {}
        self.enums: dict[str, list[str]] = {}
        self.defaults: dict[str, dict[str, object]] = {}
        self.constraints: dict[str, dict[str, dict[str, float]]] = {}
        self.unsettable: dict[str, set[str]] = {}
        self.decorated: set[str] = set()  # classes under vLLM's @config: pydantic dataclasses that forbid unknown keys

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
                if any(
                    (isinstance(d, ast.Name) and d.id == "config")
                    or (isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "config")
                    for d in node.decorator_list
                ):
                    self.decorated.add(node.name)
                self.bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
                self.fields[node.name] = {
                    item.target.id: item.annotation
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                }
                self.defaults[node.name] = {}
                self.constraints[node.name] = {}
                self.unsettable[node.name] = set()
                for item in node.body:
                    if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                        continue
                    name, value = item.target.id, item.value
                    if _is_field_call(value):
                        assert isinstance(value, ast.Call)
                        keywords = {kw.arg: kw.value for kw in value.keywords if kw.arg}
                        bounds = {k: _number(keywords[k]) for k in ("gt", "ge", "lt", "le") if k in keywords}
                        if any(v is not None for v in bounds.values()):
                            self.constraints[node.name][name] = {k: v for k, v in bounds.items() if v is not None}
                        init = keywords.get("init")
                        if isinstance(init, ast.Constant) and init.value is False:
                            self.unsettable[node.name].add(name)
                        value = keywords.get("default")
                    if isinstance(value, ast.Constant) and isinstance(value.value, (str, int, float, bool)):
                        self.defaults[node.name][name] = value.value
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                value = node.value
                if isinstance(target, ast.Name) and value is not None and _literal_choices(value) is not None:
                    self.literal_nodes[target.id] = value

    def configs(self) -> set[str]:
        """Classes a JSON config flag parses into: the ``...Config`` classes and every other ``@config`` class."""
        return {name for name in self.fields if name.endswith("Config")} | (self.decorated & set(self.fields))

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

    def literal(self, alias: str, seen: frozenset[str] = frozenset()) -> list[str]:
        """The strings of a ``Literal`` alias, with the members of the aliases it nests (``Literal["eagle", MTPModelTypes]``)."""
        node = self.literal_nodes.get(alias)
        if node is None or alias in seen or not isinstance(node, ast.Subscript):
            return []
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        out: list[str] = []
        for elt in elts:
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                out.append(elt.value)
            elif isinstance(elt, ast.Name):
                out += self.literal(elt.id, seen | {alias})
        return list(dict.fromkeys(out))

    def constraint(self, cls: str, name: str) -> dict[str, float]:
        """The field's pydantic bounds (``Field(gt=..., ge=..., lt=..., le=...)``), which vLLM checks when it builds the config."""
        owner = self.owner(cls, name)
        return {} if owner is None else self.constraints.get(owner, {}).get(name, {})

    def settable(self, cls: str, name: str) -> bool:
        """False for ``Field(init=False)``: the config computes it, and a value given for it is refused."""
        owner = self.owner(cls, name)
        return owner is None or name not in self.unsettable.get(owner, set())

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
            choices += [c for c in self.literal(name) if c not in choices]
        if choices:
            return {"kind": "value", "choices": choices}
        enums = [self.enums[n] for n in sorted(names) if n in self.enums]
        if len(enums) == 1:
            return {"kind": "value", "choices": enums[0], "choices_case": "upper"}
        config = _config_class(annotation, self.configs())
        if config is not None:
            return {"kind": "value", "json_fields": self.json_fields(config, (config,))}
        json_form = _json_form(annotation)
        if json_form is not None:
            return {"kind": "value", "json": json_form}
        return {"kind": "value"}

    def json_fields(self, cls: str, seen: tuple[str, ...]) -> dict[str, dict[str, object]]:
        """The keys a JSON config flag accepts (vLLM's ``@config`` forbids others), recursively into nested configs.

        Each key carries its choices, its pydantic bounds, ``settable: false`` where the
        config computes the field itself, and ``fields`` for a nested config.
        """
        out: dict[str, dict[str, object]] = {}
        for name in self.all_fields(cls):
            if name.startswith("_"):
                continue
            annotation = self.field(cls, name)
            if annotation is None or any(isinstance(n, ast.Name) and n.id == "InitVar" for n in ast.walk(annotation)):
                continue
            nested = _config_class(annotation, self.configs())
            info: dict[str, object] = {}
            if nested is not None and nested not in seen:
                info["fields"] = self.json_fields(nested, (*seen, nested))
            elif nested is None:
                info = {k: v for k, v in self.describe(annotation).items() if k in ("choices", "choices_case")}
            bounds = self.constraint(cls, name)
            if bounds:
                info["bounds"] = bounds
            if not self.settable(cls, name):
                info["settable"] = False
            out[name] = info
        return out


def _is_field_call(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id in ("Field", "field"))
        or (isinstance(node.func, ast.Attribute) and node.func.attr in ("Field", "field"))
    )


def _number(node: ast.expr) -> float | None:
    """A numeric constant, negative ones included."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    return None


def _config_class(annotation: ast.expr, known: set[str]) -> str | None:
    """The config class an annotation names, alone, with None, or beside the plain ``dict`` it is built from with
    ``**`` (``X``, ``X | None``, ``Optional[X]``, ``"X"``, ``dict[str, Any] | X | None``)."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        rest = [p for p in _union_members(annotation) if not (isinstance(p, ast.Constant) and p.value is None) and not _is_dict(p)]
        return _config_class(rest[0], known) if len(rest) == 1 else None
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name) and annotation.value.id == "Optional":
        return _config_class(annotation.slice, known)
    if isinstance(annotation, ast.Name) and annotation.id in known:
        return annotation.id
    return None


BUILTIN_HEADS = {"bool", "str", "int", "float", "list", "tuple", "set", "dict", "None", "Any", "Literal"}


def _json_form(annotation: ast.expr) -> str | None:
    """How ``get_kwargs`` parses a flag whose type is a ``dict`` (its union's own members, not their arguments):
    ``"object"`` when it is ``json.loads`` alone, ``"object-or-string"`` when ``union_dict_and_str`` reads a value
    shaped ``{...}`` as JSON and keeps any other as a string (a ``str`` or a class beside the dict). None when a
    member the chain tries first (bool, Literal, tuple, list, set, int, float) decides, or no dict is in it."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name) and annotation.value.id == "Optional":
        annotation = annotation.slice
    heads = set()
    for member in _union_members(annotation):
        target = member.value if isinstance(member, ast.Subscript) else member
        if isinstance(member, ast.Constant) and member.value is None:
            heads.add("None")
        elif isinstance(target, ast.Name):
            heads.add(target.id)
        else:
            return None
    if "dict" not in heads or heads & {"bool", "Literal", "tuple", "list", "set", "int", "float"}:
        return None
    return "object-or-string" if "str" in heads or heads - BUILTIN_HEADS else "object"


def _union_members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return [*_union_members(node.left), *_union_members(node.right)]
    return [node]


def _is_dict(node: ast.expr) -> bool:
    """``dict`` or ``dict[...]``: the JSON form a config is built from with ``**``."""
    target = node.value if isinstance(node, ast.Subscript) else node
    return isinstance(target, ast.Name) and target.id == "dict"


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


def serve_flags(parser_sources: list[str], types: _Types, frontend: bool = True) -> tuple[dict[str, dict[str, object]], dict[str, str]]:
    """Collect every ``add_argument`` flag of the serve parser, and (``frontend``) the frontend dataclass flags."""
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
                            bounds = types.constraint(kw_sources[sub.value.id], str(sub.slice.value))
                            if bounds:
                                info["bounds"] = bounds
                            break
            flags[long_names[0]] = info
            for other in names:
                if other != long_names[0]:
                    aliases[other] = long_names[0]
    for cls in types.fields if frontend else ():
        if cls.endswith("FrontendArgs") and cls != "BaseFrontendArgs":
            for name in types.all_fields(cls):
                flags.setdefault("--" + name.replace("_", "-"), types.describe(types.field(cls, name)))
    return dict(sorted(flags.items())), dict(sorted(aliases.items()))


QUANT_INIT = "vllm/model_executor/layers/quantization/__init__.py"
ROCM_PLATFORM = "vllm/platforms/rocm.py"
BACKEND_REGISTRY = "vllm/v1/attention/backends/registry.py"


def _module_list(tree: ast.Module, name: str) -> list[str] | None:
    """The strings of a module-level ``NAME = [...]`` or ``NAME: T = [...]``, or of ``NAME = Literal[...]``."""
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        value = node.value
        if isinstance(target, ast.Name) and target.id == name and value is not None:
            if isinstance(value, (ast.List, ast.Tuple)):
                return [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            return _literal_choices(value)
    return None


def _class_list(tree: ast.Module, cls: str, name: str) -> list[str] | None:
    """The strings of a class attribute ``name = [...]`` of class ``cls``."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return _module_list(ast.Module(body=node.body, type_ignores=[]), name)
    return None


def quantization_table(modules: dict[str, str]) -> dict[str, object]:
    """Which ``--quantization`` names vLLM knows, which it deprecates, and which its ROCm platform runs.

    Why: ``ModelConfig._verify_quantization`` raises on an unknown method, on one the
    platform's ``supported_quantization`` lacks, and on a deprecated one unless
    ``--allow-deprecated-quantization`` is given; ``--quantization`` itself takes any string.
    """
    init = ast.parse(modules[QUANT_INIT])
    methods = _module_list(init, "QuantizationMethods") or _module_list(init, "QUANTIZATION_METHODS") or []
    deprecated = _module_list(init, "DEPRECATED_QUANTIZATION_METHODS") or []
    rocm = _class_list(ast.parse(modules[ROCM_PLATFORM]), "RocmPlatform", "supported_quantization") or []
    model_config = modules.get("vllm/config/model.py", "")
    return {
        "source": f"{QUANT_INIT} (QuantizationMethods, DEPRECATED_QUANTIZATION_METHODS), {ROCM_PLATFORM} (RocmPlatform.supported_quantization)",
        "methods": methods,
        "deprecated": deprecated,
        "deprecated_flag": "--allow-deprecated-quantization" if "allow_deprecated_quantization" in model_config else None,
        "rocm": rocm,
        # ROCm's verify_quantization sets VLLM_USE_TRITON_AWQ=1 itself for AWQ (0.22.0 on).
        "rocm_sets_env": ["VLLM_USE_TRITON_AWQ"]
        if re.search(r'os\.environ\["VLLM_USE_TRITON_AWQ"\]\s*=\s*"1"', modules[ROCM_PLATFORM])
        else [],
    }


def _returns_constant(func: ast.FunctionDef) -> object:
    """What a method returns when its body is one ``return CONSTANT`` (docstring aside); ``...`` otherwise."""
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Constant):
        return body[0].value.value
    return ...


def _block_sizes(func: ast.FunctionDef) -> list[int | str] | None:
    """``get_supported_kernel_block_sizes``: ints, and ``"*N"`` for ``MultipleOf(N)``."""
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.List):
        return None
    sizes: list[int | str] = []
    for elt in body[0].value.elts:
        if isinstance(elt, ast.Constant) and isinstance(elt.value, int):
            sizes.append(elt.value)
        elif isinstance(elt, ast.Call) and elt.args and isinstance(elt.args[0], ast.Constant) and isinstance(elt.args[0].value, int):
            sizes.append(f"*{elt.args[0].value}")
        else:
            return None
    return sizes


def _modulo_check(func: ast.FunctionDef) -> int | None:
    """An overridden ``supports_block_size`` that ends in ``return block_size % N == 0``."""
    last = func.body[-1]
    if (
        isinstance(last, ast.Return)
        and isinstance(last.value, ast.Compare)
        and isinstance(last.value.left, ast.BinOp)
        and isinstance(last.value.left.op, ast.Mod)
        and isinstance(last.value.left.right, ast.Constant)
        and isinstance(last.value.left.right.value, int)
    ):
        return last.value.left.right.value
    return None


def attention_backends(modules: dict[str, str]) -> dict[str, object]:
    """What each attention backend ROCm can pick accepts, as ``validate_configuration`` checks it.

    Why: an explicit ``--attention-backend`` that refuses the configuration stops vLLM
    at start-up ("Selected backend ... is not valid for this configuration"), and an
    automatic choice fails when no ROCm backend accepts it. Read: the backends named
    in rocm.py's ``_get_backend_priorities``, their classes from the registry enum, and
    per class (with its bases) ``supported_kv_cache_dtypes``,
    ``get_supported_kernel_block_sizes`` or a ``supports_block_size`` override,
    ``is_mla``, ``is_sparse`` and ``supports_sink``. Versions whose ROCm backend choice
    is code rather than these declarations (0.11.0) get no table.
    """
    rocm = ast.parse(modules[ROCM_PLATFORM])
    priorities = next((n for n in ast.walk(rocm) if isinstance(n, ast.FunctionDef) and n.name == "_get_backend_priorities"), None)
    if priorities is None or BACKEND_REGISTRY not in modules:
        return {}
    names = sorted(
        {
            n.attr
            for n in ast.walk(priorities)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "AttentionBackendEnum"
        }
    )
    paths: dict[str, str] = {}
    for node in ast.walk(ast.parse(modules[BACKEND_REGISTRY])):
        if isinstance(node, ast.ClassDef) and node.name == "AttentionBackendEnum":
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                    value = item.value
                    text = (
                        value.value
                        if isinstance(value, ast.Constant)
                        else "".join(e.value for e in ast.walk(value) if isinstance(e, ast.Constant) and isinstance(e.value, str))
                    )
                    paths[item.targets[0].id] = str(text)
    classes: dict[str, ast.ClassDef] = {}
    for path, text in modules.items():
        if "attention" in path:
            for node in ast.parse(text).body:
                if isinstance(node, ast.ClassDef) and node.name.endswith("Backend"):
                    classes.setdefault(node.name, node)

    def lookup(cls: str, attr: str) -> ast.AST | None:
        todo, seen = [cls], set()
        while todo:
            name = todo.pop(0)
            if name in seen or name not in classes:
                continue
            seen.add(name)
            for item in classes[name].body:
                if isinstance(item, ast.FunctionDef) and item.name == attr:
                    return item
                target = item.targets[0] if isinstance(item, ast.Assign) else item.target if isinstance(item, ast.AnnAssign) else None
                if isinstance(target, ast.Name) and target.id == attr:
                    return item
            todo.extend(b.id for b in classes[name].bases if isinstance(b, ast.Name))
        return None

    out: dict[str, dict[str, object]] = {}
    for name in names:
        cls = paths.get(name, "").rsplit(".", 1)[-1]
        if cls not in classes:
            continue
        entry: dict[str, object] = {"class": paths[name]}
        dtypes = lookup(cls, "supported_kv_cache_dtypes")
        if isinstance(dtypes, (ast.Assign, ast.AnnAssign)) and isinstance(dtypes.value, ast.List):
            entry["kv_cache_dtypes"] = [e.value for e in dtypes.value.elts if isinstance(e, ast.Constant)]
        override = lookup(cls, "supports_block_size")
        base_override = lookup("AttentionBackend", "supports_block_size")
        sizes = lookup(cls, "get_supported_kernel_block_sizes")
        if isinstance(override, ast.FunctionDef) and override is not base_override:
            modulo = _modulo_check(override)
            if modulo is not None:
                entry["block_sizes"] = [f"*{modulo}"]
        elif isinstance(sizes, ast.FunctionDef):
            found = _block_sizes(sizes)
            if found is not None:
                entry["block_sizes"] = found
        for flag in ("is_mla", "is_sparse", "supports_sink"):
            func = lookup(cls, flag)
            returned = _returns_constant(func) if isinstance(func, ast.FunctionDef) else ...
            if isinstance(returned, bool):
                entry[flag] = returned
        out[name] = entry
    return {
        "source": f"{ROCM_PLATFORM} (_get_backend_priorities), {BACKEND_REGISTRY}, vllm/v1/attention/backends/*.py (validate_configuration inputs)",
        "rocm": out,
        "mha_priority": mha_priority(priorities),
    }


def mha_priority(priorities: ast.FunctionDef) -> list[list[str | None]]:
    """The order in which vLLM tries ROCm backends for a model that is neither MLA nor sparse, each with the condition
    under which ``_get_backend_priorities`` lists it (its source, None: always): the first that validates the
    configuration runs when no backend is named. A backend put in front (``insert(0, ...)``) on another branch is a
    GPU family's the fleet does not run (0.33.0's RDNA); it is left out."""
    listed: list[list[str | None]] = []

    def walk(body: list[ast.stmt], condition: str | None) -> None:
        for node in body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and ast.unparse(node.targets[0]) == "backends":
                listed.extend([[e.attr, condition] for e in node.value.elts if isinstance(e, ast.Attribute)])
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "backends.append":
                (added,) = node.value.args
                if isinstance(added, ast.Attribute):
                    listed.append([added.attr, condition])
            elif isinstance(node, ast.If) and not _returns(node):
                walk(node.body, ast.unparse(node.test) if condition is None else f"{condition} and {ast.unparse(node.test)}")

    walk(priorities.body, None)
    return listed


def _returns(node: ast.If) -> bool:
    """Whether the branch returns (the MLA and sparse lists: not the MHA order)."""
    return any(isinstance(n, ast.Return) for n in ast.walk(node))


def mx_architectures(modules: dict[str, str]) -> list[str]:
    """The gfx prefixes for which ``RocmPlatform.supports_mx`` is true: native MXFP4/MXFP6 GEMMs; others emulate them."""
    for node in ast.walk(ast.parse(modules[ROCM_PLATFORM])):
        if isinstance(node, ast.FunctionDef) and node.name == "supports_mx":
            return sorted(
                {e.value for e in ast.walk(node) if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value.startswith("gfx")}
            )
    return []


# Start-up checks between settings that live in code, not in declarations: each is
# written once in instinct_fleet/model/startup.py and anchored here to the source text that
# raises it, so a version carries a check only where its source still has the anchor.
ANCHORS: dict[str, tuple[str, str]] = {
    "scheduler-batched-below-seqs": ("vllm/config/scheduler.py", r"must be greater than or equal to max_num_seqs"),
    "scheduler-batched-below-model-len": ("vllm/config/scheduler.py", r"is smaller than max_model_len"),
    "scheduler-partial-prefills-chunked": ("vllm/config/scheduler.py", r"Chunked prefill must be enabled to set"),
    "scheduler-long-partial-prefills": ("vllm/config/scheduler.py", r"max_long_partial_prefills.* must be less than or equal to"),
    "speculative-draft-tp": ("vllm/config/speculative.py", r"cannot be other value than 1 or target model tensor_parallel_size"),
    "speculative-tokens-without-model": (
        "vllm/config/speculative.py",
        r"num_speculative_tokens was provided but without speculative model",
    ),
    "speculative-tensor-parallel-key": ("vllm/config/speculative.py", r"'tensor_parallel_size' is not a valid argument in the"),
    "speculative-prompt-lookup": ("vllm/config/speculative.py", r"prompt_lookup_min=\{\.\.\.\} must be <= prompt_lookup_max"),
    "kv-connector-role": ("vllm/config/kv_transfer.py", r"Please specify kv_role when kv_connector"),
    "shuffle-kv-speculative": ("vllm/v1/attention/backends/rocm_aiter_fa.py", r"Shuffle KV cache layout is not supported with"),
    "executor-nsight-needs-ray": ("vllm/config/parallel.py", r"Unable to use nsight profiling unless workers"),
    "executor-nnodes-backend": ("vllm/config/parallel.py", r"nnodes > 1 can only be set when distributed executor"),
    "partial-prefill-unsupported": ("vllm/engine/arg_utils.py", r"^Concurrent Partial Prefill$"),
    "executor-async-scheduling": ("vllm/config/vllm.py", r"does not support async scheduling yet"),
}


def _string_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal with its line; f-string fields shown as ``{...}`` (implicit concatenation is one literal)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) if isinstance(v, ast.Constant) else "{...}" for v in node.values)
            out.append((node.lineno, text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
    return out


def anchored_checks(modules: dict[str, str]) -> dict[str, str]:
    """Each start-up check whose message this version's source still raises, with its file and line: a ``raise``,
    a failing ``assert``, or a call of a helper that raises (``_raise_unsupported_error(feature_name=...)``)."""
    found: dict[str, str] = {}
    trees = {path: ast.parse(modules[path]) for path, _ in ANCHORS.values() if path in modules}
    literals = {path: _string_literals(tree) for path, tree in trees.items()}
    for check, (path, pattern) in ANCHORS.items():
        line = next((n for n, text in literals.get(path, []) if re.search(pattern, text)), None)
        if line is not None and _guards(trees[path], line) is not None:
            found[check] = f"{path}:{line}"
    return found


def _raising_helpers(tree: ast.AST) -> dict[str, tuple[list[str], str, ast.expr | None]]:
    """The module's functions whose body ends in a ``raise``: name -> (parameters, exception, message expression, with
    a local ``msg = ...`` put in its place)."""
    helpers: dict[str, tuple[list[str], str, ast.expr | None]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or not node.body or not isinstance(node.body[-1], ast.Raise):
            continue
        call = node.body[-1].exc
        if not isinstance(call, ast.Call):
            continue
        message = call.args[0] if call.args else None
        assigned = {t.id: a.value for a in node.body if isinstance(a, ast.Assign) for t in a.targets if isinstance(t, ast.Name)}
        if isinstance(message, ast.Name) and message.id in assigned:
            message = assigned[message.id]
        helpers[node.name] = ([a.arg for a in node.args.args], ast.unparse(call.func), message)
    return helpers


def _guards(tree: ast.AST, line: int) -> tuple[list[str], ast.stmt] | None:
    """The conditions under which the ``raise``, ``assert`` or raising helper's call at ``line`` runs, from its function
    down (an ``if``'s test on its body, its negation on its ``else``), and that statement; None when no such statement
    spans the line."""
    helpers = _raising_helpers(tree)

    def raising(node: ast.AST) -> bool:
        if isinstance(node, (ast.Raise, ast.Assert)):
            return True
        return isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in helpers

    def walk(node: ast.AST, conditions: list[str]) -> tuple[list[str], ast.stmt] | None:
        for field, value in ast.iter_fields(node):
            for child in value if isinstance(value, list) else [value]:
                if not isinstance(child, ast.AST):
                    continue
                inner = conditions
                if isinstance(node, ast.If) and field in ("body", "orelse"):
                    test = ast.unparse(node.test)
                    inner = [*conditions, test if field == "body" else f"not ({test})"]
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    inner = []
                if raising(child) and isinstance(child, ast.stmt) and child.lineno <= line <= (child.end_lineno or child.lineno):
                    return inner, child
                found = walk(child, inner)
                if found is not None:
                    return found
        return None

    return walk(tree, [])


def startup_conditions(modules: dict[str, str], anchored: dict[str, str]) -> dict[str, dict[str, object]]:
    """Each anchored start-up check as vLLM's source states it: the conditions that lead to its ``raise`` (or the
    failing ``assert``), the exception, and the message as a Python expression over the same names. The stand-in
    vLLM evaluates them, and tests hold the checks of ``instinct_fleet/model/startup.py`` to them."""
    found: dict[str, dict[str, object]] = {}
    trees: dict[str, ast.Module] = {}
    for check, at in anchored.items():  # anchored_checks: each check's file and line
        path, line = at.rsplit(":", 1)
        if path not in trees:
            trees[path] = ast.parse(modules[path])
        tree = trees[path]
        guarded = _guards(tree, int(line))
        assert guarded is not None  # anchored_checks keeps a check only where it finds its statement
        conditions, statement = guarded
        said: str
        if isinstance(statement, ast.Assert):
            raises, conditions = "AssertionError", [*conditions, f"not ({ast.unparse(statement.test)})"]
            said = ast.unparse(statement.msg) if statement.msg is not None else "''"
        elif isinstance(statement, ast.Raise):
            call = statement.exc
            raises = ast.unparse(call.func) if isinstance(call, ast.Call) else ast.unparse(call) if call else "Exception"
            said = ast.unparse(call.args[0]) if isinstance(call, ast.Call) and call.args else "''"
        else:  # a helper's call: its message with the call's arguments bound, as one expression
            assert isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
            parameters, raises, message = _raising_helpers(tree)[ast.unparse(statement.value.func)]
            arguments = ast.unparse(statement.value).removeprefix(ast.unparse(statement.value.func))
            body = ast.unparse(message) if message is not None else "''"
            said = f"(lambda {', '.join(parameters)}: {body}){arguments}"
        found[check] = {"when": conditions, "raises": raises, "says": said}
    return found


def executors(modules: dict[str, str], envs_source: str) -> dict[str, dict[str, str]]:
    """The executor class ``Executor.get_class`` (vllm/v1/executor/abstract.py) picks for each
    ``--distributed-executor-backend``: ``{"class": name}``, or where an ``envs`` flag picks between two,
    ``{"env": name, "default": its default in envs.py, "on": class, "off": class}`` (0.22.0's
    VLLM_USE_RAY_V2_EXECUTOR_BACKEND). Which class runs decides which features start."""
    source = modules.get("vllm/v1/executor/abstract.py")
    if source is None:
        return {}
    get_class = next((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "get_class"), None)
    if get_class is None:
        return {}

    def assigned(body: list[ast.stmt]) -> str | None:
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Name):
                continue
            if any(isinstance(t, ast.Name) and t.id == "executor_class" for t in node.targets):
                return node.value.id
        return None

    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(get_class):
        test = node.test if isinstance(node, ast.If) else None
        if not isinstance(test, ast.Compare) or ast.unparse(test.left) != "distributed_executor_backend":
            continue
        backend = test.comparators[0]
        if not isinstance(backend, ast.Constant) or not isinstance(backend.value, str):
            continue
        assert isinstance(node, ast.If)
        inner = next((n for n in node.body if isinstance(n, ast.If) and ast.unparse(n.test).startswith("envs.")), None)
        if inner is not None:
            env = ast.unparse(inner.test).removeprefix("envs.")
            on, off = assigned(inner.body), assigned(inner.orelse)
            if on and off:
                found[backend.value] = {"env": env, "default": env_default(envs_source, env) or "", "on": on, "off": off}
        elif (chosen := assigned(node.body)) is not None:
            found[backend.value] = {"class": chosen}
    return found


def env_default(envs_source: str, name: str) -> str | None:
    """The default that envs.py's entry for ``name`` passes to ``os.getenv`` (a string), or None."""
    for node in ast.walk(ast.parse(envs_source)):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == name:
                    for call in ast.walk(value):
                        if isinstance(call, ast.Call) and ast.unparse(call.func) in ("os.getenv", "os.environ.get") and len(call.args) > 1:
                            default = call.args[1]
                            return default.value if isinstance(default, ast.Constant) and isinstance(default.value, str) else None
    return None


def async_executors(modules: dict[str, str]) -> list[str]:
    """The executor classes whose ``supports_async_scheduling()`` returns True, their own or a base's
    (vllm/v1/executor/*.py): vLLM refuses ``--async-scheduling`` on the others."""
    classes: dict[str, tuple[list[str], bool | None]] = {}
    for path, text in modules.items():
        if not path.startswith("vllm/v1/executor/"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                says = None
                for method in node.body:
                    if isinstance(method, ast.FunctionDef) and method.name == "supports_async_scheduling":
                        returns = [r.value for r in ast.walk(method) if isinstance(r, ast.Return)]
                        if len(returns) == 1 and isinstance(returns[0], ast.Constant) and isinstance(returns[0].value, bool):
                            says = returns[0].value
                classes[node.name] = ([ast.unparse(b) for b in node.bases], says)

    def supports(name: str) -> bool:
        bases, says = classes.get(name, ([], None))
        return says if says is not None else any(supports(base) for base in bases)

    return sorted(name for name in classes if supports(name))


# The start-up lines vLLM logs for each phase (logger format strings, as written in its source): the health gate
# reads them from a unit's journal to say how long each phase took and whether the compile cache was hit.
STARTUP_LOG: dict[str, str] = {
    "weights": r"^Model loading took ",
    "compile": r"^(%s)?torch\.compile (takes|took) .* in total",
    "cache-hit": r"^(%s)?Directly load the compiled graph\(s\)",
    "cache-miss": r"^(%s)?Compiling a graph for ",
    "graph-capture": r"^Graph capturing finished in ",
}


def startup_log(modules: dict[str, str]) -> dict[str, list[str]]:
    """Each phase's log format strings in this version's source, in file order (duplicates once)."""
    found: dict[str, list[str]] = {phase: [] for phase in STARTUP_LOG}
    for path in sorted(modules):
        if not any(
            word in modules[path]
            for word in ("Model loading took", "torch.compile", "compiled graph", "Compiling a graph", "Graph capturing")
        ):
            continue
        for _, text in _string_literals(ast.parse(modules[path])):
            for phase, anchor in STARTUP_LOG.items():
                if re.search(anchor, text) and text not in found[phase]:
                    found[phase].append(text)
    return {phase: formats for phase, formats in found.items() if formats}


# The Prometheus metric constructors of vLLM's V1 loggers (vllm/v1/metrics/loggers.py: ``self._gauge_cls(name=...)``,
# prometheus_client's classes behind them) and the kind each makes.
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


EXCLUSIVE = re.compile(r"^(\w+) and (\w+)\.(\w+) are mutually exclusive$")
EXCLUSIVE_KEYS = re.compile(r"^\{\.\.\.\} and (--[\w-]+)\['\{\.\.\.\}'\] are mutually exclusive$")


def exclusive_settings(arg_utils: str) -> list[dict[str, str]]:
    """A flag and a key of a JSON-config flag that set the same thing, which ``EngineArgs`` refuses together:
    ``"attention_backend and attention_config.backend are mutually exclusive"``, and the loop over
    ``(flag, key, value)`` tuples that raises ``"{flag} and --speculative-config['{key}'] ..."``."""
    tree = ast.parse(arg_utils)
    found: list[dict[str, str]] = []
    for line, text in _string_literals(tree):
        if m := EXCLUSIVE.match(text):
            flag, config, key = m.groups()
            found.append(
                {
                    "flag": "--" + flag.replace("_", "-"),
                    "config": "--" + config.replace("_", "-"),
                    "key": key,
                    "source": f"vllm/engine/arg_utils.py:{line}",
                }
            )
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For)):
        raised = [(line, m) for line, text in _string_literals(loop) if (m := EXCLUSIVE_KEYS.match(text))]
        if not raised or not isinstance(loop.iter, ast.Tuple):
            continue
        line, m = raised[0]
        for item in loop.iter.elts:
            first = item.elts[:2] if isinstance(item, ast.Tuple) else []
            if len(first) == 2 and isinstance(first[0], ast.Constant) and isinstance(first[1], ast.Constant):
                flag, key = str(first[0].value), str(first[1].value)
                found.append({"flag": flag, "config": m.group(1), "key": key, "source": f"vllm/engine/arg_utils.py:{line}"})
    return found


def _gib_floor(test: ast.expr) -> int | None:
    """N of a ``device_memory >= N * GiB_bytes`` comparison anywhere in an ``if`` test."""
    for node in ast.walk(test):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Name)
            and node.left.id == "device_memory"
            and isinstance(node.ops[0], ast.GtE)
            and isinstance(node.comparators[0], ast.BinOp)
            and isinstance(node.comparators[0].left, ast.Constant)
        ):
            return int(str(node.comparators[0].left.value))
    return None


def _server_default(body: list[ast.stmt], name: str) -> int | None:
    """The ``UsageContext.OPENAI_API_SERVER`` entry of the dict assigned to ``name`` in ``body`` (a plain number)."""
    for stmt in body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, ast.Dict):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                for k, v in zip(stmt.value.keys, stmt.value.values, strict=True):
                    if isinstance(k, ast.Attribute) and k.attr == "OPENAI_API_SERVER" and isinstance(v, ast.Constant):
                        return int(str(v.value))
    return None


def scheduler_defaults(arg_utils: str) -> dict[str, object]:
    """What ``vllm serve`` sets ``--max-num-batched-tokens`` and ``--max-num-seqs`` to when they are absent, on a GPU
    of at least each memory tier (``EngineArgs``: the ``device_memory >= N * GiB_bytes`` branches, the OpenAI server's
    entry), and the rules around them: ``max_num_seqs`` capped at the batched tokens (``min(...)``), both doubled by
    ``--performance-mode throughput``, and with chunked prefill off the batched tokens raised to the model length
    (``max``) or set to it."""
    tree = ast.parse(arg_utils)
    tiers: list[dict[str, object]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (gib := _gib_floor(node.test)) is not None:
            batched = _server_default(node.body, "default_max_num_batched_tokens")
            seqs = _server_default(node.body, "default_max_num_seqs")
            if batched is not None and seqs is not None:
                tiers.append(
                    {
                        "min_gib": gib,
                        "max_num_batched_tokens": batched,
                        "max_num_seqs": seqs,
                        "source": f"vllm/engine/arg_utils.py:{node.lineno}",
                    }
                )
    if not tiers:
        return {}
    nodes = list(ast.walk(tree))
    calls = [
        (n.func.id, ast.unparse(n))
        for n in nodes
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("min", "max")
    ]
    capped = any(name == "min" and "default_max_num_seqs[usage_context]" in call for name, call in calls)
    raised = any(name == "max" and "model_config.max_model_len" in call and "max_num_batched_tokens" in call for name, call in calls)
    doubles = any(isinstance(n, ast.Compare) and ast.unparse(n) == "self.performance_mode == 'throughput'" for n in nodes)
    return {
        "tiers": sorted(tiers, key=lambda t: -int(t["min_gib"])),  # type: ignore[call-overload]
        "seqs_capped_by_batched": capped,
        "throughput_doubles": doubles,
        "chunked_off_batched": "max(model_len, default)" if raised else "model_len",
    }


def extract(wheel: Path) -> dict[str, object]:
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(zf.namelist())  # the same source gives the same table, whatever order the archive lists it in

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
        engine, _ = serve_flags([read("vllm/engine/arg_utils.py")], types, frontend=False)
        version = wheel.name.split("-")[1]
        env_vars = env_var_names(envs)
        anchored = anchored_checks(modules)
        return {
            "version": version,
            "source": f"{wheel.name}: vllm/envs.py, " + ", ".join(parser_files) + "; reads and enums: every vllm/*.py",
            "env_vars": env_vars,
            "env_unread": unread_env_vars(env_vars, modules),
            "compile_env": compile_env(envs, env_vars),
            "flags": flags,
            "aliases": aliases,
            # The server's own flags (its parser and FrontendArgs): no engine setting, so no part of the compile cache key.
            "frontend": sorted(set(flags) - set(engine)),
            "quantization": quantization_table(modules),
            "attention_backends": attention_backends(modules),
            "mx_architectures": mx_architectures(modules),
            "startup_checks": anchored,
            "startup_conditions": startup_conditions(modules, anchored),
            "executors": executors(modules, envs),
            "async_executors": async_executors(modules),
            "exclusive": [
                e for e in exclusive_settings(modules["vllm/engine/arg_utils.py"]) if e["flag"] in flags and e["config"] in flags
            ],
            "scheduler_defaults": scheduler_defaults(modules["vllm/engine/arg_utils.py"]),
            "startup_log": startup_log(modules),
            "metrics": prometheus_metrics(modules),
            "histogram_buckets": histogram_buckets(modules),
            "finish_reasons": finish_reasons(modules.get("vllm/v1/engine/__init__.py", "")),
        }


class ExtractError(Exception):
    """The release cannot be fetched or is not a vLLM wheel; the message says why."""


def download(version: str, directory: Path) -> Path:
    """vLLM's wheel of ``version`` from the package registry, with pip (its dependencies are not fetched, nothing installed)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            f"vllm=={version}",
            "-d",
            str(directory),
        ],
        capture_output=True,
        text=True,
    )
    wheels = sorted(directory.glob("vllm-*.whl"))
    if done.returncode != 0 or not wheels:
        said = (done.stderr.strip().splitlines() or ["no wheel came back"])[-1]
        raise ExtractError(f"pip could not download vllm=={version}: {said}")
    return wheels[0]


def extract_release(wheel: Path, version: str) -> dict[str, object]:
    """:func:`extract`, refusing a file that is not a vLLM wheel of ``version``."""
    try:
        data = extract(wheel)
    except zipfile.BadZipFile:
        raise ExtractError(f"{wheel} is not a wheel (a zip file)") from None
    except KeyError as exc:
        raise ExtractError(f"{wheel} is not a vLLM wheel: {exc.args[0]}") from None
    except SyntaxError as exc:
        raise ExtractError(f"{wheel}: {exc.filename} does not parse as Python ({exc.msg}, line {exc.lineno})") from None
    if data["version"] != version:
        raise ExtractError(f"{wheel} is vLLM {data['version']}, not {version}")
    return data


# Run inside a vLLM image by ``python3 -c``: the vllm package's Python files as a base64 zip, after its version. The
# package is found without importing it (vLLM's import needs the GPU stack); its version is its distribution's.
IN_IMAGE = """
import base64, importlib.metadata, importlib.util, io, os, sys, zipfile
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.submodule_search_locations:
    sys.exit("no vllm package in this image's python3")
root = list(spec.submodule_search_locations)[0]
buffer = io.BytesIO()
with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):  # a fixed date: an image's files may carry none (mtime 0), which zip cannot hold
                path = os.path.join(folder, name)
                with open(path, "rb") as handle:
                    zf.writestr(zipfile.ZipInfo(os.path.join("vllm", os.path.relpath(path, root)), (1980, 1, 1, 0, 0, 0)), handle.read())
print("version", importlib.metadata.version("vllm"))
print(base64.b64encode(buffer.getvalue()).decode())
"""


def image_command(image: str) -> str:
    """The host command that prints :data:`IN_IMAGE`'s answer from ``image`` (docker on the host, the image pulled)."""
    import shlex

    return f"docker run --rm --network none --entrypoint python3 {shlex.quote(image)} -c {shlex.quote(IN_IMAGE)}"


def from_image(output: str, directory: Path) -> Path:
    """The zip :data:`IN_IMAGE` printed, as a wheel-shaped file that :func:`extract_release` reads."""
    lines = output.strip().splitlines()
    if len(lines) < 2 or not lines[0].startswith("version "):
        raise ExtractError(f"the image did not list its vllm package: {output.strip()[-300:] or 'no output'}")
    version = lines[0].split(" ", 1)[1].strip()
    try:
        data = base64.b64decode("".join(lines[1:]), validate=True)
    except ValueError:
        raise ExtractError("the image's answer was cut off (not base64): run it again") from None
    path = directory / f"vllm-{version}-image.zip"
    path.write_bytes(data)
    return path
