"""What ROCm can run, from vLLM's platform code: quantization methods, attention backends and their priority, and the
architectures with MX formats."""

from __future__ import annotations

import ast
import re

from instinct_fleet.model.vllmsource import flags

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
            return flags.literal_choices(value)
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
