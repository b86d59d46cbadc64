"""The checks between settings that vLLM's source raises at start-up, written here once, each as a function of one
:class:`~instinct_fleet.model.launch.Launch`; a version carries one only where its source still raises it
(``VllmKnowledge.startup_checks``, with the file and line, extracted by instinct_fleet/model/vllmsource/checks.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from instinct_fleet.model.defaults import GPU_HBM_GIB
from instinct_fleet.model.launch import TRUE, Launch, running_backend
from instinct_fleet.model.rules import Finding, finding

Check = Callable[[Launch], Iterator[tuple[str, str]]]


def _scheduler_limits(launch: Launch) -> tuple[float | None, float | None, str]:
    """--max-num-batched-tokens and --max-num-seqs as vLLM's scheduler gets them: the given value, or the default
    ``vllm serve`` sets on this GPU model when the flag is absent (None where that depends on what is not known
    here, the model's own length). The text says which came from a default, and why."""
    batched, seqs = launch.number("max-num-batched-tokens"), launch.number("max-num-seqs")
    rules = launch.table.scheduler_defaults
    tier = rules.tier(GPU_HBM_GIB.get(launch.gpu_model, 0)) if rules is not None else None
    if rules is None or tier is None or (batched is not None and seqs is not None):
        return batched, seqs, ""
    factor = 2 if rules.throughput_doubles and launch.arg("performance-mode") == "throughput" else 1
    said = []
    if batched is None:
        batched = float(tier.max_num_batched_tokens * factor)
        if launch.switch("enable-chunked-prefill") is False:
            length = launch.number("max-model-len")
            if length is None:
                return None, seqs, ""  # the model's own length decides, which the inventory does not say
            batched = max(length, batched) if rules.chunked_off_batched.startswith("max") else length
        said.append(f"--max-num-batched-tokens is absent, so vLLM {launch.table.version} sets {batched:g} on an {launch.gpu_model}")
    if seqs is None:
        seqs = float(tier.max_num_seqs * factor)
        if rules.seqs_capped_by_batched:
            seqs = min(seqs, batched)
        said.append(f"--max-num-seqs is absent, so vLLM {launch.table.version} sets {seqs:g} on an {launch.gpu_model}")
    return batched, seqs, f" ({'; '.join(said)}: {tier.source})"


def _batched_below_seqs(launch: Launch) -> Iterator[tuple[str, str]]:
    batched, seqs, defaulted = _scheduler_limits(launch)
    if batched is not None and seqs is not None and batched < seqs:
        key = "max-num-seqs" if launch.number("max-num-batched-tokens") is None else "max-num-batched-tokens"
        yield (
            launch.where(key),
            f"max_num_batched_tokens {batched:g} is below max_num_seqs {seqs:g}{defaulted}; vLLM needs it at least as large",
        )


def _exclusive(launch: Launch) -> Iterator[Finding]:
    """A flag and its key in a JSON-config flag, both set: ``EngineArgs`` refuses the pair (``are mutually exclusive``)."""
    for pair in launch.table.exclusive:
        flag, config = pair.flag.lstrip("-"), pair.config.lstrip("-")
        given = launch.arg(flag)
        parsed = launch.json(config)
        if given is not None and parsed is not None and parsed.get(pair.key) is not None:
            yield finding(
                "flag-config-exclusive",
                launch.svc.host,
                launch.where(flag),
                f"--{flag} and --{config}'s {pair.key} set the same thing; vLLM {launch.table.version} refuses both "
                f"({pair.source}): keep one",
            )


def _batched_below_model_len(launch: Launch) -> Iterator[tuple[str, str]]:
    batched, length = launch.number("max-num-batched-tokens"), launch.number("max-model-len")
    if launch.switch("enable-chunked-prefill") is False and batched is not None and length is not None and batched < length:
        yield (
            launch.where("max-num-batched-tokens"),
            f"{batched:g} is below --max-model-len {length:g} with chunked prefill off; raise it or lower --max-model-len",
        )


def _partial_prefills_chunked(launch: Launch) -> Iterator[tuple[str, str]]:
    partial = launch.number("max-num-partial-prefills")
    if partial is not None and partial > 1 and launch.switch("enable-chunked-prefill") is False:
        yield launch.where("max-num-partial-prefills"), f"{partial:g} needs chunked prefill, which --no-enable-chunked-prefill turns off"


def _long_partial_prefills(launch: Launch) -> Iterator[tuple[str, str]]:
    long, partial = launch.number("max-long-partial-prefills"), launch.number("max-num-partial-prefills")
    if long is not None and long > (partial if partial is not None else 1):
        yield launch.where("max-long-partial-prefills"), f"{long:g} is above --max-num-partial-prefills {partial or 1:g}"


def _partial_prefill_unsupported(launch: Launch) -> Iterator[tuple[str, str]]:
    for flag in ("max-num-partial-prefills", "max-long-partial-prefills"):
        given = launch.number(flag)
        if given is not None and given != 1:
            yield launch.where(flag), f"{given:g}: this vLLM runs no concurrent partial prefill, and refuses any value but 1"


def _speculative_draft_tp(launch: Launch) -> Iterator[tuple[str, str]]:
    spec = launch.speculative or {}
    draft = spec.get("draft_tensor_parallel_size")
    tp = launch.svc.size("tensor-parallel-size")
    if isinstance(draft, int) and not isinstance(draft, bool) and draft not in (1, tp):
        yield launch.where("speculative-config") + ".draft_tensor_parallel_size", f"{draft} must be 1 or the target's TP {tp}"


# The methods that need no draft model, for a table extracted before vLLM's conditions were read (0.22.0's list).
DRAFTLESS_METHODS = frozenset({"ngram", "[ngram]", "ngram_gpu", "suffix", "mtp", "extract_hidden_states", "custom_class"})


def _methods(launch: Launch, check: str) -> frozenset[str] | None:
    """The speculative methods that vLLM's own conditions for ``check`` compare ``self.method`` with (``not
    (self.method == 'mtp')``, ``self.method in ('ngram', '[ngram]')``); None when the table holds no conditions for it."""
    conditions = launch.table.startup_conditions.get(check)
    if conditions is None:
        return None
    named: set[str] = set()
    for condition in conditions:
        for compare in ast.walk(ast.parse(condition, mode="eval")):
            if isinstance(compare, ast.Compare) and ast.unparse(compare.left) == "self.method":
                named |= {
                    n.value for c in compare.comparators for n in ast.walk(c) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                }
    return frozenset(named)


def _method(spec: dict[str, object]) -> str:
    """The method as vLLM's SpeculativeConfig holds it when it checks: inferred when unset (``ngram`` for an ngram
    model, else ``draft_model``), and a deprecated ``*_mtp`` method renamed ``mtp`` (its MTPModelTypes)."""
    method = spec.get("method")
    if method is None:
        return "ngram" if spec.get("model") in ("ngram", "[ngram]") else "draft_model"
    return "mtp" if str(method).endswith("_mtp") else str(method)


def _speculative_tokens_without_model(launch: Launch) -> Iterator[tuple[str, str]]:
    spec = launch.speculative
    if spec is None or spec.get("model") is not None or spec.get("num_speculative_tokens") is None:
        return
    method = _method(spec)
    draftless = _methods(launch, "speculative-tokens-without-model")
    if method not in (DRAFTLESS_METHODS if draftless is None else draftless):
        yield (
            launch.where("speculative-config") + ".model",
            f"method {spec.get('method') or 'unset'} with num_speculative_tokens needs a draft model",
        )


def _speculative_tensor_parallel_key(launch: Launch) -> Iterator[tuple[str, str]]:
    spec = launch.speculative or {}
    if "tensor_parallel_size" in spec:
        yield launch.where("speculative-config") + ".tensor_parallel_size", "is not accepted here; use draft_tensor_parallel_size"


def _speculative_prompt_lookup(launch: Launch) -> Iterator[tuple[str, str]]:
    spec = launch.speculative or {}
    low, high = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    lookups = _methods(launch, "speculative-prompt-lookup")
    if lookups is not None and _method(spec) not in lookups | {"[ngram]"}:  # vLLM renames [ngram] to ngram first
        return
    if isinstance(low, int) and isinstance(high, int) and low > high:
        yield launch.where("speculative-config") + ".prompt_lookup_min", f"{low} is above prompt_lookup_max {high}"


def _kv_connector_role(launch: Launch) -> Iterator[tuple[str, str]]:
    config = launch.json("kv-transfer-config")
    if config is not None and config.get("kv_connector") and not config.get("kv_role"):
        yield launch.where("kv-transfer-config") + ".kv_role", f"kv_connector {config['kv_connector']} needs a kv_role"


def _shuffle_kv_speculative(launch: Launch) -> Iterator[tuple[str, str]]:
    """ROCM_AITER_FA asserts at its first decode with the shuffled KV layout and speculative decoding's multi-token
    steps; where this version's condition also names the attention's sinks (0.33.0), a model with sinks too."""
    if launch.svc.env.get("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT") not in TRUE:
        return
    conditions = launch.table.startup_conditions.get("shuffle-kv-speculative", ())
    named = {ast.unparse(n) for c in conditions for n in ast.walk(ast.parse(c, mode="eval")) if isinstance(n, ast.Attribute)}
    sinks = launch.checkpoint is not None and launch.checkpoint.sinks and "self.sinks" in named
    if launch.speculative is None and not sinks:
        return
    if running_backend(launch) == "ROCM_AITER_FA":
        why = (
            "speculative decoding's multi-token decode" if launch.speculative is not None else f"the attention sinks of {launch.svc.model}"
        )
        yield (
            f"{launch.svc.name}.env.VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT",
            f"the shuffled KV layout asserts on {why} in ROCM_AITER_FA; drop one of the two",
        )


def _executor_backend(launch: Launch) -> str:
    """The executor ``ParallelConfig`` runs: ``--distributed-executor-backend``, else ``ray`` with
    ``--data-parallel-backend ray`` and ``mp`` when more than one process serves, ``uni`` for one (on ROCm; a Ray
    placement group, the other way to ``ray``, is one a unit's container never starts in)."""
    given = launch.arg("distributed-executor-backend")
    if isinstance(given, str):
        return given
    world = launch.svc.size("tensor-parallel-size") * launch.svc.size("pipeline-parallel-size")
    world *= int(launch.number("prefill-context-parallel-size") or 1)
    if world * launch.svc.size("data-parallel-size") > 1:
        return "ray" if launch.arg("data-parallel-backend") == "ray" else "mp"
    return "uni"


def _executor_class(launch: Launch) -> tuple[str, str] | None:
    """The executor class this instance's vLLM runs, and how it was chosen: ``Executor.get_class`` by the backend,
    and for a backend that an ``envs`` flag splits, by that variable (its envs.py default when unset, read as
    ``bool(int(...))`` reads it); None when the table does not say."""
    backend = _executor_backend(launch)
    choice = launch.table.executors.get(backend)
    if choice is None:
        return None
    if "class" in choice:
        return choice["class"], f"the {backend} executor"
    value = launch.svc.env.get(choice["env"], choice["default"])
    on = value.strip().lstrip("-").isdigit() and int(value) != 0
    return choice["on" if on else "off"], f"the {backend} executor with {choice['env']}={value}"


def _async_scheduling_executor(launch: Launch) -> Iterator[tuple[str, str]]:
    chosen = _executor_class(launch)
    if launch.switch("async-scheduling") is True and chosen is not None and chosen[0] not in launch.table.async_executors:
        yield launch.where("async-scheduling"), f"{chosen[1]} runs {chosen[0]}, which does not support async scheduling"


def _nsight_needs_ray(launch: Launch) -> Iterator[tuple[str, str]]:
    if launch.switch("ray-workers-use-nsight") and _executor_backend(launch) != "ray":
        yield launch.where("ray-workers-use-nsight"), f"needs the ray executor, and this instance runs {_executor_backend(launch)}"


def _nnodes_backend(launch: Launch) -> Iterator[tuple[str, str]]:
    nodes = launch.number("nnodes")
    if nodes is not None and nodes > 1 and _executor_backend(launch) not in ("mp", "uni", "external_launcher"):
        yield launch.where("nnodes"), f"{nodes:g} nodes need the mp, uni or external_launcher executor, not {_executor_backend(launch)}"


CHECKS: dict[str, Check] = {
    "scheduler-batched-below-seqs": _batched_below_seqs,
    "scheduler-batched-below-model-len": _batched_below_model_len,
    "scheduler-partial-prefills-chunked": _partial_prefills_chunked,
    "scheduler-long-partial-prefills": _long_partial_prefills,
    "speculative-draft-tp": _speculative_draft_tp,
    "speculative-tokens-without-model": _speculative_tokens_without_model,
    "speculative-tensor-parallel-key": _speculative_tensor_parallel_key,
    "speculative-prompt-lookup": _speculative_prompt_lookup,
    "kv-connector-role": _kv_connector_role,
    "shuffle-kv-speculative": _shuffle_kv_speculative,
    "executor-nsight-needs-ray": _nsight_needs_ray,
    "executor-nnodes-backend": _nnodes_backend,
    "partial-prefill-unsupported": _partial_prefill_unsupported,
    "executor-async-scheduling": _async_scheduling_executor,
}
