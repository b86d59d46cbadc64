"""One instance's launch as vLLM's start-up sees it (:class:`Launch`: flag values, env, the checkpoint), and the
curated checkpoint table (``knowledge/checkpoints.toml``): what both the start-up checks (startup.py) and the checks
between settings (settingchecks.py) read."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import SimpleNamespace

from instinct_fleet.model import knowledge
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
        return as_number(self.svc.args.get(flag))

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


def as_number(value: object) -> float | None:
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


def selected_backend(launch: Launch) -> tuple[str, str] | None:
    """The backend named by ``--attention-backend`` or ``--attention-config.backend``, with the key that names it."""
    named = launch.arg("attention-backend")
    if isinstance(named, str) and named:
        return named.upper(), launch.where("attention-backend")
    config = launch.json("attention-config")
    if config is not None and isinstance(config.get("backend"), str):
        return str(config["backend"]).upper(), launch.where("attention-config") + ".backend"
    return None


def refusals(launch: Launch, backend: knowledge.Backend) -> list[str]:
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


def is_listed(launch: Launch, condition: str | None) -> bool:
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


def running_backend(launch: Launch) -> str | None:
    """The ROCm attention backend this instance runs: the one it names, else for an MHA model the first of this
    version's priorities that is listed and takes the configuration (RocmPlatform.get_attn_backend_cls); None when
    that cannot be told (an MLA or sparse model, or a table without priorities)."""
    selected = selected_backend(launch)
    if selected is not None:
        return selected[0]
    if launch.checkpoint is not None and (launch.checkpoint.mla or launch.checkpoint.sparse):
        return None
    for name, condition in launch.table.backend_priority:
        backend = launch.table.backends.get(name)
        try:
            listed = is_listed(launch, condition)
        except (NameError, AttributeError):  # a project's table from a newer vLLM: a condition this module cannot read
            return None
        if backend is not None and listed and not refusals(launch, backend):
            return name
    return None
