"""``vllm serve``'s flags, from the parser's ``add_argument`` calls and the config dataclasses: each flag's type,
choices and bounds, its aliases, the settings that exclude each other, and the scheduler's defaults."""

from __future__ import annotations

import ast
import re


class Types:
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
                if isinstance(target, ast.Name) and value is not None and literal_choices(value) is not None:
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
        choices = literal_choices(annotation) or []
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


def literal_choices(node: ast.expr) -> list[str] | None:
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


def serve_flags(parser_sources: list[str], types: Types, frontend: bool = True) -> tuple[dict[str, dict[str, object]], dict[str, str]]:
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


EXCLUSIVE = re.compile(r"^(\w+) and (\w+)\.(\w+) are mutually exclusive$")
EXCLUSIVE_KEYS = re.compile(r"^\{\.\.\.\} and (--[\w-]+)\['\{\.\.\.\}'\] are mutually exclusive$")


def exclusive_settings(arg_utils: str) -> list[dict[str, str]]:
    """A flag and a key of a JSON-config flag that set the same thing, which ``EngineArgs`` refuses together:
    ``"attention_backend and attention_config.backend are mutually exclusive"``, and the loop over
    ``(flag, key, value)`` tuples that raises ``"{flag} and --speculative-config['{key}'] ..."``."""
    tree = ast.parse(arg_utils)
    found: list[dict[str, str]] = []
    for line, text in string_literals(tree):
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
        raised = [(line, m) for line, text in string_literals(loop) if (m := EXCLUSIVE_KEYS.match(text))]
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


def string_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal with its line; f-string fields shown as ``{...}`` (implicit concatenation is one literal)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) if isinstance(v, ast.Constant) else "{...}" for v in node.values)
            out.append((node.lineno, text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
    return out
