"""Every user-facing variable: its type, its default and what it does, in one typed model.

:class:`FleetVars` is the model pyinfra host data is validated against
(:func:`instinct_fleet.model.spec.resolve_host`): types, ranges and forms live on its
fields, and it forbids unknown keys. ``VARIABLES`` and ``DEFAULTS`` are read off
it, ``group_data/all.py`` and docs/reference/variables.md are written from them by
``scripts/sync_variable_docs.py``, and a test keeps the three in step. Rules that
relate two variables live in :mod:`instinct_fleet.model.validate`.

A value of the wrong form fails with a custom error type that names its rule
(``value_format``, ``allow_from``); any other error is a ``schema`` finding.
"""

from __future__ import annotations

import copy
import difflib
import ipaddress
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic_core import PydanticCustomError

from instinct_fleet.model.hostrules import GPU_RULES
from instinct_fleet.model.rules import STARTS_RULES

DEFAULT_VLLM_VERSION = "0.22.0"
MAX_GPUS = 64  # logical GPUs one host can show: 8 MI300X in CPX mode
GPU_MODELS = ("MI300X", "MI325X", "MI350X", "MI355X")
# The gfx target of each GPU model (AMD's ROCm hardware specifications): vLLM decides
# native MXFP4 and FP8 kernels by it (RocmPlatform.supports_mx, on_gfx950).
GPU_ARCH = {"MI300X": "gfx942", "MI325X": "gfx942", "MI350X": "gfx950", "MI355X": "gfx950"}
# HBM per GPU (002:316): vLLM picks its scheduler defaults by the device's memory (SchedulerDefaults.tier).
GPU_HBM_GIB = {"MI300X": 192, "MI325X": 256, "MI350X": 288, "MI355X": 288}
GDR_LEVELS = ("0", "1", "2", "3", "4", "5", "LOC", "PIX", "PXB", "PHB", "SYS")


def image_tag(image: str) -> str | None:
    """The tag of an image reference, ``"@digest"`` for a digest, None without either: `latest` or none is unpinned."""
    if "@" in image:
        return "@digest"
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


# The vLLM version in an image tag, by the schemes of the images a fleet runs (first match wins):
# AMD's rocm/vllm and rocm/vllm-dev name ROCm first and vLLM after a `vllm` marker
# (rocm7.0.0_vllm_0.11.1_20251103, rocm6.3.1_instinct_vllm0.8.3_20250415, rocm6.4.1_vllm_0.9.0.1_20250605);
# vLLM's own images and AMD's dev builds start with it (v0.22.0, v0.14.0_amd_dev, v0.6.3.post1-717a5f8).
# A tag with neither (instinct_main, nightly, a commit) names no version.
_VLLM_VERSION = r"(\d+\.\d+\.\d+(?:\.\d+)?(?:\.post\d+|rc\d+)?)"
TAG_SCHEMES = (
    re.compile(rf"(?:^|[_.-])vllm[_-]?v?{_VLLM_VERSION}(?=$|[_+-])"),
    re.compile(rf"^v?{_VLLM_VERSION}(?=$|[_+-])"),
)


def tag_version(image: str) -> str | None:
    """The vLLM version an image's tag names, or None when it names none (a digest, a nightly, a commit)."""
    tag = image_tag(image.split("@", 1)[0])  # a digest's tag, when the reference keeps one (repo:tag@sha256:...)
    if tag is None:
        return None
    for scheme in TAG_SCHEMES:
        match = scheme.search(tag)
        if match:
            return match.group(1)
    return None


def default_image(version: str) -> str:
    """The upstream vLLM ROCm image for ``version``: the default, and the example in messages."""
    return f"vllm/vllm-openai-rocm:v{version}"


IMAGE_DEFAULT = default_image(DEFAULT_VLLM_VERSION)

# Docker's reference grammar (distribution/reference): domain, lower-case path, tag, digest.
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
IMAGE = re.compile(
    rf"^{_DOMAIN}?{_PATH}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{{32,}})?$"
)
# A Hugging Face repo id as huggingface_hub reads it (utils/_validators.py: REPO_ID_REGEX, then no "--" or "..",
# no ".git" end, at most one "/"): vLLM hands a model that is not a local directory to huggingface_hub.
REPO_ID = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$")
USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# A Prometheus duration of one unit (its model.ParseDuration takes these units; 1h30m is written 90m here).
DURATION = re.compile(r"^[1-9][0-9]*(ms|s|m|h|d|w|y)$")
DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
# An Alertmanager webhook receiver: http or https, a host, an optional path (Alertmanager's url field).
WEBHOOK = re.compile(r"^https?://[^\s/?#@]+(/[^\s]*)?$")
NIC = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
REGISTRY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?$")
MIRROR = re.compile(r"^https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[^\s]*)?$")
IB_HCA = re.compile(r"^\^?=?[A-Za-z0-9_]+(?::[0-9]+)?(?:,[A-Za-z0-9_]+(?::[0-9]+)?)*$")
INSTANCE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ROLLING_PERCENT = re.compile(r"^([1-9][0-9]?|100)%$")


def _form(pattern: re.Pattern[str], what: str) -> AfterValidator:
    """A string of the form ``pattern``; otherwise a value-format error that says ``what`` it must be."""

    def check(value: str) -> str:
        if not pattern.match(value):
            raise PydanticCustomError("value_format", "{shown} is not {what}", {"shown": repr(value), "what": what})
        return value

    return AfterValidator(check)


# What a host path may hold: it reaches docker's ``-v SRC:DST[:OPTS]`` (a ``:`` splits it), systemd's Exec lines (``%``
# is a specifier, ``$`` an expansion) and shell commands; a character outside this set is refused, not escaped.
HOST_PATH_CHAR = re.compile(r"[A-Za-z0-9._+@=,/-]")


def _host_path(value: str) -> str:
    if not value.startswith("/") or value == "/" or posixpath.normpath(value) != value.rstrip("/"):
        raise PydanticCustomError(
            "value_format",
            "{shown} must be an absolute, normalised path (a relative one becomes a docker volume name)",
            {"shown": repr(value)},
        )
    bad = "".join(sorted({c for c in value if not HOST_PATH_CHAR.fullmatch(c)}))
    if bad:
        raise PydanticCustomError(
            "value_format",
            "{shown} holds {bad}: a host path may hold letters, digits and . _ + @ = , - / only (docker's -v splits it at ':', "
            "systemd expands '%' and '$', a shell splits at blanks)",
            {"shown": repr(value), "bad": repr(bad)},
        )
    return value


def _model_id(value: str) -> str:
    """A model is a local directory (absolute: the unit has no working directory of its own) or a Hugging Face repo id."""
    if value.startswith("/"):
        return _host_path(value)
    if value.count("/") > 1 or not REPO_ID.match(value) or "--" in value or ".." in value or value.endswith(".git"):
        raise PydanticCustomError(
            "value_format",
            "{shown} is neither a Hugging Face repo id (name or org/name: letters, digits, '-', '_' and '.', not at either "
            "end, no '--' or '..', at most 96 characters) nor an absolute path",
            {"shown": repr(value)},
        )
    return value


def _network(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise PydanticCustomError("allow_from", "{shown} is not an IP address or network", {"shown": repr(value)}) from None
    return value


HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _address(value: str) -> str:
    """An IP address (v4 or v6) or an RFC 1123 host name: what Prometheus and a client join with a port."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    if ":" in value:
        why = "holds a port or is not an IPv6 address; the port comes from each instance and the exporter"
    elif all(label.isdigit() for label in labels):
        why = "looks like an IPv4 address but is not one"
    elif len(value) > 253 or not all(HOST_LABEL.match(label) for label in labels):
        why = "is not a host name (letters, digits and '-' in dot-separated labels)"
    else:
        return value
    raise PydanticCustomError("value_format", "{shown} {why}", {"shown": repr(value), "why": why})


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or text not in choices:
            raise PydanticCustomError(
                "value_format", "{shown} is not one of {choices}", {"shown": repr(value), "choices": ", ".join(choices)}
            )
        return text

    return check


def _memlock(value: Any) -> bool | int:
    if isinstance(value, bool) or (isinstance(value, int) and value > 0):
        return value
    raise PydanticCustomError("schema", "expected True, False or a positive number of bytes, got {shown}", {"shown": repr(value)})


def _rolling_batch(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and ROLLING_PERCENT.match(value.strip()):
        return value.strip()
    raise PydanticCustomError(
        "schema", 'expected a number of serving units (1 or more) or a percentage from "1%" to "100%", got {shown}', {"shown": repr(value)}
    )


def _scalar(value: Any) -> str | None:
    """An env value as the string the env file holds; True/False become 1/0, None removes."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise PydanticCustomError("schema", "env values must be strings or numbers, got {kind}", {"kind": type(value).__name__})


def _arg(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool, dict, list)):
        return value
    raise PydanticCustomError("schema", "flag values must be scalars, mappings or lists, got {kind}", {"kind": type(value).__name__})


def _hook(value: Any) -> Any:
    if isinstance(value, str):
        raise PydanticCustomError(
            "schema",
            "say where the command runs: {host} or {control}",
            {"host": f'{{"host": {value!r}}}', "control": f'{{"control": {value!r}}}'},
        )
    return value


Seconds = Annotated[StrictInt, Field(ge=1)]
Duration = Annotated[StrictStr, _form(DURATION, "a Prometheus duration of one unit, such as 5m, 6h or 3d")]
Port = Annotated[StrictInt, Field(ge=1, le=65535)]
Image = Annotated[StrictStr, _form(IMAGE, "an image reference docker accepts (lower-case repository, tag, digest)")]
Model = Annotated[StrictStr, AfterValidator(_model_id)]
HostPath = Annotated[StrictStr, AfterValidator(_host_path)]
UserName = Annotated[StrictStr, _form(USER, "a user name (lower case, at most 32 characters)")]
Nic = Annotated[StrictStr, _form(NIC, "an interface name (at most 15 characters)")]
IbHca = Annotated[StrictStr, _form(IB_HCA, "a list of RDMA devices such as mlx5_0,mlx5_1")]
Registry = Annotated[StrictStr, _form(REGISTRY, "a registry as host[:port] (it names a directory under /etc/docker/certs.d)")]
Mirror = Annotated[StrictStr, _form(MIRROR, "a mirror URL with http:// or https:// (dockerd refuses to start otherwise)")]
Network = Annotated[StrictStr, AfterValidator(_network)]
ClusterName = Annotated[StrictStr, _form(CLUSTER_NAME, "a cluster name (letters, digits, '.', '_' and '-')")]
InstanceName = Annotated[
    StrictStr, _form(INSTANCE_NAME, "an instance name matching [a-z0-9][a-z0-9-]{0,40} (it names the unit vllm-<name>.service)")
]
GpuModel = Annotated[StrictStr, PlainValidator(_one_of(GPU_MODELS))]
GpuRuleId = Annotated[StrictStr, PlainValidator(_one_of(tuple(r.id for r in GPU_RULES)))]
StartsRuleId = Annotated[StrictStr, PlainValidator(_one_of(STARTS_RULES))]
GdrLevel = Annotated[str, PlainValidator(_one_of(GDR_LEVELS))]
Memlock = Annotated[bool | int, PlainValidator(_memlock)]
RollingBatch = Annotated[int | str, PlainValidator(_rolling_batch)]
EnvValue = Annotated[str | None, PlainValidator(_scalar)]
ArgInput = Annotated[Any, PlainValidator(_arg)]
Command = Annotated[StrictStr, Field(min_length=1, pattern=r"\S")]
# docker's --env-file and systemd's EnvironmentFile take one NAME=value per line; the name is a shell identifier.
EnvName = Annotated[
    StrictStr, _form(re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$"), "an env name (letters, digits and _, not starting with a digit)")
]
FlagName = Annotated[StrictStr, _form(re.compile(r"^-{0,2}[A-Za-z0-9][A-Za-z0-9_.-]*$"), "a flag name such as max-num-seqs")]


def _as_written(value: Any) -> Callable[[], Any]:
    """A default kept as group_data writes it (plain data); it is validated with the host's data."""
    return lambda: copy.deepcopy(value)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hook(_Strict):
    """A rolling hook: a shell command on the serving host, on the control machine, or both."""

    host: Command | None = None
    control: Command | None = None


class RayPorts(_Strict):
    """Every port Ray listens on, pinned so that the firewall can close them to non-members."""

    gcs: Port = 6379
    object_manager: Port = 8076
    node_manager: Port = 8077
    client_server: Port = 10001
    min_worker: Port = 10002
    max_worker: Port = 10999
    dashboard_agent_listen: Port = 52365
    dashboard_agent_grpc: Port = 52366
    metrics_export: Port = 52367
    runtime_env_agent: Port = 52368


RAY_PORTS = RayPorts().model_dump()


class CanaryFloors(_Strict):
    """The smallest change of each figure the canary counts, whatever its percentage (vLLM's result field names)."""

    output_throughput: Annotated[float, Field(ge=0)] = 10.0  # tok/s
    median_tpot_ms: Annotated[float, Field(ge=0)] = 0.5
    median_ttft_ms: Annotated[float, Field(ge=0)] = 2.0


CANARY_FLOORS = CanaryFloors().model_dump()


class Instance(_Strict):
    """One entry of ``vllm_instances``; unset keys fall back to the host's variables and the recipe."""

    name: InstanceName
    recipe: StrictStr | None = None
    model: Model | None = None
    gpus: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    port: Port | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    args: dict[FlagName, ArgInput] = Field(default_factory=dict)


HookSetting = Annotated[Hook | None, BeforeValidator(_hook)]

BENCH_DATASETS = ("random", "sharegpt")


def _exporter_field(value: Any) -> str:
    if not isinstance(value, str) or value not in KNOWN_EXPORTER_FIELDS:
        close = difflib.get_close_matches(str(value), KNOWN_EXPORTER_FIELDS, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise PydanticCustomError(
            "value_format", "{shown} is not a field of the device metrics exporter{hint}", {"shown": repr(value), "hint": hint}
        )
    return value


# The exporter's own field names: the GPUMetricField enum of ROCm/device-metrics-exporter
# (pkg/exporter/proto/exporterconfig.proto); the exporter ignores a name it does not know.
KNOWN_EXPORTER_FIELDS = tuple(
    word
    for line in (resources.files("instinct_fleet.model") / "knowledge" / "exporter-fields.txt").read_text().splitlines()
    if not line.startswith("#")
    for word in line.split()
)
ExporterField = Annotated[StrictStr, PlainValidator(_exporter_field)]
# The device-metrics-exporter fields a serving fleet watches (names from its example config.json):
# utilisation, power, temperatures, VRAM and uncorrectable ECC errors.
EXPORTER_FIELDS = (
    "GPU_GFX_ACTIVITY",
    "GPU_UMC_ACTIVITY",
    "GPU_PACKAGE_POWER",
    "GPU_JUNCTION_TEMPERATURE",
    "GPU_HBM_TEMPERATURE",
    "GPU_USED_VRAM",
    "GPU_TOTAL_VRAM",
    "GPU_ECC_UNCORRECT_TOTAL",
    # What the GPU health alerts read (instinct_fleet/commands/monitoring.py ALERTS).
    "GPU_MEMORY_TEMPERATURE",
    "PCIE_SPEED",
    "PCIE_MAX_SPEED",
    "PCIE_RECOVERY_COUNT",
)


def duration_seconds(text: str) -> float:
    """Seconds of a :data:`Duration` (validated: one number, one unit)."""
    unit = text.lstrip("0123456789")
    return int(text[: len(text) - len(unit)]) * DURATION_SECONDS[unit]


class BurnAlert(_Strict):
    """One multiwindow burn-rate alert of an SLO (the Google SRE workbook's): it fires while the error budget burns
    ``burn`` times faster than the objective allows over both the ``long`` window and the ``short`` one (which ends it
    soon after the burn stops)."""

    severity: Literal["page", "ticket"]
    burn: Annotated[StrictInt | StrictFloat, Field(gt=0)]
    long: Duration
    short: Duration


class BenchProfile(_Strict):
    """One ``instinct-fleet bench`` profile: the ``vllm bench serve`` dataset shape and load."""

    dataset: Annotated[StrictStr, PlainValidator(_one_of(BENCH_DATASETS))] = "random"
    dataset_path: HostPath | None = None
    input_len: Annotated[StrictInt, Field(ge=1)] = 1024
    output_len: Annotated[StrictInt, Field(ge=1)] = 1024
    num_prompts: Annotated[StrictInt, Field(ge=1)] = 100
    concurrency: list[Annotated[StrictInt, Field(ge=1)]] = Field(default_factory=lambda: [8], min_length=1)
    request_rate: Annotated[float, Field(gt=0)] | None = None
    ignore_eos: StrictBool = True

    @model_validator(mode="after")
    def _fields_vllm_reads_together(self) -> BenchProfile:
        """vLLM's benchmark (vllm/benchmarks/datasets.py) reads the lengths only for ``random`` (``--random-input-len``,
        ``--random-output-len``) and the file only for ``sharegpt`` (``--dataset-path``, whose prompts and lengths it
        samples): a field the dataset does not read would be a setting that silently does nothing."""
        given = self.model_fields_set
        if self.dataset == "sharegpt" and self.dataset_path is None:
            raise PydanticCustomError("bench_profile", "dataset 'sharegpt' needs dataset_path: vLLM samples its prompts from that file", {})
        if self.dataset == "random" and self.dataset_path is not None:
            raise PydanticCustomError("bench_profile", "dataset 'random' makes its own prompts: vLLM does not read dataset_path", {})
        unread = sorted(given & {"input_len", "output_len"}) if self.dataset == "sharegpt" else []
        if unread:
            raise PydanticCustomError(
                "bench_profile",
                "{fields}: vLLM's sharegpt dataset takes prompt and output lengths from the file",
                {"fields": ", ".join(unread)},
            )
        return self


class GpuExpected(_Strict):
    """The pinned values of `gpu_health_expected`; None: the fleet's majority."""

    firmware: Annotated[StrictStr, Field(min_length=1)] | None = None
    driver: Annotated[StrictStr, Field(min_length=1)] | None = None
    xgmi_rate: Annotated[StrictStr, Field(min_length=1)] | None = None
    compute_partition: Annotated[StrictStr, Field(min_length=1)] | None = None
    memory_partition: Annotated[StrictStr, Field(min_length=1)] | None = None


class FleetVars(_Strict):
    """Every instinct-fleet variable of one host, after host data over group_data over all."""

    vllm_recipe: StrictStr | None = Field(
        default="gpt-oss-120b",
        description="Built-in recipe each instance starts from (`instinct-fleet recipes` lists them); `None` starts from nothing but `vllm_model`, `vllm_env` and `vllm_args`.",
    )
    vllm_image: Image = Field(
        default=IMAGE_DEFAULT,
        description="vLLM ROCm container image, pinned by tag or digest; `latest` and untagged names are refused. Unset, it follows `vllm_version` (`vllm/vllm-openai-rocm:v<vllm_version>`).",
    )
    vllm_version: StrictStr = Field(
        default=DEFAULT_VLLM_VERSION,
        description="vLLM version inside `vllm_image`; selects the table of env vars and flags that validation checks against. Unset, the image's tag decides it (`rocm/vllm:rocm7.0.0_vllm_0.11.1_20251103` is 0.11.1); set, it must agree with the tag.",
    )
    vllm_version_unvalidated: StrictBool = Field(
        default=False,
        description="Deploy a `vllm_version` that has no table (`instinct-fleet vllm-facts` makes one): its flags and env vars go unchecked, and `plan` warns instead of refusing.",
    )
    vllm_model: Model | None = Field(
        default=None,
        description="Model to serve; `None` keeps the recipe's model.",
    )
    vllm_env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        description="Env vars layered over the recipe's for every instance on the host; a value of `None` removes a recipe variable.",
    )
    vllm_args: dict[FlagName, ArgInput] = Field(
        default_factory=dict,
        description='`vllm serve` flags layered over the recipe\'s (`{"max-num-seqs": 256}`); `True` is a bare flag, `False` the `--no-` form, `None` removes.',
    )
    vllm_instances: list[Instance] = Field(
        default_factory=_as_written([{"name": "main"}]),
        description="Instances per host: `name`, and optionally `recipe`, `model`, `gpus` (list of GPU indices), `port`, `env`, `args`. GPUs and ports default to consecutive blocks.",
    )
    vllm_nodes: Annotated[StrictInt, Field(ge=1)] = Field(
        default=1,
        description="Nodes one instance spans (2 or more for a Ray cluster); TP x PP x DP must equal nodes x GPUs per node.",
    )
    gpu_count: Annotated[StrictInt, Field(ge=1, le=MAX_GPUS)] = Field(
        default=8,
        description="GPUs each host must have (logical GPUs after partitioning); preflight compares it with amd-smi.",
    )
    gpu_model: GpuModel = Field(
        default="MI300X",
        description="GPU model the host must have: MI300X, MI325X, MI350X or MI355X.",
    )
    gpu_health: StrictBool = Field(
        default=True,
        description="Judge every GPU on the preflight fact's amd-smi evidence (ECC, bad pages, PCIe link, XGMI links, firmware, driver, partitions) by the `gpu-*` rules, and quarantine the instances of a GPU in error: drained out of the router, stopped, held out until the evidence clears (docs/gpu-health.md).",
    )
    gpu_health_pcie_width: Annotated[StrictInt, Field(ge=1, le=32)] = Field(
        default=16,
        description="PCIe link width each GPU must train at (`gpu-pcie-width`; node-scraper's default, x16).",
    )
    gpu_health_pcie_speed: Annotated[StrictInt | StrictFloat, Field(gt=0, le=128)] = Field(
        default=32,
        description="PCIe link speed in GT/s each GPU must train at (`gpu-pcie-speed`; node-scraper's default, 32: Gen5).",
    )
    gpu_health_recovery_error: Annotated[StrictInt, Field(ge=0)] = Field(
        default=3,
        description="L0-to-recovery transitions of a GPU's PCIe link above which it is in error (`gpu-pcie-recovery`; node-scraper's default).",
    )
    gpu_health_recovery_warning: Annotated[StrictInt, Field(ge=0)] = Field(
        default=1,
        description="L0-to-recovery transitions above which a warning is given (`gpu-pcie-recovery-warning`); at most `gpu_health_recovery_error`.",
    )
    gpu_health_bad_page_warning: Annotated[StrictInt | StrictFloat, Field(gt=0, lt=1)] = Field(
        default=0.9,
        description="Fraction of `ras.bad_page_threshold` of retired and pending pages that gives a warning (`gpu-bad-pages-near`; the amdgpu driver warns at 90%).",
    )
    gpu_health_expected: GpuExpected = Field(
        default_factory=_as_written(GpuExpected().model_dump()),
        description='What every GPU must run (`gpu-fleet-drift`): `{"firmware": "00159017", "driver": "6.16.13", "xgmi_rate": "32 Gb/s", "compute_partition": "SPX", "memory_partition": "NPS1"}`; a key left out is compared with the majority of the hosts read in the run.',
    )
    gpu_alert_junction_celsius: Annotated[StrictInt, Field(ge=1, le=150)] = Field(
        default=100,
        description="Junction temperature (°C) above which the `GpuJunctionTemperatureHigh` alert fires after 5 minutes (`instinct-fleet targets --alerts`); our default, not AMD's limit: set your platform's.",
    )
    gpu_alert_memory_celsius: Annotated[StrictInt, Field(ge=1, le=150)] = Field(
        default=90,
        description="Memory (HBM) temperature (°C) above which the `GpuMemoryTemperatureHigh` alert fires after 5 minutes; our default, not AMD's limit: set your platform's.",
    )
    slo_ttft_seconds: Annotated[StrictInt | StrictFloat, Field(gt=0)] = Field(
        default=2.5,
        description="Time to first token the SLO holds each model's requests to, in seconds; it must be a bucket bound of `vllm:time_to_first_token_seconds` in the pinned vLLM (or of its `--custom-histogram-buckets`), since Prometheus counts requests only at a bound (`slo-ttft-bucket`).",
    )
    slo_ttft_objective: Annotated[StrictFloat, Field(gt=0, lt=1)] = Field(
        default=0.99,
        description="Fraction of each model's requests whose first token comes within `slo_ttft_seconds` (the TTFT SLO; 1 minus it is the error budget the burn-rate alerts spend).",
    )
    slo_success_objective: Annotated[StrictFloat, Field(gt=0, lt=1)] = Field(
        default=0.999,
        description='Fraction of each model\'s finished requests that do not end in error (`vllm:request_success` with `finished_reason="error"`, which vLLM has from 0.22.0; on an older pin the success alerts are said, not written).',
    )
    slo_burn_alerts: list[BurnAlert] = Field(
        default_factory=_as_written(
            [
                {"severity": "page", "burn": 14.4, "long": "1h", "short": "5m"},
                {"severity": "page", "burn": 6, "long": "6h", "short": "30m"},
                {"severity": "ticket", "burn": 1, "long": "3d", "short": "2h"},
            ]
        ),
        description="The multiwindow burn-rate alerts of each SLO (`instinct-fleet targets --alerts`): each fires while the error budget burns `burn` times too fast over both `long` and `short`; every window must fit in `prometheus_retention` and `short` must be below `long` (`slo-window`).",
    )
    prometheus_retention: Duration = Field(
        default="15d",
        description="How long your Prometheus keeps samples (its `--storage.tsdb.retention.time`, 15d by default): a burn-rate window longer than it never fills.",
    )
    alert_down_for: Duration = Field(
        default="2m",
        description="How long an instance's `/metrics` target must be down before `VllmInstanceDown` pages (its Prometheus `for`): a restart of the roll or the watch takes less.",
    )
    alert_webhook_url: Annotated[StrictStr, _form(WEBHOOK, "an http:// or https:// URL")] | None = Field(
        default=None,
        description="Where Alertmanager delivers the fleet's alerts (a webhook receiver; `instinct-fleet targets --alertmanager` writes its config). `None`: no Alertmanager config.",
    )
    gpu_health_readmit_max: Annotated[StrictInt, Field(ge=1)] = Field(
        default=3,
        description="Automatic re-admissions of a host's quarantined instances within `gpu_health_readmit_window`; once the evidence clears after that, they stay out until `instinct-fleet admit` (`quarantine-held`; the AMD GPU Operator's bound).",
    )
    gpu_health_readmit_window: Seconds = Field(
        default=900,
        description="Seconds over which `gpu_health_readmit_max` is counted (15 minutes, as the AMD GPU Operator counts its remediations).",
    )
    validation_levels: dict[StartsRuleId, Literal["error", "warning"]] = Field(
        default_factory=dict,
        description='Another severity for a rule about what vLLM starts with, though not as you meant (it warns and ignores a variable, or emulates a format), as `{"env-unknown": "error"}`: an error stops the run before any connection. Only those rules: what vLLM refuses to start with is always an error.',
    )
    gpu_health_levels: dict[GpuRuleId, Literal["error", "warning", "off"]] = Field(
        default_factory=dict,
        description='Another severity for a `gpu-*` rule on these hosts, as `{"gpu-pcie-speed": "warning"}`: an error quarantines, a warning is shown, `off` is not judged.',
    )
    hf_token_path: HostPath = Field(
        default="/etc/instinct-fleet/hf-token",
        description="File on the host holding the Hugging Face token; it is mounted read-only and never put in a unit, env file or argv.",
    )
    hf_token_source: Annotated[StrictStr, Field(min_length=1)] | None = Field(
        default=None,
        description="Where the control machine reads the Hugging Face token: `env:NAME` (an environment variable of the deploy) or a file path (relative: to the project). The deploy then writes it to `hf_token_path` on every host, root's alone (0600), never through argv, a unit or a diff. `None`: the token file on each host is yours to place.",
    )
    vllm_api_key_path: HostPath | None = Field(
        default=None,
        description="Root-only file on each host holding the API key vLLM then requires on its /v1 routes; mounted read-only and exported as VLLM_API_KEY inside the container just before `vllm serve`, so it never reaches a unit, argv, an env file or `docker inspect`. `None`: no key.",
    )
    hf_cache_dir: HostPath = Field(
        default="/var/lib/instinct-fleet/huggingface",
        description="Host directory mounted as the Hugging Face cache.",
    )
    compile_cache_dir: HostPath = Field(
        default="/var/cache/instinct-fleet/compile",
        description="Root of the compile and JIT caches kept on each host, one directory per image (VLLM_CACHE_ROOT for torch.compile and Triton, AITER_JIT_DIR, the TunableOp results), mounted at the same path inside the container: a cache copied between hosts stays valid only at the path it was built at.",
    )
    compile_cache_keep: Annotated[StrictInt, Field(ge=1)] = Field(
        default=2,
        description="How many images' compile caches each host keeps: a unit's start removes the least recently used beyond this, never one a running container uses.",
    )
    compile_cache_spread: StrictBool = Field(
        default=True,
        description="In a roll, the first host that restarts a compile configuration sends its compile cache (checked, through the control machine) to the hosts that restart the same configuration, on the same image and GPU architecture, in later batches, so they start warm; the first Ray cluster's head sends to the later heads, its worker to their workers. `False`: every host compiles its own. One value for the whole fleet.",
    )
    health_timeout: Seconds = Field(
        default=1800,
        description="Seconds to wait for each instance's /health and /v1/models after a (re)start.",
    )
    command_timeout: Seconds = Field(
        default=600,
        description="Seconds any one command may take on a host before that host fails as hung (image pulls and health waits have their own limits).",
    )
    image_pull_timeout: Seconds = Field(
        default=3600,
        description="Seconds the pull of the vLLM image (20+ GB) may take on a host.",
    )
    tune_numa_balancing: StrictBool = Field(
        default=True,
        description="Set kernel.numa_balancing=0 now and in /etc/sysctl.d (004:171, after AMD MAD).",
    )
    tune_kernel_cmdline: StrictBool = Field(
        default=True,
        description="Add iommu=pt and pci=realloc=off to the kernel command line through a GRUB drop-in. No seed has this step: it comes from AMD's MI300X system optimization guide (ROCm documentation, GRUB settings), which the project follows.",
    )
    tune_reboot: StrictBool = Field(
        default=False,
        description="Reboot when the kernel command line changed; when False the deploy reports that a reboot is required.",
    )
    tune_cpu_idle: StrictBool = Field(
        default=True,
        description="Disable deep CPU C-states (cpupower idle-set -d 2) from a oneshot unit. Not in the seeds: AMD's MI300X system optimization guide (ROCm documentation), which the project follows.",
    )
    tune_memlock: Memlock = Field(
        default=True,
        description="Locked-memory limit for dockerd and the vLLM containers: `True` is unlimited (RCCL pins buffers), a number is bytes, `False` leaves it alone.",
    )
    service_user: UserName = Field(
        default="vllm",
        description="System user that owns the service files; added to the render and video groups.",
    )
    docker_registry_mirrors: list[Mirror] = Field(
        default_factory=list,
        description="Registry mirrors written to /etc/docker/daemon.json.",
    )
    docker_insecure_registries: list[Registry] = Field(
        default_factory=list,
        description="Registries dockerd may reach over plain HTTP (daemon.json).",
    )
    docker_registry_ca_certs: dict[Registry, StrictStr] = Field(
        default_factory=dict,
        description='CA certificates of private registries: `{"registry.example:5000": "certs/ca.crt"}`, copied from the control machine to /etc/docker/certs.d/<registry>/ca.crt.',
    )
    docker_credentials_file: StrictStr | None = Field(
        default=None,
        description="Path on the control machine (relative: to the project) to a docker config.json with registry credentials; copied to root's ~/.docker with mode 0600.",
    )
    ray_cluster: ClusterName | None = Field(
        default=None,
        description="Name of the Ray cluster the host belongs to; the hosts that share it serve one multi-node vLLM instance (`vllm_nodes` of them).",
    )
    ray_role: Literal["head", "worker"] | None = Field(
        default=None,
        description="`head` or `worker` within `ray_cluster`; exactly one head, which also runs the vLLM unit.",
    )
    ray_ports: RayPorts = Field(
        default_factory=_as_written(RAY_PORTS),
        description="Every port Ray listens on, pinned so that the firewall can close them to non-members (`client_server` is Ray's fixed default); override single keys.",
    )
    ray_ready_timeout: Seconds = Field(
        default=600,
        description="Seconds the vLLM unit on the head waits for every node and GPU of the cluster to join Ray.",
    )
    cluster_nic: Nic | None = Field(
        default=None,
        description="Interface RCCL and Gloo use between nodes (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME); its address becomes VLLM_HOST_IP and the Ray node IP. Required in a cluster.",
    )
    nccl_ib_hca: IbHca | None = Field(
        default=None,
        description='RDMA NICs for RCCL, e.g. `"mlx5_0,mlx5_1"` (NCCL_IB_HCA); unset, RCCL falls back to TCP sockets.',
    )
    nccl_ib_gid_index: Annotated[StrictInt, Field(ge=0, le=255)] | None = Field(
        default=None,
        description="RoCE GID index (NCCL_IB_GID_INDEX), usually 3 for RoCE v2.",
    )
    nccl_net_gdr_level: GdrLevel | None = Field(
        default=None,
        description="GPUDirect RDMA level (NCCL_NET_GDR_LEVEL), e.g. 3 or `PHB`. 002:584 writes `RCCL_NET_GDR_LEVEL=2`; RCCL keeps NCCL's variable names and documents this one as NCCL_NET_GDR_LEVEL, so set 2 here to follow 002.",
    )
    nccl_min_nchannels: Annotated[StrictInt, Field(ge=1, le=256)] | None = Field(
        default=112,
        description="NCCL_MIN_NCHANNELS in a cluster: more channels for MI300X collectives (002:17).",
    )
    infiniband: StrictBool = Field(
        default=False,
        description="Pass /dev/infiniband into the Ray and vLLM containers with the IPC_LOCK capability (RDMA).",
    )
    firewall: StrictBool = Field(
        default=True,
        description="Manage the nftables table `inet instinct_fleet`, which denies by default: only the ports the host serves are open, each to who needs it (SSH to `ssh_allow_from`, Ray and the collectives to cluster members, vLLM to `vllm_allow_from`, the router's clients to `router_allow_from`, its worker API to its pools' serving hosts and `router_admin_from`), and every other port, one opened at run time included, is closed.",
    )
    ssh_allow_from: list[Network] | None = Field(
        default=None,
        description="Addresses or networks allowed to reach SSH (the port sshd answers the deploy on) when the firewall is on; `None`: anyone, so that no firewall change can lock a team out. Set it to your control machines and bastions.",
    )
    vllm_allow_from: list[Network] | None = Field(
        default=None,
        description='Addresses or networks allowed to reach the vLLM ports (`["10.0.0.0/8"]`), besides loopback and cluster members; `None` leaves them open.',
    )
    scrape_address: Annotated[StrictStr, AfterValidator(_address)] | None = Field(
        default=None,
        description="Address other machines reach this host at: Prometheus scrapes its vLLM `/metrics` and exporter there (`instinct-fleet targets`), and `instinct-fleet bench --client` sends load there; `None` uses `ssh_hostname`, else the inventory name.",
    )
    prometheus_allow_from: list[Network] | None = Field(
        default=None,
        description="Addresses or networks of the Prometheus servers allowed to scrape the vLLM `/metrics` ports and the device metrics exporter, when the firewall is on; `None` adds no rule.",
    )
    metrics_exporter: StrictBool = Field(
        default=False,
        description="Run AMD's device-metrics-exporter as the systemd unit `amd-metrics-exporter.service` (GPU utilisation, power, temperatures, VRAM, ECC).",
    )
    metrics_exporter_image: Image = Field(
        default="rocm/device-metrics-exporter:v1.2.0",
        description="The device-metrics-exporter image, pinned like the vLLM image.",
    )
    metrics_exporter_port: Port = Field(
        default=5000,
        description="Port the exporter serves `/metrics` on (its config file's `ServerPort`).",
    )
    metrics_exporter_fields: list[ExporterField] = Field(
        default_factory=_as_written(list(EXPORTER_FIELDS)),
        description="The exporter's `GPUConfig.Fields`: which GPU metrics it exports (names as in its documentation, for example `GPU_GFX_ACTIVITY` becomes `gpu_gfx_activity`).",
    )
    watch: StrictBool = Field(
        default=True,
        description="Run the watch on every serving host (`instinct-fleet-watch.service`): it reads each instance's `/metrics` every `watch_interval` seconds, and an instance with requests running or waiting whose engine steps stop for `watch_stall_seconds` is taken out of its router pools, restarted and put back once its gate passes (docs/rolling.md, Live engines).",
    )
    watch_port: Port = Field(
        default=9401,
        description="Port of the watch's read-only state (`/state`, JSON) and Prometheus `/metrics`; the firewall lets in exactly who may reach the vLLM ports.",
    )
    watch_interval: Seconds = Field(
        default=5,
        description="Seconds between two readings of an instance's step counters; must be below `watch_stall_seconds`.",
    )
    watch_stall_seconds: Seconds = Field(
        default=60,
        description="Seconds an instance with requests running or waiting may go without one engine step before the watch restarts it; must exceed the instance's longest step (a whole `--max-num-batched-tokens` prefill, or `--max-model-len` with chunked prefill off, at `watch_prefill_tokens_per_second`).",
    )
    watch_prefill_tokens_per_second: Annotated[StrictInt, Field(ge=1)] | None = Field(
        default=None,
        description="Prompt tokens per second one instance prefills at the least, for the check of `watch_stall_seconds` against its longest engine step; `None`: estimated from the model's size in its name (`...-70B-...`) as the instance's GPUs x 250 TFLOP/s (a fifth of an MI300X's dense FP16 peak) over 2 FLOPs per parameter and token, and not checked for a name without a size.",
    )
    watch_max_restarts: Annotated[StrictInt, Field(ge=1)] = Field(
        default=3,
        description="Restarts of one instance the watch makes within `watch_restart_window`; a stall after that leaves the instance out of its pools, running, until an operator re-admits it (docs/rolling.md, Live engines).",
    )
    watch_restart_window: Seconds = Field(
        default=900,
        description="Seconds over which `watch_max_restarts` is counted (the AMD GPU Operator's bound: 3 remediations per 15 minutes).",
    )
    watch_gpu_interval: Seconds = Field(
        default=30,
        description="Seconds between two readings of the GPUs' amd-smi evidence by the watch (with `gpu_health`): an error on a GPU quarantines its instances at once, between deploys (AMD's device metrics exporter checks every 30 s; docs/gpu-health.md).",
    )
    weights_source: HostPath | None = Field(
        default=None,
        description="A directory on every host holding a Hugging Face cache (`hub/models--org--name`), typically a shared mount: each model is copied from it into `hf_cache_dir` before its first start. `None`: vLLM downloads on first start.",
    )
    weights_download: StrictBool = Field(
        default=True,
        description="With `weights_source`: a model missing there is downloaded into it once, by one host, from the instance's image; `False` fails such hosts instead (a fleet without internet access).",
    )
    bench_profiles: dict[
        Annotated[StrictStr, _form(re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$"), "a profile name (a-z, 0-9, '.', '-')")], BenchProfile
    ] = Field(
        default_factory=dict,
        description='Your own `instinct-fleet bench` profiles beside the built-in ones, e.g. `{"long-ctx": {"input_len": 32768, "output_len": 512, "num_prompts": 40, "concurrency": [4]}}`.',
    )
    rolling_batch: RollingBatch = Field(
        default=1,
        description='Serving units (a single-node host, or a whole Ray cluster) that may restart at once during a re-tune: a number, or a percentage of the fleet\'s serving units such as `"25%"`. One value for the whole fleet.',
    )
    rolling_max_failures: Annotated[StrictInt, Field(ge=0)] = Field(
        default=0,
        description="Batches that may fail their health gate before the roll stops; the units not yet rolled keep their old configuration. One value for the whole fleet.",
    )
    rolling_on_failure: Literal["rollback", "stop"] = Field(
        default="rollback",
        description='What a batch that fails does: `"rollback"` puts its units back to their last healthy generation (unit and env files, byte for byte), gates them again, then stops the roll; `"stop"` leaves them as they failed. Either way the run exits non-zero.',
    )
    rolling_keep_generations: Annotated[StrictInt, Field(ge=1, le=100)] = Field(
        default=3,
        description="Generations (the serving unit and env files a host ran) each host keeps under /var/lib/instinct-fleet/generations, besides the last healthy one; `instinct-fleet rollback` and `rolling_on_failure` go back to them.",
    )
    canary_profile: StrictStr | None = Field(
        default="canary",
        description="A bench profile (built-in or from `bench_profiles`) that makes a re-tune's first restart batch one canary serving unit (the smallest, first by name), benchmarked before it stops and after its gate, and asked the accuracy probe (`canary_accuracy`). The built-in `canary` (16 prompts of 512 tokens, 64 out, 4 at a time) is sized down to an instance's `--max-model-len`. `None`: no canary, a warning in `plan`. One value for the whole fleet.",
    )
    canary_max_regression: Annotated[float, Field(ge=0)] = Field(
        default=10,
        description="Percent by which the canary's output throughput may fall, or its median TPOT or median TTFT rise, before it can count as a regression; it counts only when the change is also beyond `canary_floors` and beyond the noise of the repeated runs (`canary_alpha`). A regression is a failed batch (rolled back with `rolling_on_failure`, and the roll stops).",
    )
    canary_floors: CanaryFloors = Field(
        default_factory=_as_written(CANARY_FLOORS),
        description="The smallest change of each canary figure that counts, whatever its percentage: `output_throughput` (tok/s), `median_tpot_ms`, `median_ttft_ms`; override single keys.",
    )
    canary_runs: Annotated[StrictInt, Field(ge=1, le=10)] = Field(
        default=3,
        description="Runs of the canary profile before and after the change. Every run is kept; the figures compared are the medians over the runs, and the run is the unit of the noise test (`canary_alpha`), so one run a side gives no verdict beyond inconclusive. Three tell a 1.5x slowdown up to 5% run-to-run variation and a 4x one up to 15%; more tell smaller changes on noisier hosts.",
    )
    canary_warmup: Annotated[StrictInt, Field(ge=0)] = Field(
        default=8,
        description="Requests sent to each canary instance before its measured runs, before and after the change, whose results are discarded: the first requests after a restart are slow for reasons the change does not cause. 0: none.",
    )
    canary_alpha: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.01,
        description="The most often a harmless change may be judged a regression by the noise test: split evenly over the three figures judged (Bonferroni), each a one-sided Student's t-test on the logarithms of the runs' figures, with a Mann-Whitney U test over the requests as a second condition where vLLM recorded them. `tune` splits it over the points it picks the best of.",
    )
    canary_inconclusive: Literal["proceed", "rollback"] = Field(
        default="proceed",
        description='What a canary does whose figures moved beyond `canary_max_regression` and `canary_floors` but not beyond the noise: `"proceed"` rolls on and says so in the summary; `"rollback"` treats it as a regression.',
    )
    canary_accuracy: StrictBool = Field(
        default=True,
        description="Every canary also asks the accuracy probe of each canary instance, before the change and after its gate: greedy answers (temperature 0, seed 0) through the OpenAI API, checked item by item; a paired loss beyond `canary_probe_floor` and `canary_probe_alpha` is a failed batch, as a speed regression is. `False`: speed only.",
    )
    canary_probe: StrictStr | None = Field(
        default=None,
        description='Your own golden prompts: a JSONL file on the control machine (relative to the project), one `{"prompt": ..., "answer": "42"}` (the last number of the reply must equal it) or `{"prompt": ..., "pattern": "regex"}` per line; `None`: the built-in set of 250 arithmetic items (instinct_fleet/model/probe.py).',
    )
    canary_probe_size: Annotated[StrictInt, Field(ge=1)] = Field(
        default=200,
        description="Items of the probe asked on each side of the change (the first of the set; all of them when the set is smaller).",
    )
    canary_probe_floor: Annotated[float, Field(ge=0)] = Field(
        default=2.0,
        description="Points of accuracy (percent of the items) the probe may lose before the loss can count, whatever its significance.",
    )
    canary_probe_alpha: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.001,
        description="Significance level of the probe's paired test for the whole canary, split evenly over its instances (Bonferroni: each of two instances is judged at half of it): an exact one-sided McNemar test on the items right before and wrong after against the reverse. A loss beyond the floor but not significant is inconclusive (`canary_inconclusive`).",
    )
    canary_probe_max_tokens: Annotated[StrictInt, Field(ge=1)] = Field(
        default=512,
        description="`max_tokens` of each probe request: enough for the model to reach its final number (a reasoning model thinks first); a reply cut short is simply wrong on both sides.",
    )
    rolling_drain_timeout: Annotated[StrictInt, Field(ge=0)] = Field(
        default=60,
        description="Seconds a stopping instance gets to finish in-flight requests: vLLM's `--shutdown-timeout` where the pinned version has it, and the `docker stop` grace (plus 30 s) in any case.",
    )
    rolling_pre_stop: HookSetting = Field(
        default=None,
        description='Hook before a serving unit\'s instances stop, to take them out of a load balancer: `{"host": "cmd"}` runs on the serving host, `{"control": "cmd"}` on the machine running the deploy. The command sees INSTINCT_FLEET_HOST, INSTINCT_FLEET_UNITS and INSTINCT_FLEET_PORTS; a failure stops that unit\'s roll.',
    )
    router: StrictBool = Field(
        default=False,
        description="Run vLLM's router (`vllm-router`) on this host, one systemd unit per pool: every serving instance of the pool's model in the inventory (single-node, or a cluster's head) behind one address. Put it in `group_data/routers.py` for a router group. The roll takes a unit out of every pool before it stops and puts it back after its health gate.",
    )
    router_version: StrictStr = Field(
        default="0.1.17",
        description="The pinned `vllm-router` release: the controller downloads its wheel once (or reads `router_wheel`), checks its sha256 against the shipped table, and copies the router's files to router hosts, which need Python 3 but no package index.",
    )
    router_wheel: StrictStr | None = Field(
        default=None,
        description="Path on the controller to the `vllm-router` wheel of `router_version` (a controller without index access); `None`: pip downloads it into `~/.cache/instinct-fleet/wheels`.",
    )
    router_models: list[StrictStr] | None = Field(
        default=None,
        description="Served model names this router has a pool for, one unit each, the first on `router_port` and `router_metrics_port`, the next on each plus one, and so on; `None`: every model the inventory serves, in name order.",
    )
    router_port: Port = Field(
        default=30000,
        description="Port of the first pool's router for its clients (the router's own default): a front that passes on the OpenAI routes (`/v1/completions`, `/v1/chat/completions`, `/v1/embeddings`, `/v1/responses`, `/v1/rerank`, `/v1/models`) and `/health`, and answers 404 to any other, the router's worker API above all (`router_admin_port`).",
    )
    router_admin_port: Port = Field(
        default=31000,
        description="Port of the first pool's router itself, the next pool's on this plus one, and so on: its worker API (`/add_worker`, `/remove_worker`, `/list_workers`, ...) and every other route. vllm-router checks no key there, so clients never reach it: `router_port` is a front that passes on the OpenAI routes alone, and the firewall keeps this port to loopback, the serving hosts of its pool (their roll and watch take an instance out and put it back) and `router_admin_from`.",
    )
    router_admin_from: list[Network] = Field(
        default_factory=list,
        description="Addresses or networks, besides loopback and the serving hosts of the pools, allowed to reach `router_admin_port` (an operator's machine that calls the worker API); empty: nobody else.",
    )
    router_metrics_port: Port = Field(
        default=29000,
        description="Port of the first pool's router Prometheus `/metrics` (`--prometheus-port`); the router's own default.",
    )
    router_policy: StrictStr = Field(
        default="cache_aware",
        description="`--policy`: how the router picks an instance (checked against the pinned router's choices: `round_robin`, `power_of_two`, `cache_aware`, `consistent_hash`, ...).",
    )
    router_health_check_interval: Seconds = Field(
        default=5,
        description="`--health-check-interval-secs`: seconds between the router's health checks of each instance; with `router_health_failure_threshold` it bounds how long a dead instance still gets requests.",
    )
    router_health_failure_threshold: Annotated[StrictInt, Field(ge=1)] = Field(
        default=2,
        description="`--health-failure-threshold`: failed checks in a row before the router stops sending to an instance.",
    )
    router_health_success_threshold: Annotated[StrictInt, Field(ge=1)] = Field(
        default=2,
        description="`--health-success-threshold`: passed checks in a row before an instance gets requests again.",
    )
    router_retries: Annotated[StrictInt, Field(ge=0)] = Field(
        default=5,
        description="`--retry-max-retries`: attempts the router makes on other instances when one fails a request before it answers.",
    )
    router_request_timeout: Seconds = Field(
        default=1800,
        description="`--request-timeout-secs`: the longest a request may take through the router.",
    )
    router_allow_from: list[Network] | None = Field(
        default=None,
        description="Addresses or networks of the router's clients: they alone reach `router_port` (the OpenAI routes) and `router_metrics_port` (also open to `prometheus_allow_from`); `None`: clients from anywhere. Never the worker API, which is on `router_admin_port`. The router checks no key: the instances behind it do.",
    )
    router_flags: dict[StrictStr, Any] = Field(
        default_factory=dict,
        description="Any other `vllm-router` option, as `{\"--cache-threshold\": 0.5}` (a switch as `True`), checked against the pinned router's own CLI. `--api-key` is refused: the router passes a client's `Authorization` header on to the instances, so clients of instances with `vllm_api_key_path` send that key to the router.",
    )
    rolling_post_start: HookSetting = Field(
        default=None,
        description="Hook after a serving unit's instances passed health, to put them back in a load balancer; same form and variables as `rolling_pre_stop`.",
    )


# Variables that are gone, and why: an inventory that still sets one is told, not just "unknown".
REMOVED: dict[str, str] = {
    "vllm_shm_size": (
        "removed: the containers run with --ipc host and share the host's /dev/shm, so docker ignores --shm-size "
        "(measured on the test fleet: --ipc host --shm-size 1g shows the host's 24G tmpfs). Size /dev/shm on the host"
    ),
}


@dataclass(frozen=True)
class Variable:
    """One documented variable: its name, default (plain data, as group_data writes it) and meaning."""

    name: str
    default: Any
    doc: str


VARIABLES: tuple[Variable, ...] = tuple(
    Variable(name, field.get_default(call_default_factory=True), field.description or "") for name, field in FleetVars.model_fields.items()
)
DEFAULTS: dict[str, Any] = {v.name: v.default for v in VARIABLES}
