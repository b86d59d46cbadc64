"""vLLM's own start-up checks, decided from argv and env before any host is touched.

Why: vLLM refuses far more at start-up than unknown names: a quantization it does
not know or ROCm does not run, a deprecated one without the flag that admits it, a
JSON config key its ``@config`` forbids or a value outside a pydantic bound, an
attention backend that refuses the KV-cache dtype or block size, and limits that
contradict each other. On a fleet each is a crash-looping batch. The data comes from
the per-version tables (``scripts/extract_vllm_knowledge.py``); the checks between
settings are written here once, and a version carries one only where its source
still raises it (``VllmKnowledge.startup_checks``, with the file and line).

A checkpoint declares its own quantization in its ``config.json``;
``knowledge/checkpoints.toml`` records it, with its attention shape, for the models
the recipes and seeds name.
"""

from __future__ import annotations

import ast
import json
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import SimpleNamespace

from instinct_fleet.model import knowledge
from instinct_fleet.model.defaults import GPU_ARCH, GPU_HBM_GIB
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.spec import ServiceSpec

TRUE = {"1", "true", "True", "TRUE"}


@dataclass(frozen=True)
class Checkpoint:
    """What a model's ``config.json`` decides at start-up: its quantization and its attention shape."""

    model: str
    quant_method: str | None  # quantization_config.quant_method; None: not quantized
    scheme: str | None  # the weight format inside a quark checkpoint (mxfp4), where it matters
    mla: bool
    sparse: bool
    sinks: bool
    source: str


@cache
def checkpoints() -> dict[str, Checkpoint]:
    """The curated checkpoint table, by Hugging Face id."""
    path = resources.files("instinct_fleet.model").joinpath("knowledge", "checkpoints.toml")
    data = tomllib.loads(path.read_text())
    return {
        model: Checkpoint(
            model=model,
            quant_method=entry.get("quant_method") or None,
            scheme=entry.get("scheme"),
            mla=entry.get("mla", False),
            sparse=entry.get("sparse", False),
            sinks=entry.get("sinks", False),
            source=entry["source"],
        )
        for model, entry in data["models"].items()
    }


@dataclass(frozen=True)
class Launch:
    """One instance's launch, as vLLM's start-up sees it: flag values by canonical name, env, the checkpoint."""

    svc: ServiceSpec
    table: knowledge.VllmKnowledge
    gpu_model: str
    checkpoint: Checkpoint | None

    def arg(self, flag: str) -> object:
        return self.svc.args.get(flag)

    def number(self, flag: str) -> float | None:
        """A numeric flag's value (vLLM's human form 8k included), or None when unset or not a number."""
        return _number(self.svc.args.get(flag))

    def switch(self, flag: str) -> bool | None:
        value = self.svc.args.get(flag)
        return value if isinstance(value, bool) else None

    def json(self, flag: str) -> dict[str, object] | None:
        raw = self.svc.args.get(flag)
        if not isinstance(raw, str):
            return None
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return None  # value-domain says so
        return parsed if isinstance(parsed, dict) else None

    @property
    def speculative(self) -> dict[str, object] | None:
        return self.json("speculative-config")

    def where(self, flag: str) -> str:
        return f"{self.svc.name}.args.--{flag}"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    scale = {"k": 1e3, "K": 1024, "m": 1e6, "M": 1024**2, "g": 1e9, "G": 1024**3}
    try:
        return float(text[:-1]) * scale[text[-1]] if text and text[-1] in scale else float(text)
    except ValueError:
        return None


def findings(svc: ServiceSpec, table: knowledge.VllmKnowledge, gpu_model: str) -> list[Finding]:
    """Every start-up check of ``table``'s vLLM that this instance's argv and env trip."""
    launch = Launch(svc, table, gpu_model, checkpoints().get(svc.model))
    found = [*_quantization(launch), *_bounds(launch), *_attention_backend(launch), *_exclusive(launch)]
    for check, source in table.startup_checks.items():
        found += [finding(check, svc.host, key, f"{message} (vLLM {table.version}: {source})") for key, message in CHECKS[check](launch)]
    return found


def step_tokens(svc: ServiceSpec, table: knowledge.VllmKnowledge, gpu_model: str) -> float | None:
    """The most tokens one engine step of this instance carries: --max-num-batched-tokens as vLLM's scheduler sets
    it (raised to --max-model-len with chunked prefill off); None where the model's own length decides."""
    batched, _, _ = _scheduler_limits(Launch(svc, table, gpu_model, checkpoints().get(svc.model)))
    if batched is None and Launch(svc, table, gpu_model, None).switch("enable-chunked-prefill") is False:
        return Launch(svc, table, gpu_model, None).number("max-model-len")
    return batched


def _quantization(launch: Launch) -> Iterator[Finding]:
    """``ModelConfig._verify_quantization``: the method named, or the checkpoint's own, on ROCm."""
    svc, quant, ckpt = launch.svc, launch.table.quantization, launch.checkpoint
    host, version = svc.host, launch.table.version
    given = launch.arg("quantization")
    given = str(given) if given is not None and not isinstance(given, bool) else None
    key = launch.where("quantization") if given else f"{svc.name}.model"
    if given and ckpt is not None and ckpt.quant_method and _family(given) != _family(ckpt.quant_method):
        yield finding(
            "quantization-mismatch",
            host,
            key,
            f"{svc.model} is a {ckpt.quant_method} checkpoint ({ckpt.source}); vLLM refuses --quantization {given} for it. "
            "Drop --quantization, or serve the unquantized model",
        )
        return
    method = given or (ckpt.quant_method if ckpt else None)
    if method is None:
        return
    origin = f"--quantization {method}" if given else f"{svc.model}'s config.json declares {method} ({ckpt.source if ckpt else ''})"
    if method not in quant.methods:
        yield finding(
            "quantization-unknown",
            host,
            key,
            f"{origin}: vLLM {version} has no such method (Unknown quantization method). Known: {', '.join(sorted(quant.methods))}",
        )
    elif quant.rocm and method not in quant.rocm:
        yield finding("quantization-rocm", host, key, f"{origin}: vLLM {version} does not run {method} on ROCm")
    elif method in quant.deprecated and launch.switch((quant.deprecated_flag or "").lstrip("-")) is not True:
        admit = f"; {quant.deprecated_flag} admits it" if quant.deprecated_flag else ""
        yield finding(
            "quantization-deprecated",
            host,
            key,
            f"{origin}: vLLM {version} deprecates {method} and refuses it at start-up{admit}. Prefer a checkpoint in a current format",
        )
    if ckpt is not None and ckpt.scheme == "mxfp4" and method == "quark":
        arch = GPU_ARCH.get(launch.gpu_model, "")
        if not any(arch.startswith(prefix) for prefix in launch.table.mx_architectures):
            yield finding(
                "mxfp4-native",
                host,
                key,
                f"{svc.model} is an MXFP4 checkpoint; {launch.gpu_model} ({arch}) has no native MXFP4, so vLLM {version} emulates it "
                "in high precision (no memory or speed gain). Serve it on MI350X/MI355X, or an FP8 checkpoint here",
            )


def _family(method: str) -> str:
    """Methods one checkpoint format answers to: vLLM's overrides turn gptq into gptq_marlin, awq into awq_marlin."""
    return method.removeprefix("auto_").removesuffix("_marlin")


def _bounds(launch: Launch) -> Iterator[Finding]:
    """Pydantic bounds of plain flags and of every key of a JSON config flag, and keys a config computes itself."""
    svc, table = launch.svc, launch.table
    for flag, value in svc.args.items():
        spec = table.flags.get(f"--{flag}")
        if spec is None or isinstance(value, bool):
            continue
        number = _number(value)
        broken = spec.out_of_bounds(number) if number is not None else None
        if broken:
            yield finding("value-domain", svc.host, launch.where(flag), f"must be {broken} in vLLM {table.version}, got {value!r}")
        if spec.json_fields is not None:
            parsed = launch.json(flag)
            if parsed is not None:
                yield from _json_bounds(launch, launch.where(flag), parsed, spec.json_fields)


def _json_bounds(launch: Launch, where: str, parsed: dict[str, object], fields: dict[str, knowledge.Flag]) -> Iterator[Finding]:
    for key, item in parsed.items():
        field = fields.get(key)
        if field is None:
            continue  # validate.py names unknown keys
        if not field.settable:
            yield finding("value-domain", launch.svc.host, f"{where}.{key}", f"vLLM {launch.table.version} computes {key} itself; drop it")
        elif field.json_fields is not None and isinstance(item, dict):
            yield from _json_bounds(launch, f"{where}.{key}", item, field.json_fields)
        elif isinstance(item, (int, float)) and not isinstance(item, bool) and (broken := field.out_of_bounds(float(item))):
            yield finding("value-domain", launch.svc.host, f"{where}.{key}", f"must be {broken} in vLLM {launch.table.version}, got {item}")


def _selected_backend(launch: Launch) -> tuple[str, str] | None:
    """The backend named by ``--attention-backend`` or ``--attention-config.backend``, with the key that names it."""
    named = launch.arg("attention-backend")
    if isinstance(named, str) and named:
        return named.upper(), launch.where("attention-backend")
    config = launch.json("attention-config")
    if config is not None and isinstance(config.get("backend"), str):
        return str(config["backend"]).upper(), launch.where("attention-config") + ".backend"
    return None


def _refusals(launch: Launch, backend: knowledge.Backend) -> list[str]:
    """Why ``validate_configuration`` of ``backend`` refuses this instance (empty: it takes it)."""
    dtype = launch.arg("kv-cache-dtype")
    dtype = str(dtype) if isinstance(dtype, str) else None
    block = launch.number("block-size")
    ckpt = launch.checkpoint
    reasons = []
    if dtype and not backend.accepts_kv_cache_dtype(dtype):
        reasons.append(f"KV-cache dtype {dtype!r} (it takes {', '.join(backend.kv_cache_dtypes or ())})")
    if block is not None and block == int(block) and not backend.accepts_block_size(int(block)):
        sizes = ", ".join(f"multiples of {str(s)[1:]}" if str(s).startswith("*") else str(s) for s in backend.block_sizes or ())
        reasons.append(f"block size {int(block)} (it takes {sizes})")
    if ckpt is not None:
        if ckpt.mla != backend.is_mla:
            reasons.append(f"{'an MLA' if ckpt.mla else 'a non-MLA'} model ({ckpt.model})")
        elif ckpt.sparse != backend.is_sparse:
            reasons.append(f"{'sparse' if ckpt.sparse else 'dense'} attention ({ckpt.model})")
        if ckpt.sinks and not backend.supports_sink:
            reasons.append(f"attention sinks ({ckpt.model})")
    return reasons


def _listed(launch: Launch, condition: str | None) -> bool:
    """Whether ``_get_backend_priorities`` lists a backend under ``condition`` for this instance. The names it reads
    are bound here by hand: ``use_kv_connector`` is a --kv-transfer-config; ``rocm_aiter_ops.is_mha_enabled()`` is
    VLLM_ROCM_USE_AITER and VLLM_ROCM_USE_AITER_MHA (default on) both on (vllm/_aiter_ops.py, is_mha_enabled);
    ``is_aiter_found_and_supported()`` holds on an MI300X (CDNA3) with the AITER that vLLM's ROCm images ship."""
    if condition is None:
        return True
    env = launch.svc.env
    mha = env.get("VLLM_ROCM_USE_AITER") in TRUE and env.get("VLLM_ROCM_USE_AITER_MHA", "1") in TRUE
    names = {
        "use_kv_connector": launch.json("kv-transfer-config") is not None,
        "rocm_aiter_ops": SimpleNamespace(is_mha_enabled=lambda: mha),
        "is_aiter_found_and_supported": lambda: True,
    }
    return bool(eval(condition, {"__builtins__": {}}, names))  # the table's own source text (vllmsource/platform.py mha_priority)


def _running_backend(launch: Launch) -> str | None:
    """The ROCm attention backend this instance runs: the one it names, else for an MHA model the first of this
    version's priorities that is listed and takes the configuration (RocmPlatform.get_attn_backend_cls); None when
    that cannot be told (an MLA or sparse model, or a table without priorities)."""
    selected = _selected_backend(launch)
    if selected is not None:
        return selected[0]
    if launch.checkpoint is not None and (launch.checkpoint.mla or launch.checkpoint.sparse):
        return None
    for name, condition in launch.table.backend_priority:
        backend = launch.table.backends.get(name)
        try:
            listed = _listed(launch, condition)
        except (NameError, AttributeError):  # a project's table from a newer vLLM: a condition this module cannot read
            return None
        if backend is not None and listed and not _refusals(launch, backend):
            return name
    return None


def _attention_backend(launch: Launch) -> Iterator[Finding]:
    """``validate_configuration`` of the chosen ROCm backend, or of every ROCm candidate when vLLM chooses."""
    backends = launch.table.backends
    if not backends:
        return  # this version picks its ROCm backend in code, not from declarations
    svc, version = launch.svc, launch.table.version
    dtype = launch.arg("kv-cache-dtype")
    dtype = str(dtype) if isinstance(dtype, str) else None
    selected = _selected_backend(launch)
    if selected is None:
        if dtype and not any(b.accepts_kv_cache_dtype(dtype) for b in backends.values()):
            yield finding(
                "attention-backend",
                svc.host,
                launch.where("kv-cache-dtype"),
                f"no attention backend vLLM {version} can pick on ROCm takes KV-cache dtype {dtype!r} (No valid attention backend found)",
            )
        return
    name, key = selected
    backend = backends.get(name)
    if backend is None:
        yield finding(
            "attention-backend",
            svc.host,
            key,
            f"{name} is not one of the backends vLLM {version} runs on ROCm ({', '.join(sorted(backends))})",
        )
        return
    reasons = _refusals(launch, backend)
    if reasons:
        yield finding(
            "attention-backend",
            svc.host,
            key,
            f"vLLM {version} refuses {name} with {'; '.join(reasons)} (Selected backend is not valid for this configuration)",
        )


# The checks between settings, one function each; VllmKnowledge.startup_checks says which
# a version raises and where. Each yields (key, message) for the flags that trip it.
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
    if _running_backend(launch) == "ROCM_AITER_FA":
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
