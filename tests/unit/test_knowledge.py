"""The extractor reads vLLM's source without importing it, and the tables hold what the seeds need."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from instinct_fleet.model import knowledge, startup
from instinct_fleet.model.defaults import GPU_HBM_GIB
from instinct_fleet.model.vllmsource import checks as vllm_checks
from instinct_fleet.model.vllmsource import flags as vllm_flags

ROOT = Path(__file__).resolve().parents[2]

ENVS = """
environment_variables: dict[str, Callable[[], Any]] = {
    "VLLM_ROCM_USE_AITER": lambda: False,
    "VLLM_HOST_IP": lambda: "",
    "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION": lambda: False,
    "VLLM_RPC_TIMEOUT": lambda: 10000,
}
def compile_factors() -> dict[str, object]:
    ignored_factors: set[str] = {
        "VLLM_HOST_IP",
        "VLLM_RPC_TIMEOUT",
        "LD_LIBRARY_PATH",
    }
"""
# Read as 0.22.0 does: AITER through a classmethod something calls, unified attention into an
# attribute whose only reader is a method nobody calls; VLLM_RPC_TIMEOUT nowhere; VLLM_HOST_IP as a default.
AITER_OPS = """
import vllm.envs as envs
class rocm_aiter_ops:
    _AITER_ENABLED = envs.VLLM_ROCM_USE_AITER
    _TRITON_UNIFIED_ATTN_ENABLED = envs.VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION
    @classmethod
    def is_enabled(cls):
        return cls._AITER_ENABLED
    @classmethod
    def is_triton_unified_attn_enabled(cls):
        return cls._AITER_ENABLED and cls._TRITON_UNIFIED_ATTN_ENABLED
def get_ip(ip: str = envs.VLLM_HOST_IP):
    return ip
if rocm_aiter_ops.is_enabled():
    pass
"""
CONFIG = """
import enum
from typing import Literal
CacheDType = Literal["auto", "fp8"]
class CacheConfig:
    cache_dtype: CacheDType | str = "auto"
    enable_prefix_caching: bool = True
class CUDAGraphMode(enum.Enum):
    NONE = 0
    FULL = 2
class CompilationConfig:
    cudagraph_mode: CUDAGraphMode = None
    level: int | None = None
class VllmConfig:
    compilation_config: CompilationConfig = None
    speculative_config: SpeculativeConfig | None = None
"""
REGISTRY = """
from enum import Enum
class AttentionBackendEnum(Enum):
    ROCM_ATTN = "a"
    ROCM_AITER_FA = "b"
class AttentionConfig:
    backend: AttentionBackendEnum | None = None
"""
ARG_UTILS = """
class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        cache_kwargs = get_kwargs(CacheConfig)
        attention_kwargs = get_kwargs(AttentionConfig)
        vllm_kwargs = get_kwargs(VllmConfig)
        g = parser.add_argument_group()
        g.add_argument("--attention-backend", **attention_kwargs["backend"])
        g.add_argument("--compilation-config", "-cc", **vllm_kwargs["compilation_config"])
        g.add_argument("--speculative-config", **vllm_kwargs["speculative_config"])
        scheduler_kwargs = get_kwargs(SchedulerConfig)
        g.add_argument("--max-num-seqs", **scheduler_kwargs["max_num_seqs"])
        g.add_argument("--kv-cache-dtype", **cache_kwargs["cache_dtype"])
        g.add_argument("--enable-prefix-caching", **{**cache_kwargs["enable_prefix_caching"], "default": None})
        g.add_argument("--tensor-parallel-size", "-tp", type=int)
        g.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
"""
CLI_ARGS = """
class BaseFrontendArgs:
    host: str | None = None
class FrontendArgs(BaseFrontendArgs):
    port: int = 8000
    enable_auto_tool_choice: bool = False
def make_arg_parser(parser):
    parser.add_argument("--headless", action="store_true")
"""


QUANT = """
from typing import Literal
QuantizationMethods = Literal["awq", "fp8", "fbgemm_fp8", "quark"]
DEPRECATED_QUANTIZATION_METHODS = ["fbgemm_fp8"]
"""
ROCM = """
import os
def _get_backend_priorities(use_mla, use_sparse):
    if use_mla:
        return [AttentionBackendEnum.ROCM_AITER_MLA]
    backends = [AttentionBackendEnum.ROCM_ATTN]
    if rocm_aiter_ops.is_mha_enabled():
        backends.append(AttentionBackendEnum.ROCM_AITER_FA)
    elif rocm_aiter_ops.is_rdna_aiter_enabled():
        backends.insert(0, AttentionBackendEnum.ROCM_AITER_FA)
    return backends
class RocmPlatform:
    supported_quantization: list[str] = ["awq", "fp8", "fbgemm_fp8"]
    @classmethod
    def verify_quantization(cls, quant):
        if quant == "awq":
            os.environ["VLLM_USE_TRITON_AWQ"] = "1"
    @classmethod
    def supports_mx(cls):
        return any(gfx in _GCN_ARCH for gfx in ["gfx95"])
"""
BACKENDS = """
class AttentionBackend:
    supported_kv_cache_dtypes = []
    @staticmethod
    def get_supported_kernel_block_sizes():
        return [MultipleOf(1)]
    @classmethod
    def supports_block_size(cls, block_size):
        return True
    @classmethod
    def is_mla(cls):
        return False
    @classmethod
    def supports_sink(cls):
        return False
class RocmAttentionBackend(AttentionBackend):
    supported_kv_cache_dtypes = ["auto", "fp8"]
    @staticmethod
    def get_supported_kernel_block_sizes():
        return [MultipleOf(16)]
class AiterFlashAttentionBackend(AttentionBackend):
    @staticmethod
    def get_supported_kernel_block_sizes():
        return [16, 32]
    @classmethod
    def supports_sink(cls):
        \"\"\"Sinks since this release.\"\"\"
        return True
class AiterMLABackend(AttentionBackend):
    @classmethod
    def is_mla(cls):
        return True
    @classmethod
    def supports_block_size(cls, block_size):
        if block_size is None:
            return True
        return block_size % 1 == 0
"""
BACKEND_REGISTRY = """
from enum import Enum
class AttentionBackendEnum(Enum):
    ROCM_ATTN = "vllm.v1.attention.backends.rocm_attn.RocmAttentionBackend"
    ROCM_AITER_FA = (
        "vllm.v1.attention.backends.rocm_aiter_fa."
        "AiterFlashAttentionBackend"
    )
    ROCM_AITER_MLA = "vllm.v1.attention.backends.mla.rocm_aiter_mla.AiterMLABackend"
    FLASHINFER = "vllm.v1.attention.backends.flashinfer.FlashInferBackend"
"""
SCHEDULER = """
from pydantic import Field
class SchedulerConfig:
    max_num_seqs: int = Field(default=128, ge=1)
    encoder_cache_size: int = Field(init=False)
    def verify(self):
        if self.strict:
            return
        else:
            if self.max_num_batched_tokens < self.max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({self.max_num_batched_tokens}) must "
                    "be greater than or equal to max_num_seqs "
                    f"({self.max_num_seqs})."
                )
"""
SPECULATIVE = """
from typing import Literal
from pydantic import Field
EagleModelTypes = Literal["eagle", "eagle3"]
SpeculativeMethod = Literal["ngram", EagleModelTypes]
class SpeculativeConfig:
    num_speculative_tokens: int = Field(default=None, gt=0)
    method: SpeculativeMethod | None = None
"""


def _extractor() -> ModuleType:
    from instinct_fleet.model import extract

    return extract


def _script() -> ModuleType:
    """scripts/extract_vllm_knowledge.py, which regenerates a shipped table with the package's extractor."""
    spec = importlib.util.spec_from_file_location("extract_script", ROOT / "scripts" / "extract_vllm_knowledge.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# vLLM's V1 Prometheus logger as it creates its metrics (vllm/v1/metrics/loggers.py), and a name built at run time.
LOGGERS = """
class PrometheusStatLogger:
    def __init__(self, labelnames):
        running = self._gauge_cls(name="vllm:num_requests_running", documentation="...", labelnames=labelnames)
        tokens = self._counter_cls(name="vllm:generation_tokens", documentation="...", labelnames=labelnames)
        steps = self._histogram_cls(name="vllm:iteration_tokens_total", buckets=[1, 8], labelnames=labelnames)
        other = self._gauge_cls(name=f"vllm:{labelnames[0]}", documentation="...")
        foreign = self._counter_cls(name="ray_serve:requests", documentation="...")
"""


def synthetic_wheel(directory: Path, version: str = "9.9.9") -> Path:
    """A small vLLM wheel: the source files the extractor reads, and the metadata pip reads when it downloads one."""
    wheel = directory / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    info = f"vllm-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: cp38-abi3-manylinux_2_28_x86_64\n")
        zf.writestr(f"{info}/RECORD", "")
        zf.writestr("vllm/envs.py", ENVS)
        zf.writestr("vllm/v1/metrics/loggers.py", LOGGERS)
        zf.writestr("vllm/config/cache.py", CONFIG)
        zf.writestr("vllm/config/attention.py", REGISTRY)
        zf.writestr("vllm/_aiter_ops.py", AITER_OPS)
        zf.writestr("vllm/engine/arg_utils.py", ARG_UTILS)
        zf.writestr("vllm/entrypoints/openai/cli_args.py", CLI_ARGS)
        zf.writestr("vllm/model_executor/layers/quantization/__init__.py", QUANT)
        zf.writestr("vllm/platforms/rocm.py", ROCM)
        zf.writestr("vllm/v1/attention/backend.py", BACKENDS.split("class RocmAttentionBackend")[0])
        zf.writestr(
            "vllm/v1/attention/backends/rocm_attn.py", "class RocmAttentionBackend" + BACKENDS.split("class RocmAttentionBackend")[1]
        )
        zf.writestr("vllm/v1/attention/backends/registry.py", BACKEND_REGISTRY)
        zf.writestr("vllm/config/scheduler.py", SCHEDULER)
        zf.writestr("vllm/config/speculative.py", SPECULATIVE)
    return wheel


def test_extractor_on_a_synthetic_wheel(tmp_path: Path) -> None:
    wheel = synthetic_wheel(tmp_path)
    assert _script().main([str(wheel), "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "vllm-9.9.9.json").read_text())
    assert data["env_vars"] == ["VLLM_HOST_IP", "VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION", "VLLM_RPC_TIMEOUT"]
    assert data["env_unread"] == ["VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION", "VLLM_RPC_TIMEOUT"]
    # compile_factors hashes every known env var but its ignored ones (a name it ignores that envs.py lacks is no var).
    assert data["compile_env"] == ["VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION"]
    # The server's own flags (cli_args.py's parser and FrontendArgs), no engine setting: no part of the compile key.
    assert set(data["frontend"]) < set(data["flags"]) and {"--port", "--host"} <= set(data["frontend"])
    assert not {"--max-num-seqs", "--tensor-parallel-size", "--kv-cache-dtype"} & set(data["frontend"])
    assert data["flags"] == {
        # The registry's enum (the one vLLM has) wins over the stub in config/attention.py.
        "--attention-backend": {
            "kind": "value",
            "choices": ["ROCM_ATTN", "ROCM_AITER_FA", "ROCM_AITER_MLA", "FLASHINFER"],
            "choices_case": "upper",
        },
        "--compilation-config": {
            "kind": "value",
            "json_fields": {"cudagraph_mode": {"choices": ["NONE", "FULL"], "choices_case": "upper"}, "level": {}},
        },
        "--enable-auto-tool-choice": {"kind": "bool"},
        "--enable-log-requests": {"kind": "bool"},
        "--enable-prefix-caching": {"kind": "bool", "default": True},
        "--headless": {"kind": "switch"},
        "--host": {"kind": "value"},
        "--kv-cache-dtype": {"kind": "value", "choices": ["auto", "fp8"], "default": "auto"},
        "--max-num-seqs": {"kind": "value", "default": 128, "bounds": {"ge": 1}},
        "--port": {"kind": "value"},
        "--speculative-config": {
            "kind": "value",
            "json_fields": {"num_speculative_tokens": {"bounds": {"gt": 0}}, "method": {"choices": ["ngram", "eagle", "eagle3"]}},
        },
        "--tensor-parallel-size": {"kind": "value"},
    }
    assert data["aliases"] == {"-cc": "--compilation-config", "-tp": "--tensor-parallel-size"}
    quant = data["quantization"]
    assert (quant["methods"], quant["deprecated"], quant["rocm"]) == (
        ["awq", "fp8", "fbgemm_fp8", "quark"],
        ["fbgemm_fp8"],
        ["awq", "fp8", "fbgemm_fp8"],
    )
    assert quant["deprecated_flag"] is None and quant["rocm_sets_env"] == ["VLLM_USE_TRITON_AWQ"]
    # Only the backends ROCm's priorities name; their declarations with their bases'; the class name, not get_name().
    assert data["attention_backends"]["rocm"] == {
        "ROCM_AITER_FA": {
            "class": "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend",
            "kv_cache_dtypes": [],
            "block_sizes": [16, 32],
            "is_mla": False,
            "supports_sink": True,
        },
        "ROCM_AITER_MLA": {
            "class": "vllm.v1.attention.backends.mla.rocm_aiter_mla.AiterMLABackend",
            "kv_cache_dtypes": [],
            "block_sizes": ["*1"],
            "is_mla": True,
            "supports_sink": False,
        },
        "ROCM_ATTN": {
            "class": "vllm.v1.attention.backends.rocm_attn.RocmAttentionBackend",
            "kv_cache_dtypes": ["auto", "fp8"],
            "block_sizes": ["*16"],
            "is_mla": False,
            "supports_sink": False,
        },
    }
    # The order an MHA model tries them in, each with the condition that lists it; another GPU family's front is not ours.
    assert data["attention_backends"]["mha_priority"] == [["ROCM_ATTN", None], ["ROCM_AITER_FA", "rocm_aiter_ops.is_mha_enabled()"]]
    assert data["mx_architectures"] == ["gfx95"]
    # A check is carried where the source raises its message: the concatenated f-string is matched, at its line.
    assert data["startup_checks"] == {"scheduler-batched-below-seqs": "vllm/config/scheduler.py:12"}
    # ... with the conditions that lead to the raise (an else branch's as its negation), its exception and message.
    assert data["startup_conditions"] == {
        "scheduler-batched-below-seqs": {
            "when": ["not (self.strict)", "self.max_num_batched_tokens < self.max_num_seqs"],
            "raises": "ValueError",
            "says": "f'max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than or equal to max_num_seqs ({self.max_num_seqs}).'",
        }
    }
    # The metrics as the source creates them, with their kinds; a name built at run time or not vllm's is not one.
    assert data["metrics"] == {
        "vllm:generation_tokens": "counter",
        "vllm:iteration_tokens_total": "histogram",
        "vllm:num_requests_running": "gauge",
    }


def test_start_up_checks_are_written_once_for_every_anchor() -> None:
    assert set(vllm_checks.ANCHORS) == set(startup.CHECKS)
    for version in knowledge.supported_versions():
        assert set(knowledge.load(version).startup_checks) <= set(startup.CHECKS)


def test_generated_tables_know_what_the_seeds_use() -> None:
    assert knowledge.supported_versions() == ["0.11.0", "0.22.0", "0.33.0"]
    table = knowledge.load("0.22.0")
    for flag in ("--no-enable-chunked-prefill", "--trust-remote-code", "--attention-backend", "--disable-nccl-for-dp-synchronization"):
        assert table.canonical_flag(flag.replace("--no-", "--")) is not None, flag
    assert table.flag("enable-chunked-prefill").kind == "bool"
    assert "fp8" in table.flag("kv-cache-dtype").choices
    assert {"VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MHA", "VLLM_ROCM_QUICK_REDUCE_QUANTIZATION"} <= table.env_vars
    assert table.canonical_flag("tp") == "tensor-parallel-size"
    assert table.canonical_flag("tensor-parallel") == "tensor-parallel-size"
    old = knowledge.load("0.11.0")
    assert "VLLM_USE_AITER_UNIFIED_ATTENTION" in old.env_vars and "VLLM_USE_AITER_UNIFIED_ATTENTION" not in table.env_vars


def test_the_tables_know_which_env_vars_are_never_read() -> None:
    # 0.22.0 parses these but nothing that runs reads them (checked by hand against the wheel's source).
    assert {"VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION", "VLLM_RPC_TIMEOUT", "VLLM_ROCM_USE_AITER_PAGED_ATTN"} <= knowledge.load(
        "0.22.0"
    ).env_unread
    assert "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION" in knowledge.load("0.33.0").env_unread
    for version in knowledge.supported_versions():
        table = knowledge.load(version)
        assert table.env_unread <= table.env_vars
        # What the recipes rely on is read.
        assert not {"VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MHA", "VLLM_ROCM_QUICK_REDUCE_QUANTIZATION"} & table.env_unread


def test_no_replacement_offers_a_variable_that_does_nothing() -> None:
    flags, env = knowledge.replacements()
    dead = set().union(*(knowledge.load(v).env_unread for v in knowledge.supported_versions()))
    for name, r in {**flags, **env}.items():
        assert not [d for d in dead if d in r.replacement], name


def test_choices_come_from_vllms_enums_and_json_configs() -> None:
    table = knowledge.load("0.22.0")
    backend = table.flag("attention-backend")
    assert backend.accepts("ROCM_AITER_FA") and backend.accepts("rocm_aiter_fa") and not backend.accepts("AITER_FA")
    fields = table.flag("compilation-config").json_fields
    assert fields is not None and fields["cudagraph_mode"].accepts("full_and_piecewise")
    assert table.flag("all2all-backend").default == "allgather_reducescatter"


def test_every_replacement_names_a_setting_the_default_version_lacks() -> None:
    flags, env = knowledge.replacements()
    table = knowledge.load("0.22.0")
    newest = knowledge.load("0.33.0")
    for name in flags:
        assert f"--{name}" not in newest.flags, name
    for name in env:
        assert name not in newest.env_vars, name
    assert "--disable-log-requests" not in table.flags


@pytest.mark.parametrize("value", ["-", "-1", "-0.5", "-.5", "-x", "--foo", "-1x", "a-b", "x"])
def test_is_option_agrees_with_argparse_itself(value: str) -> None:
    """vLLM reads its command line with argparse: a value the validator lets through must parse as the value."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--served-model-name")
    try:
        parsed = parser.parse_args(["--served-model-name", value]).served_model_name == value
    except (argparse.ArgumentError, SystemExit):
        parsed = False
    assert parsed == (not knowledge.is_option(value))


def test_the_package_ships_every_seed_the_citations_name_with_the_text_published() -> None:
    """Each seed in the index is in the package, byte for byte the document as published (the copy in ../shared/seeds)."""
    shipped = knowledge.seeds()
    assert sorted(shipped) == ["000", "001", "002", "003", "004"]
    for number, seed in shipped.items():
        assert seed.file.startswith(number) and seed.title
        assert "vllm serve" in knowledge.seed_text(number)
    assert "2026-05-29" in knowledge.seed_text("002").splitlines()[1]


# EngineArgs as vLLM 0.22.0 writes the parts the two extractions below read (vllm/engine/arg_utils.py).
ENGINE_ARGS = """
class EngineArgs:
    def create_speculative_config(self):
        for flag, key, value in (
            ("--spec-method", "method", self.spec_method),
            ("--spec-tokens", "num_speculative_tokens", self.spec_tokens),
        ):
            if key in self.speculative_config:
                raise ValueError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")

    def create_engine_config(self):
        if self.attention_backend is not None:
            if attention_config.backend is not None:
                raise ValueError(
                    "attention_backend and attention_config.backend "
                    "are mutually exclusive"
                )

    @classmethod
    def get_batch_defaults(cls, world_size):
        if device_memory >= 160 * GiB_bytes:
            default_max_num_batched_tokens = {UsageContext.LLM_CLASS: 16384, UsageContext.OPENAI_API_SERVER: 16384}
            default_max_num_seqs = {UsageContext.LLM_CLASS: 1024, UsageContext.OPENAI_API_SERVER: 1024}
        elif device_memory >= 70 * GiB_bytes and "a100" not in device_name:
            default_max_num_batched_tokens = {UsageContext.LLM_CLASS: 16384, UsageContext.OPENAI_API_SERVER: 8192}
            default_max_num_seqs = {UsageContext.LLM_CLASS: 1024, UsageContext.OPENAI_API_SERVER: 1024}
        else:
            default_max_num_batched_tokens = {UsageContext.LLM_CLASS: 8192, UsageContext.OPENAI_API_SERVER: 2048}
            default_max_num_seqs = {UsageContext.LLM_CLASS: 256, UsageContext.OPENAI_API_SERVER: 256}

    def _set_default_max_num_seqs_and_batched_tokens_args(self, usage_context, model_config):
        if self.performance_mode == "throughput":
            self.max_num_seqs *= 2
        if not self.enable_chunked_prefill:
            self.max_num_batched_tokens = max(model_config.max_model_len, self.max_num_batched_tokens)
"""


def test_exclusive_settings_and_scheduler_defaults_are_read_from_engine_args() -> None:
    assert vllm_flags.exclusive_settings(ENGINE_ARGS) == [
        {"flag": "--attention-backend", "config": "--attention-config", "key": "backend", "source": "vllm/engine/arg_utils.py:15"},
        {"flag": "--spec-method", "config": "--speculative-config", "key": "method", "source": "vllm/engine/arg_utils.py:9"},
        {
            "flag": "--spec-tokens",
            "config": "--speculative-config",
            "key": "num_speculative_tokens",
            "source": "vllm/engine/arg_utils.py:9",
        },
    ]
    # Largest memory first; the tier below 70 GiB has no floor, so it is never one an Instinct GPU falls in.
    assert vllm_flags.scheduler_defaults(ENGINE_ARGS) == {
        "tiers": [
            {"min_gib": 160, "max_num_batched_tokens": 16384, "max_num_seqs": 1024, "source": "vllm/engine/arg_utils.py:21"},
            {"min_gib": 70, "max_num_batched_tokens": 8192, "max_num_seqs": 1024, "source": "vllm/engine/arg_utils.py:24"},
        ],
        "seqs_capped_by_batched": False,
        "throughput_doubles": True,
        "chunked_off_batched": "max(model_len, default)",
    }


def test_each_gpu_model_falls_in_the_tier_vllm_gives_its_memory() -> None:
    """MI300X's 192 GiB is in 0.33.0's top tier (16384 batched tokens) and 0.22.0's only large one (8192)."""
    new, old = (knowledge.load(v).scheduler_defaults for v in ("0.33.0", "0.22.0"))
    assert new is not None and old is not None
    assert {gpu: getattr(new.tier(gib), "max_num_batched_tokens", None) for gpu, gib in GPU_HBM_GIB.items()} == dict.fromkeys(
        GPU_HBM_GIB, 16384
    )
    assert getattr(old.tier(GPU_HBM_GIB["MI300X"]), "max_num_batched_tokens", None) == 8192


@pytest.mark.parametrize(
    ("annotation", "form"),
    [
        ("dict[str, Any]", "object"),  # json.loads alone
        ("dict[str, Any] | None", "object"),
        ("dict | SupportsHash", "object-or-string"),  # a class beside the dict: union_dict_and_str
        ("str | dict[str, str] | None", "object-or-string"),
        ("dict[str, int] | int", None),  # int comes first in get_kwargs' chain
        ("list[dict[str, Any]]", None),
    ],
)
def test_a_dict_flag_is_read_as_get_kwargs_reads_it(annotation: str, form: str | None) -> None:
    assert vllm_flags._json_form(ast.parse(annotation, mode="eval").body) == form


def test_a_config_beside_the_dict_it_is_built_from_gives_its_keys() -> None:
    """--quantization-config: ``"dict[str, Any] | QuantizationConfigArgs | None"``, a forward reference to an @config class."""
    annotation = ast.parse('"dict[str, Any] | QuantizationConfigArgs | None"', mode="eval").body
    assert vllm_flags._config_class(annotation, {"QuantizationConfigArgs"}) == "QuantizationConfigArgs"
    assert vllm_flags._config_class(annotation, set()) is None
    fields = knowledge.load("0.22.0").flag("quantization-config").json_fields
    assert fields is not None and set(fields) == {"linear", "moe", "ignore"}


def test_an_assert_that_fails_is_stated_as_its_test_negated_under_its_branch() -> None:
    source = """
class Impl:
    def forward(self, num_decodes):
        if num_decodes > 0:
            assert not ops.is_shuffle_kv_cache_enabled(), (
                "Shuffle KV cache layout is not supported with "
                "speculative decoding (multi-token decode)."
            )
"""
    modules = {"vllm/v1/attention/backends/rocm_aiter_fa.py": source}
    found = vllm_checks.startup_conditions(modules, vllm_checks.anchored_checks(modules))
    assert found == {
        "shuffle-kv-speculative": {
            "when": ["num_decodes > 0", "not (not ops.is_shuffle_kv_cache_enabled())"],
            "raises": "AssertionError",
            "says": "'Shuffle KV cache layout is not supported with speculative decoding (multi-token decode).'",
        }
    }


def test_a_call_of_a_helper_that_raises_is_stated_with_the_helper_s_message_bound_to_the_call() -> None:
    source = """
class EngineArgs:
    def _check_feature_supported(self):
        if self.max_num_partial_prefills != SchedulerConfig.max_num_partial_prefills:
            _raise_unsupported_error(feature_name="Concurrent Partial Prefill")

def _raise_or_fallback(feature_name):
    logger.warning(f"{feature_name} falls back")

def _raise_unsupported_error(feature_name: str):
    msg = f"{feature_name} is not supported."
    raise NotImplementedError(msg)
"""
    modules = {"vllm/engine/arg_utils.py": source}
    stated = vllm_checks.startup_conditions(modules, vllm_checks.anchored_checks(modules))["partial-prefill-unsupported"]
    assert stated["when"] == ["self.max_num_partial_prefills != SchedulerConfig.max_num_partial_prefills"]
    assert stated["raises"] == "NotImplementedError"
    assert eval(str(stated["says"]), {"__builtins__": {}}) == "Concurrent Partial Prefill is not supported."
    # A helper that only warns (0.11.0's _raise_or_fallback falls back to V0) raises nothing: no check is anchored.
    warned = source.replace("_raise_unsupported_error(feature_name=", "_raise_or_fallback(feature_name=")
    assert "partial-prefill-unsupported" not in vllm_checks.anchored_checks({"vllm/engine/arg_utils.py": warned})


ABSTRACT = """
class Executor:
    @staticmethod
    def get_class(vllm_config):
        distributed_executor_backend = vllm_config.parallel_config.distributed_executor_backend
        if isinstance(distributed_executor_backend, type):
            executor_class = distributed_executor_backend
        elif distributed_executor_backend == "ray":
            if envs.VLLM_USE_RAY_V2_EXECUTOR_BACKEND:
                from vllm.v1.executor.ray_executor_v2 import RayExecutorV2
                executor_class = RayExecutorV2
            else:
                executor_class = RayDistributedExecutor
        elif distributed_executor_backend == "mp":
            executor_class = MultiprocExecutor
        return executor_class

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return False
"""
EXECUTORS = {
    "vllm/v1/executor/abstract.py": ABSTRACT,
    "vllm/v1/executor/multiproc_executor.py": "class MultiprocExecutor(Executor):\n    def supports_async_scheduling(cls):\n        return True\n",
    "vllm/v1/executor/ray_executor_v2.py": "class RayExecutorV2(MultiprocExecutor):\n    uses_ray = True\n",
    "vllm/v1/executor/ray_executor.py": "class RayDistributedExecutor(Executor):\n    uses_ray = True\n",
}
EXECUTOR_ENVS = """
environment_variables = {
    "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": lambda: bool(int(os.getenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "1"))),
}
"""


def test_the_executor_each_backend_runs_is_read_from_get_class_with_the_variable_that_splits_one() -> None:
    assert vllm_checks.executors(EXECUTORS, EXECUTOR_ENVS) == {
        "ray": {"env": "VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "default": "1", "on": "RayExecutorV2", "off": "RayDistributedExecutor"},
        "mp": {"class": "MultiprocExecutor"},
    }
    # A class supports async scheduling by its own answer or its base's: RayExecutorV2 through MultiprocExecutor.
    assert vllm_checks.async_executors(EXECUTORS) == ["MultiprocExecutor", "RayExecutorV2"]
