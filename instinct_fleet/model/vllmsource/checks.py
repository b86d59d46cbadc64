"""vLLM's start-up checks: the error messages that refuse a launch, the conditions that guard them, the executors and
which of them schedule asynchronously, and the start-up log lines."""

from __future__ import annotations

import ast
import re

from instinct_fleet.model.vllmsource import envs, flags

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


def anchored_checks(modules: dict[str, str]) -> dict[str, str]:
    """Each start-up check whose message this version's source still raises, with its file and line: a ``raise``,
    a failing ``assert``, or a call of a helper that raises (``_raise_unsupported_error(feature_name=...)``)."""
    found: dict[str, str] = {}
    trees = {path: ast.parse(modules[path]) for path, _ in ANCHORS.values() if path in modules}
    literals = {path: flags.string_literals(tree) for path, tree in trees.items()}
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
                found[backend.value] = {"env": env, "default": envs.env_default(envs_source, env) or "", "on": on, "off": off}
        elif (chosen := assigned(node.body)) is not None:
            found[backend.value] = {"class": chosen}
    return found


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
        for _, text in flags.string_literals(ast.parse(modules[path])):
            for phase, anchor in STARTUP_LOG.items():
                if re.search(anchor, text) and text not in found[phase]:
                    found[phase].append(text)
    return {phase: formats for phase, formats in found.items() if formats}


# The Prometheus metric constructors of vLLM's V1 loggers (vllm/v1/metrics/loggers.py: ``self._gauge_cls(name=...)``,
# prometheus_client's classes behind them) and the kind each makes.
