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

from collections.abc import Iterator

from instinct_fleet.model import knowledge
from instinct_fleet.model.defaults import GPU_ARCH
from instinct_fleet.model.launch import Launch, as_number, checkpoints, refusals, selected_backend
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.settingchecks import CHECKS, _exclusive, _scheduler_limits
from instinct_fleet.model.spec import ServiceSpec


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
        number = as_number(value)
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


def _attention_backend(launch: Launch) -> Iterator[Finding]:
    """``validate_configuration`` of the chosen ROCm backend, or of every ROCm candidate when vLLM chooses."""
    backends = launch.table.backends
    if not backends:
        return  # this version picks its ROCm backend in code, not from declarations
    svc, version = launch.svc, launch.table.version
    dtype = launch.arg("kv-cache-dtype")
    dtype = str(dtype) if isinstance(dtype, str) else None
    selected = selected_backend(launch)
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
    reasons = refusals(launch, backend)
    if reasons:
        yield finding(
            "attention-backend",
            svc.host,
            key,
            f"vLLM {version} refuses {name} with {'; '.join(reasons)} (Selected backend is not valid for this configuration)",
        )


# The checks between settings, one function each; VllmKnowledge.startup_checks says which
# a version raises and where. Each yields (key, message) for the flags that trip it.
