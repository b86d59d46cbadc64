"""What a pinned vLLM release accepts: env var names and ``vllm serve`` flags.

The per-version tables under ``knowledge/`` are generated from vLLM's own source
by ``scripts/extract_vllm_knowledge.py``; ``replaced.toml`` is curated and says
what replaced a setting that a newer vLLM (or V1) no longer knows, so an error can
say what to write instead.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

FlagKind = Literal["bool", "switch", "value", "optional_value"]


@dataclass(frozen=True)
class Flag:
    """One ``vllm serve`` flag. ``bool`` flags also accept ``--no-<name>``.

    ``upper_case`` choices are Enum members that vLLM looks up with
    ``value.upper()``; ``json_fields`` are the keys of a JSON config flag (its
    config forbids any other), each a Flag of its own, nested for a nested config;
    ``bounds`` are the pydantic ``gt``/``ge``/``lt``/``le`` of the config field
    behind it; ``settable`` is False for a field the config computes itself;
    ``default`` is the version's default where it is a constant.
    """

    name: str
    kind: FlagKind
    choices: tuple[str, ...] = ()
    upper_case: bool = False
    json_fields: dict[str, Flag] | None = None
    json: str | None = None  # a dict flag without a config: "object" (json.loads) or "object-or-string" ({...} is JSON)
    default: str | int | float | bool | None = None
    bounds: tuple[tuple[str, float], ...] = ()
    settable: bool = True

    def accepts(self, value: str) -> bool:
        """Whether ``value`` is one of the choices, the way vLLM compares it."""
        return (value.upper() if self.upper_case else value) in self.choices

    def out_of_bounds(self, value: float) -> str | None:
        """The bound ``value`` breaks, written as pydantic says it (``greater than 0``), or None."""
        words = {"gt": "greater than", "ge": "greater than or equal to", "lt": "less than", "le": "less than or equal to"}
        tests = {"gt": value.__gt__, "ge": value.__ge__, "lt": value.__lt__, "le": value.__le__}
        for op, limit in self.bounds:
            if not tests[op](limit):
                return f"{words[op]} {limit:g}"
        return None


@dataclass(frozen=True)
class Quantization:
    """``--quantization`` as ``ModelConfig._verify_quantization`` checks it on ROCm.

    ``deprecated_flag`` is the flag that admits a deprecated method (None where the
    version has none); ``rocm_sets_env`` are env vars ROCm sets itself for a method.
    """

    methods: frozenset[str]
    deprecated: frozenset[str]
    deprecated_flag: str | None
    rocm: frozenset[str]
    rocm_sets_env: frozenset[str]
    source: str


@dataclass(frozen=True)
class Backend:
    """What one ROCm attention backend's ``validate_configuration`` accepts (None: not declared, so not checked)."""

    name: str
    kv_cache_dtypes: tuple[str, ...] | None
    block_sizes: tuple[int | str, ...] | None  # "*16": any multiple of 16
    is_mla: bool
    is_sparse: bool
    supports_sink: bool

    def accepts_kv_cache_dtype(self, dtype: str) -> bool:
        return not self.kv_cache_dtypes or dtype in self.kv_cache_dtypes

    def accepts_block_size(self, size: int) -> bool:
        if not self.block_sizes:
            return True
        return any(size % int(str(s).lstrip("*")) == 0 for s in self.block_sizes)


@dataclass(frozen=True)
class Replacement:
    """Why a name is gone and what to use instead."""

    replacement: str
    why: str
    source: str


# The histogram a TTFT SLO counts requests in, at one of its bucket bounds (validate.validate_slo, commands/slo.py).
TTFT = "vllm:time_to_first_token_seconds"


@dataclass(frozen=True)
class Histogram:
    """A vLLM histogram's bucket upper bounds as its source fixes them; ``family``: the key of
    ``--custom-histogram-buckets`` that replaces them (0.33.0 on), None where no flag does."""

    buckets: tuple[float, ...]
    family: str | None = None

    def bounds(self, custom: dict[str, list[float]] | None) -> tuple[float, ...]:
        """The bounds an instance exposes, with its ``--custom-histogram-buckets`` (parsed) applied."""
        if custom and self.family in custom:
            return tuple(float(b) for b in custom[self.family])
        return self.buckets


@dataclass(frozen=True)
class Exclusive:
    """A flag and a key of a JSON-config flag that set the same thing: ``EngineArgs`` refuses them together."""

    flag: str  # "--attention-backend"
    config: str  # "--attention-config"
    key: str  # "backend"
    source: str  # file:line of the raise


@dataclass(frozen=True)
class SchedulerTier:
    """``vllm serve``'s defaults for the scheduler's limits on a GPU of at least ``min_gib`` GiB."""

    min_gib: int
    max_num_batched_tokens: int
    max_num_seqs: int
    source: str


@dataclass(frozen=True)
class SchedulerDefaults:
    """What vLLM sets --max-num-batched-tokens and --max-num-seqs to when they are absent (``EngineArgs``)."""

    tiers: tuple[SchedulerTier, ...]  # largest memory first
    seqs_capped_by_batched: bool  # max_num_seqs = min(default, max_num_batched_tokens)
    throughput_doubles: bool  # --performance-mode throughput doubles both defaults
    chunked_off_batched: str  # with chunked prefill off: "model_len", or "max(model_len, default)"

    def tier(self, hbm_gib: int) -> SchedulerTier | None:
        return next((t for t in self.tiers if hbm_gib >= t.min_gib), None)


@dataclass(frozen=True)
class VllmKnowledge:
    version: str
    source: str
    env_vars: frozenset[str]
    env_unread: frozenset[str]  # defined in envs.py, but no running code reads them
    compile_env: frozenset[str]  # the env vars vLLM folds into its torch.compile cache key (envs.compile_factors)
    flags: dict[str, Flag]
    aliases: dict[str, str]
    frontend: frozenset[str]  # the server's own flags (--port, --api-key): no engine setting, no part of the compile key
    quantization: Quantization
    backends: dict[str, Backend]  # the backends ROCm can pick; empty where the version declares none
    backends_source: str
    # the order vLLM tries ROCm backends in for an MHA model, each with the condition that lists it (its source, None:
    # always), when no backend is named (vllmsource/platform.py mha_priority); empty where the table has none
    backend_priority: tuple[tuple[str, str | None], ...]
    mx_architectures: tuple[str, ...]  # gfx prefixes with native MXFP4/MXFP6 (RocmPlatform.supports_mx)
    startup_checks: dict[str, str]  # check id -> the file:line that raises it in this version
    # check id -> the conditions under which that line raises, as vLLM's source writes them (vllmsource/checks.py);
    # empty for a project's table extracted before they were read
    startup_conditions: dict[str, tuple[str, ...]]
    # --distributed-executor-backend -> the executor class vLLM runs (vllmsource/checks.py), and the classes that
    # support async scheduling; both empty for a project's table extracted before they were read
    executors: dict[str, dict[str, str]]
    async_executors: frozenset[str]
    exclusive: tuple[Exclusive, ...]
    scheduler_defaults: SchedulerDefaults | None
    startup_log: dict[str, tuple[str, ...]]  # phase -> the logger format strings vLLM writes for it
    metrics: dict[str, str]  # every vllm: Prometheus metric its V1 loggers create -> gauge, counter or histogram
    # the histograms whose bucket bounds the source fixes (vllmsource/metrics.py), and the finished_reason values of
    # vllm:request_success; both empty for a project's table extracted before they were read
    histograms: dict[str, Histogram]
    finish_reasons: tuple[str, ...]
    # The path prefixes --api-key guards, and every route the HTTP server declares (path -> its methods), read from the
    # source (vllmsource/routes.py); both empty for a project's table extracted before they were read.
    guarded_prefixes: tuple[str, ...] = ()
    routes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def keyless_routes(self) -> tuple[str, ...]:
        """The routes that answer without the API key, whoever reaches the port: every route outside the guarded
        prefixes (``/health``, ``/metrics``, ``/tokenize``, ``/pause``...); empty when the table does not know."""
        if not self.guarded_prefixes:
            return ()
        return tuple(sorted(path for path in self.routes if not path.startswith(self.guarded_prefixes)))

    def canonical_flag(self, name: str) -> str | None:
        """Return the long flag name (without dashes) for ``name``, or None if unknown.

        ``name`` may carry leading dashes, underscores (vLLM's parser turns them
        into dashes), be a short alias such as ``tp`` or a unique prefix.
        """
        bare = name.lstrip("-").replace("_", "-")
        if f"--{bare}" in self.flags:
            return bare
        for alias in (f"-{bare}", f"--{bare}"):
            if alias in self.aliases:
                return self.aliases[alias].lstrip("-")
        # argparse accepts a unique prefix of a long option (001:36 writes --tensor-parallel)
        prefixed = [f for f in self.flags if f.startswith(f"--{bare}")]
        return prefixed[0].lstrip("-") if len(prefixed) == 1 else None

    def removed(self, name: str, table: dict[str, Replacement]) -> tuple[str, Replacement] | None:
        """The entry of ``table`` that ``name`` (or a prefix spelling of it) refers to."""
        bare = name.lstrip("-").replace("_", "-")
        hits = [k for k in table if k == bare or k.startswith(bare)]
        return (hits[0], table[hits[0]]) if len(hits) == 1 else None

    def flag(self, name: str) -> Flag:
        return self.flags[f"--{name}"]

    def suggest_flag(self, name: str) -> list[str]:
        bare = name.lstrip("-").replace("_", "-")
        pool = [f.lstrip("-") for f in self.flags]
        prefixed = [f for f in pool if f.startswith(bare)]
        close = difflib.get_close_matches(bare, pool, n=3, cutoff=0.75)
        return list(dict.fromkeys(prefixed[:3] + close))[:3]

    def suggest_env(self, name: str) -> list[str]:
        return difflib.get_close_matches(name, sorted(self.env_vars), n=3, cutoff=0.75)


@dataclass(frozen=True)
class Seed:
    """One of the public documents the recipes and rules cite (``knowledge/seeds/index.toml``)."""

    number: str  # "000" to "004", as citations write it
    file: str
    title: str
    kind: str


@cache
def seeds() -> dict[str, Seed]:
    """The seeds by number, shipped with the package so that a citation can be checked where the package is installed."""
    index = tomllib.loads(resources.files("instinct_fleet.model").joinpath("knowledge", "seeds", "index.toml").read_text())
    return {s["file"][:3]: Seed(s["file"][:3], s["file"], s["title"], s["kind"]) for s in index["seed"]}


CITATION = re.compile(r"\b(00[0-4]):\d+(?:-\d+)?\b")


def without_lines(text: str) -> str:
    """Citations as a user guide gives them: ``(002:23, 003:59)`` becomes ``(seed 002, seed 003)``. The lines stay in the
    code and in docs/seeds.md, where tests/unit/test_citations.py checks each one."""
    return CITATION.sub(lambda m: f"seed {m.group(1)}", text)


def seed_text(number: str) -> str:
    """The text of seed ``number`` ("002"), as published."""
    return resources.files("instinct_fleet.model").joinpath("knowledge", "seeds", seeds()[number].file).read_text()


def supported_versions() -> list[str]:
    """Versions with a generated table, oldest first."""
    files = resources.files("instinct_fleet.model").joinpath("knowledge").iterdir()
    versions = [f.name[len("vllm-") : -len(".json")] for f in files if f.name.startswith("vllm-")]
    return sorted(versions, key=lambda v: tuple(int(p) for p in v.split(".")))


def find(version: str) -> VllmKnowledge | None:
    """The table for ``version``, or None when there is none (validation reports that once, as version-unsupported)."""
    try:
        return load(version)
    except KeyError:
        return None


def shipped_file(version: str) -> Traversable:
    """Where the package keeps the table of ``version`` (whether or not it ships one)."""
    return resources.files("instinct_fleet.model").joinpath("knowledge", f"vllm-{version}.json")


@cache
def load(version: str) -> VllmKnowledge:
    """Load the table for ``version``; raise KeyError if there is none."""
    if version not in supported_versions():
        raise KeyError(version)
    return from_json(json.loads(shipped_file(version).read_text()))


@cache
def load_file(path: Path) -> VllmKnowledge:
    """A table extracted into a project (``instinct-fleet vllm-facts``); KeyError or ValueError when it is not one."""
    return from_json(json.loads(path.read_text()))


def from_json(data: dict[str, Any]) -> VllmKnowledge:
    """A table as the extractor writes it (instinct_fleet/model/extract.py)."""
    flags = {name: _flag(name.lstrip("-"), info) for name, info in data["flags"].items()}
    quant = data["quantization"]
    backends = data["attention_backends"]
    return VllmKnowledge(
        version=data["version"],
        source=data["source"],
        env_vars=frozenset(data["env_vars"]),
        env_unread=frozenset(data["env_unread"]),
        compile_env=frozenset(data["compile_env"]),
        flags=flags,
        aliases=dict(data["aliases"]),
        frontend=frozenset(data["frontend"]),
        quantization=Quantization(
            methods=frozenset(quant["methods"]),
            deprecated=frozenset(quant["deprecated"]),
            deprecated_flag=quant["deprecated_flag"],
            rocm=frozenset(quant["rocm"]),
            rocm_sets_env=frozenset(quant["rocm_sets_env"]),
            source=quant["source"],
        ),
        backends={
            name: Backend(
                name=name,
                kv_cache_dtypes=tuple(b["kv_cache_dtypes"]) if "kv_cache_dtypes" in b else None,
                block_sizes=tuple(b["block_sizes"]) if "block_sizes" in b else None,
                is_mla=b.get("is_mla", False),
                is_sparse=b.get("is_sparse", False),
                supports_sink=b.get("supports_sink", False),
            )
            for name, b in backends.get("rocm", {}).items()
        },
        backends_source=backends.get("source", ""),
        backend_priority=tuple((str(name), condition) for name, condition in backends.get("mha_priority", [])),
        mx_architectures=tuple(data["mx_architectures"]),
        startup_checks=dict(data["startup_checks"]),
        startup_conditions={check: tuple(stated["when"]) for check, stated in data.get("startup_conditions", {}).items()},
        executors={backend: dict(choice) for backend, choice in data.get("executors", {}).items()},
        async_executors=frozenset(data.get("async_executors", ())),
        exclusive=tuple(Exclusive(**e) for e in data["exclusive"]),
        scheduler_defaults=_scheduler_defaults(data["scheduler_defaults"]),
        startup_log={phase: tuple(formats) for phase, formats in data["startup_log"].items()},
        metrics=dict(data.get("metrics", {})),  # a project's table extracted before metrics were read has none
        histograms={name: Histogram(tuple(h["buckets"]), h.get("family")) for name, h in data.get("histogram_buckets", {}).items()},
        finish_reasons=tuple(data.get("finish_reasons", ())),
        guarded_prefixes=tuple(data.get("guarded_prefixes", ())),
        routes=_routes(data.get("routes", ())),
    )


def _routes(listed: Any) -> dict[str, tuple[str, ...]]:
    """The table's routes, one entry per path with every method it answers (a path declared per verb is one path)."""
    found: dict[str, set[str]] = {}
    for route in listed:
        found.setdefault(route["path"], set()).update(route["methods"])
    return {path: tuple(sorted(methods)) for path, methods in sorted(found.items())}


def _scheduler_defaults(data: dict[str, Any]) -> SchedulerDefaults | None:
    if not data:
        return None
    return SchedulerDefaults(
        tiers=tuple(SchedulerTier(**t) for t in data["tiers"]),
        seqs_capped_by_batched=data["seqs_capped_by_batched"],
        throughput_doubles=data["throughput_doubles"],
        chunked_off_batched=data["chunked_off_batched"],
    )


def _flag(name: str, info: dict[str, Any]) -> Flag:
    """A flag, or a JSON config key, from its generated table entry (nested configs recursively)."""
    nested = info.get("json_fields", info.get("fields"))
    return Flag(
        name=name,
        kind=info.get("kind", "value"),
        choices=tuple(info.get("choices", ())),
        upper_case=info.get("choices_case") == "upper",
        json_fields={k: _flag(k, v) for k, v in nested.items()} if nested is not None else None,
        json=info.get("json"),
        default=info.get("default"),
        bounds=tuple(sorted(info.get("bounds", {}).items())),
        settable=info.get("settable", True),
    )


@cache
def replacements() -> tuple[dict[str, Replacement], dict[str, Replacement]]:
    """Curated tables of removed flags and env vars: (flags, env)."""
    path = resources.files("instinct_fleet.model").joinpath("knowledge", "replaced.toml")
    data = tomllib.loads(path.read_text())
    flags = {k: Replacement(**v) for k, v in data.get("flags", {}).items()}
    env = {k: Replacement(**v) for k, v in data.get("env", {}).items()}
    return flags, env


# argparse's own test for a negative number (ArgumentParser._negative_number_matcher): such a token, and a
# lone "-", are values; any other token that starts with "-" is read as an option.
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def is_option(arg: str) -> bool:
    """Whether argparse (vLLM's reader of its command line) takes ``arg`` for an option rather than a value."""
    return arg.startswith("-") and arg != "-" and not NEGATIVE_NUMBER.match(arg)
