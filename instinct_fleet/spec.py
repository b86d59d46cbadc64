"""The typed serving spec: what one host runs, resolved from its data and a recipe.

``resolve_host`` is the single step from pyinfra's host data (host data over
group_data over all) to typed :class:`ServiceSpec` objects. Type problems become
``schema`` findings here; everything about meaning is checked in
:mod:`instinct_fleet.validate`.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from instinct_fleet import knowledge
from instinct_fleet.defaults import DEFAULTS
from instinct_fleet.recipes import ArgValue, Recipe, all_recipes
from instinct_fleet.rules import Finding, finding

INSTANCE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
DEFAULT_PORT = 8000  # vLLM's own default for --port
MAX_GPUS = 64  # logical GPUs one host can show: 8 MI300X in CPX mode
INSTANCE_KEYS = {"name", "recipe", "model", "gpus", "port", "env", "args"}


def parallel_size(args: Mapping[str, ArgValue], flag: str) -> int:
    """A parallel size flag as an int (1 when unset or not an integer: validation reports it)."""
    value = args.get(flag, 1)
    try:
        return int(value) if not isinstance(value, bool) else 1
    except (TypeError, ValueError):
        return 1


def world_size(args: Mapping[str, ArgValue]) -> int:
    """GPUs one instance needs in all: TP x PP x DP."""
    return (
        parallel_size(args, "tensor-parallel-size")
        * parallel_size(args, "pipeline-parallel-size")
        * parallel_size(args, "data-parallel-size")
    )


@dataclass(frozen=True)
class ServiceSpec:
    """One vLLM instance, fully resolved: what the unit, the checks and the CLI read."""

    name: str
    host: str | None
    recipe: str
    image: str
    version: str
    model: str
    env: dict[str, str]
    args: dict[str, ArgValue]
    gpus: tuple[int, ...]
    port: int
    nodes: int
    reasons: dict[str, str] = field(default_factory=dict)

    def size(self, flag: str) -> int:
        return parallel_size(self.args, flag)

    @property
    def world_size(self) -> int:
        return world_size(self.args)


@dataclass(frozen=True)
class ClusterSpec:
    """This host's place in a multi-node Ray cluster, and the RCCL settings of the cluster."""

    name: str
    role: str
    ports: dict[str, int]
    ready_timeout: int
    nic: str | None
    ib_hca: str | None
    ib_gid_index: int | None
    gdr_level: str | None
    min_nchannels: int | None
    infiniband: bool

    def rccl_env(self) -> dict[str, str]:
        """The RCCL/Gloo variables every node's containers get at creation (VLLM_HOST_IP is per node)."""
        env = {}
        if self.nic:
            env["NCCL_SOCKET_IFNAME"] = self.nic
            env["GLOO_SOCKET_IFNAME"] = self.nic
        for name, value in (
            ("NCCL_IB_HCA", self.ib_hca),
            ("NCCL_IB_GID_INDEX", self.ib_gid_index),
            ("NCCL_NET_GDR_LEVEL", self.gdr_level),
            ("NCCL_MIN_NCHANNELS", self.min_nchannels),
        ):
            if value is not None:
                env[name] = str(value)
        return env


HOOK_PLACES = ("host", "control")


@dataclass(frozen=True)
class Hook:
    """A rolling hook: a shell command on the serving host, on the control machine, or both."""

    host: str | None
    control: str | None


@dataclass(frozen=True)
class RollSettings:
    """How a re-tune restarts the fleet (README, Re-tuning a live fleet)."""

    batch: int | str  # a count, or a percentage such as "25%"
    max_failures: int
    drain_timeout: int
    pre_stop: Hook | None
    post_start: Hook | None


@dataclass(frozen=True)
class HostSettings:
    """The host-wide variables the deploy stages read (README, Variables)."""

    shm_size: str
    hf_token_path: str
    hf_cache_dir: str
    health_timeout: int
    command_timeout: int
    image_pull_timeout: int
    tune_numa_balancing: bool
    tune_kernel_cmdline: bool
    tune_reboot: bool
    tune_cpu_idle: bool
    tune_memlock: bool | int
    service_user: str
    registry_mirrors: tuple[str, ...]
    insecure_registries: tuple[str, ...]
    registry_ca_certs: dict[str, str]
    credentials_file: str | None
    firewall: bool
    allow_from: tuple[str, ...] | None
    cluster: ClusterSpec | None
    rolling: RollSettings


@dataclass(frozen=True)
class HostSpec:
    host: str | None
    gpu_count: int
    gpu_model: str
    services: tuple[ServiceSpec, ...]
    settings: HostSettings
    data: dict[str, Any]


class _Schema:
    """Collects type errors with the host and the key, instead of raising."""

    def __init__(self, host: str | None) -> None:
        self.host = host
        self.findings: list[Finding] = []

    def error(self, key: str, message: str) -> None:
        self.findings.append(finding("schema", self.host, key, message))

    def typed(self, key: str, value: Any, kinds: type | tuple[type, ...], default: Any, what: str) -> Any:
        if value is None and default is None:
            return None
        if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
            self.error(key, f"expected {what}, got {value!r}")
            return default
        if not isinstance(value, kinds):
            self.error(key, f"expected {what}, got {type(value).__name__} {value!r}")
            return default
        return value

    def mapping(self, key: str, value: Any) -> dict[str, Any]:
        value = self.typed(key, value, dict, {}, "a mapping")
        if not all(isinstance(k, str) for k in value):
            self.error(key, "keys must be strings")
            return {}
        return dict(value)


def _strings(schema: _Schema, key: str, value: Any) -> tuple[str, ...]:
    items = schema.typed(key, value, (list, tuple), [], "a list of strings")
    if not all(isinstance(item, str) for item in items):
        schema.error(key, f"expected a list of strings, got {list(items)!r}")
        return ()
    return tuple(items)


def resolve_settings(schema: _Schema, merged: Mapping[str, Any]) -> HostSettings:
    """Type the host-wide variables; a wrong type becomes a schema finding and the default."""

    def flag(key: str) -> bool:
        return bool(schema.typed(key, merged[key], bool, DEFAULTS[key], "True or False"))

    def text(key: str) -> str:
        return str(schema.typed(key, merged[key], str, DEFAULTS[key], "a string"))

    memlock = schema.typed("tune_memlock", merged["tune_memlock"], (bool, int), True, "True, False or a number of bytes")
    if not isinstance(memlock, bool) and memlock <= 0:
        schema.error("tune_memlock", f"a byte limit must be positive, got {memlock}")
        memlock = True

    def seconds(key: str) -> int:
        value = schema.typed(key, merged[key], int, DEFAULTS[key], "seconds as an integer")
        if value < 1:
            schema.error(key, f"must be at least 1 second, got {value}")
            return int(DEFAULTS[key])
        return int(value)

    certs = schema.mapping("docker_registry_ca_certs", merged["docker_registry_ca_certs"])
    if not all(isinstance(v, str) for v in certs.values()):
        schema.error("docker_registry_ca_certs", "values must be paths on the control machine")
        certs = {}
    credentials = schema.typed("docker_credentials_file", merged["docker_credentials_file"], str, None, "a path or None")
    allow = merged["vllm_allow_from"]
    allow_from = None if allow is None else _strings(schema, "vllm_allow_from", allow)
    return HostSettings(
        shm_size=text("vllm_shm_size"),
        hf_token_path=text("hf_token_path"),
        hf_cache_dir=text("hf_cache_dir"),
        health_timeout=seconds("health_timeout"),
        command_timeout=seconds("command_timeout"),
        image_pull_timeout=seconds("image_pull_timeout"),
        tune_numa_balancing=flag("tune_numa_balancing"),
        tune_kernel_cmdline=flag("tune_kernel_cmdline"),
        tune_reboot=flag("tune_reboot"),
        tune_cpu_idle=flag("tune_cpu_idle"),
        tune_memlock=memlock,
        service_user=text("service_user"),
        registry_mirrors=_strings(schema, "docker_registry_mirrors", merged["docker_registry_mirrors"]),
        insecure_registries=_strings(schema, "docker_insecure_registries", merged["docker_insecure_registries"]),
        registry_ca_certs=certs,
        credentials_file=credentials,
        firewall=flag("firewall"),
        allow_from=allow_from,
        cluster=resolve_cluster(schema, merged),
        rolling=resolve_rolling(schema, merged),
    )


ROLLING_PERCENT = re.compile(r"^([1-9][0-9]?|100)%$")


def _hook(schema: _Schema, key: str, value: Any) -> Hook | None:
    if value is None:
        return None
    if isinstance(value, str):
        schema.error(key, f'say where the command runs: {{"host": {value!r}}} or {{"control": {value!r}}}')
        return None
    hook = schema.mapping(key, value)
    unknown = sorted(set(hook) - set(HOOK_PLACES))
    if unknown:
        schema.error(key, f"unknown keys {unknown}; a hook takes {' and/or '.join(HOOK_PLACES)}")
    commands = {place: hook.get(place) for place in HOOK_PLACES}
    for place, command in commands.items():
        if command is not None and (not isinstance(command, str) or not command.strip()):
            schema.error(f"{key}.{place}", f"must be a shell command, got {command!r}")
            commands[place] = None
    if not any(commands.values()):
        return None
    return Hook(host=commands["host"], control=commands["control"])


def resolve_rolling(schema: _Schema, merged: Mapping[str, Any]) -> RollSettings:
    """The rolling variables; rolling_batch is a positive count or a percentage from 1% to 100%."""
    batch = merged["rolling_batch"]
    if isinstance(batch, bool) or not isinstance(batch, (int, str)):
        schema.error("rolling_batch", f'expected a number of serving units or a percentage such as "25%", got {batch!r}')
        batch = DEFAULTS["rolling_batch"]
    elif isinstance(batch, int) and batch < 1:
        schema.error("rolling_batch", f"must be at least 1 serving unit, got {batch}")
        batch = DEFAULTS["rolling_batch"]
    elif isinstance(batch, str) and not ROLLING_PERCENT.match(batch.strip()):
        schema.error("rolling_batch", f'a percentage is written "1%" to "100%", got {batch!r}')
        batch = DEFAULTS["rolling_batch"]
    failures = schema.typed("rolling_max_failures", merged["rolling_max_failures"], int, 0, "a number of batches")
    if failures < 0:
        schema.error("rolling_max_failures", f"must be 0 or more, got {failures}")
        failures = 0
    drain = schema.typed("rolling_drain_timeout", merged["rolling_drain_timeout"], int, DEFAULTS["rolling_drain_timeout"], "seconds")
    if drain < 0:
        schema.error("rolling_drain_timeout", f"must be 0 or more seconds, got {drain}")
        drain = DEFAULTS["rolling_drain_timeout"]
    return RollSettings(
        batch=batch.strip() if isinstance(batch, str) else batch,
        max_failures=failures,
        drain_timeout=drain,
        pre_stop=_hook(schema, "rolling_pre_stop", merged["rolling_pre_stop"]),
        post_start=_hook(schema, "rolling_post_start", merged["rolling_post_start"]),
    )


def resolve_cluster(schema: _Schema, merged: Mapping[str, Any]) -> ClusterSpec | None:
    """The host's cluster membership; None for a single-node host."""
    name = schema.typed("ray_cluster", merged["ray_cluster"], str, None, "a cluster name or None")
    if name is None:
        if merged["ray_role"] is not None:
            schema.error(
                "ray_role", f"ray_role is {merged['ray_role']!r} but the host has no ray_cluster: set ray_cluster, or remove ray_role"
            )
        return None
    role = merged["ray_role"]
    if role not in ("head", "worker"):
        schema.error("ray_role", f"a member of ray_cluster {name!r} must have ray_role 'head' or 'worker', got {role!r}")
        role = "worker"
    ports = {**DEFAULTS["ray_ports"], **schema.mapping("ray_ports", merged["ray_ports"])}
    for key, port in ports.items():
        if key not in DEFAULTS["ray_ports"]:
            schema.error(f"ray_ports.{key}", f"unknown Ray port; known: {', '.join(DEFAULTS['ray_ports'])}")
        elif isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            schema.error(f"ray_ports.{key}", f"must be a port number, got {port!r}")
            ports[key] = DEFAULTS["ray_ports"][key]
    if ports["min_worker"] >= ports["max_worker"]:
        schema.error("ray_ports", f"min_worker ({ports['min_worker']}) must be below max_worker ({ports['max_worker']})")

    def optional(key: str, kinds: type | tuple[type, ...], what: str) -> Any:
        return schema.typed(key, merged[key], kinds, None, what)

    gdr = optional("nccl_net_gdr_level", (str, int), "a level such as 3 or PHB")
    return ClusterSpec(
        name=name,
        role=str(role),
        ports={k: v for k, v in ports.items() if k in DEFAULTS["ray_ports"]},
        ready_timeout=schema.typed("ray_ready_timeout", merged["ray_ready_timeout"], int, 600, "seconds as an integer"),
        nic=optional("cluster_nic", str, "an interface name"),
        ib_hca=optional("nccl_ib_hca", str, "a list of RDMA devices such as mlx5_0,mlx5_1"),
        ib_gid_index=optional("nccl_ib_gid_index", int, "an integer"),
        gdr_level=None if gdr is None else str(gdr),
        min_nchannels=optional("nccl_min_nchannels", int, "an integer"),
        infiniband=bool(schema.typed("infiniband", merged["infiniband"], bool, False, "True or False")),
    )


def _scalar_env(schema: _Schema, key: str, name: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (str, int, float)):
        return str(value)
    schema.error(f"{key}.{name}", f"env values must be strings or numbers, got {type(value).__name__}")
    return None


def _arg_value(schema: _Schema, key: str, name: str, value: Any) -> ArgValue | None:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    schema.error(f"{key}.{name}", f"flag values must be scalars, mappings or lists, got {type(value).__name__}")
    return None


def canonical_arg(name: str, table: knowledge.VllmKnowledge | None) -> str:
    """The spelling a flag is stored under: long name, dashes, no leading ``--``."""
    if table is not None:
        known = table.canonical_flag(name)
        if known is not None:
            return known
    return name.lstrip("-").replace("_", "-")


def layer(
    env: dict[str, str],
    args: dict[str, ArgValue],
    reasons: dict[str, str],
    schema: _Schema,
    keys: tuple[str, str],
    env_over: Mapping[str, Any],
    args_over: Mapping[str, Any],
    table: knowledge.VllmKnowledge | None,
    origin: str,
) -> None:
    """Apply one layer of env and flag overrides in place; ``None`` removes."""
    for name, raw in env_over.items():
        value = _scalar_env(schema, keys[0], name, raw)
        if value is None:
            env.pop(name, None)
            reasons.pop(name, None)
        else:
            env[name] = value
            reasons[name] = origin
    for name, raw in args_over.items():
        flag = canonical_arg(name, table)
        arg = _arg_value(schema, keys[1], name, raw)
        is_switch = table is not None and f"--{flag}" in table.flags and table.flag(flag).kind in ("bool", "switch")
        if is_switch and isinstance(arg, str) and arg.lower() in ("true", "false"):
            arg = arg.lower() == "true"  # --arg enable-x=false from the CLI
        if arg is None:
            args.pop(flag, None)
            reasons.pop(f"--{flag}", None)
        else:
            args[flag] = arg
            reasons[f"--{flag}"] = origin


def from_recipe(recipe: Recipe, table: knowledge.VllmKnowledge | None) -> tuple[dict[str, str], dict[str, ArgValue], dict[str, str]]:
    """The recipe's env, flags and reasons, with flag names in canonical form."""
    env = {k: str(s.value) for k, s in recipe.env.items()}
    args = {canonical_arg(k, table): s.value for k, s in recipe.args.items()}
    reasons = {k: f"recipe {recipe.name}: {s.why}" for k, s in recipe.env.items()}
    reasons.update({f"--{canonical_arg(k, table)}": f"recipe {recipe.name}: {s.why}" for k, s in recipe.args.items()})
    return env, args, reasons


def unknown_recipe_message(name: str) -> str:
    names = sorted(all_recipes())
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"no built-in recipe {name!r}{hint} Known: {', '.join(names)}"


def resolve_host(host: str | None, data: Mapping[str, Any]) -> tuple[HostSpec, list[Finding]]:
    """Turn one host's data into typed services. Never raises on bad input."""
    schema = _Schema(host)
    merged = {**DEFAULTS, **{k: v for k, v in data.items() if k in DEFAULTS}}
    version = schema.typed("vllm_version", merged["vllm_version"], str, DEFAULTS["vllm_version"], "a version string")
    image = schema.typed("vllm_image", merged["vllm_image"], str, DEFAULTS["vllm_image"], "an image reference")
    gpu_count = schema.typed("gpu_count", merged["gpu_count"], int, 8, "an integer")
    if not 1 <= gpu_count <= MAX_GPUS:
        schema.error("gpu_count", f"must be 1 to {MAX_GPUS} GPUs per host, got {gpu_count}")
        gpu_count = 8
    gpu_model = schema.typed("gpu_model", merged["gpu_model"], str, "MI300X", "a GPU model name")
    nodes = schema.typed("vllm_nodes", merged["vllm_nodes"], int, 1, "an integer")
    if nodes < 1:
        schema.error("vllm_nodes", f"must be at least 1, got {nodes}")
        nodes = 1
    default_recipe = schema.typed("vllm_recipe", merged["vllm_recipe"], str, None, "a recipe name or None")
    default_model = schema.typed("vllm_model", merged["vllm_model"], str, None, "a model name")
    host_env = schema.mapping("vllm_env", merged["vllm_env"])
    host_args = schema.mapping("vllm_args", merged["vllm_args"])
    instances = schema.typed("vllm_instances", merged["vllm_instances"], (list, tuple), [], "a list of instances")

    try:
        table: knowledge.VllmKnowledge | None = knowledge.load(version)
    except KeyError:
        table = None
        schema.findings.append(
            finding(
                "version-unsupported",
                host,
                "vllm_version",
                f"no env var/flag table for vLLM {version!r}; supported: {', '.join(knowledge.supported_versions())}. "
                "Generate one with scripts/extract_vllm_knowledge.py",
            )
        )

    services: list[ServiceSpec] = []
    next_gpu = 0
    for index, raw in enumerate(instances):
        key = f"vllm_instances[{index}]"
        if not isinstance(raw, Mapping):
            schema.error(key, f"expected a mapping with at least 'name', got {type(raw).__name__}")
            continue
        extra = sorted(set(raw) - INSTANCE_KEYS)
        if extra:
            schema.error(key, f"unknown keys {extra}; allowed: {sorted(INSTANCE_KEYS)}")
        name = raw.get("name")
        if not isinstance(name, str) or not INSTANCE_NAME.match(name):
            schema.error(f"{key}.name", f"must match {INSTANCE_NAME.pattern} (it names the unit vllm-<name>.service), got {name!r}")
            continue
        recipe_name = schema.typed(f"{key}.recipe", raw.get("recipe", default_recipe), str, None, "a recipe name")
        if recipe_name is None:
            # No recipe: the instance is exactly its env and flags (an imported launch command).
            model_name = raw.get("model", default_model)
            if not isinstance(model_name, str):
                schema.error(f"{key}.model", "without a recipe (vllm_recipe = None) the instance needs a model (vllm_model or model)")
                continue
            recipe: Recipe | None = Recipe("custom", model_name, "no recipe", "group_data", DEFAULT_PORT, 1, {}, {}, (), ())
        else:
            recipe = all_recipes().get(recipe_name)
        if recipe is None:
            source_key = f"{key}.recipe" if "recipe" in raw else "vllm_recipe"
            schema.findings.append(finding("recipe-unknown", host, source_key, unknown_recipe_message(str(recipe_name))))
            continue
        env, args, reasons = from_recipe(recipe, table)
        layer(env, args, reasons, schema, ("vllm_env", "vllm_args"), host_env, host_args, table, "group_data: vllm_env/vllm_args")
        layer(
            env,
            args,
            reasons,
            schema,
            (f"{key}.env", f"{key}.args"),
            schema.mapping(f"{key}.env", raw.get("env", {})),
            schema.mapping(f"{key}.args", raw.get("args", {})),
            table,
            f"group_data: {key}",
        )
        model = schema.typed(
            f"{key}.model", raw.get("model", recipe.model if default_model is None else default_model), str, recipe.model, "a model name"
        )
        port = schema.typed(f"{key}.port", raw.get("port", recipe.port + index), int, recipe.port + index, "a port number")
        # A shape larger than the host is reported by validation (parallel-size), not by overflowing the GPU list.
        per_node = min(max(1, world_size(args) // nodes), gpu_count)
        if "gpus" in raw:
            gpus_raw = schema.typed(f"{key}.gpus", raw["gpus"], (list, tuple), [], "a list of GPU indices")
            if not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus_raw):
                schema.error(f"{key}.gpus", f"GPU indices must be integers, got {list(gpus_raw)!r}")
                gpus_raw = []
            gpus = tuple(gpus_raw)
        else:
            gpus = tuple(range(next_gpu, next_gpu + per_node))
        next_gpu = max([next_gpu, *[g + 1 for g in gpus]])
        services.append(ServiceSpec(name, host, recipe.name, image, version, model, env, args, gpus, port, nodes, reasons))
    settings = resolve_settings(schema, merged)
    return HostSpec(host, gpu_count, gpu_model, tuple(services), settings, dict(merged)), schema.findings
