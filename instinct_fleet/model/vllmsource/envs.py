"""vLLM's environment variables, from ``vllm/envs.py``: their names, their defaults, which of them reach the compile
cache key, and which no module reads."""

from __future__ import annotations

import ast


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
