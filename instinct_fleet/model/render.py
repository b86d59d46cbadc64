"""Render a typed service into what runs: the env file lines and the ``vllm serve`` argv.

Both the CLI's JSON and the deploy's templates call these functions, so what
``instinct-fleet plan`` prints is exactly what the unit runs.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from instinct_fleet.model import knowledge, paths
from instinct_fleet.model.launch import TRUE
from instinct_fleet.model.recipes import ArgValue
from instinct_fleet.model.spec import ClusterSpec, HostSpec, ServiceSpec


def _format(value: ArgValue) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def render_args(svc: ServiceSpec) -> list[str]:
    """The flags after ``vllm serve MODEL``; the port comes last, from the instance."""
    table = svc.table
    argv: list[str] = []
    for flag, value in svc.args.items():
        kind = table.flag(flag).kind if table is not None and f"--{flag}" in table.flags else "bool"
        if value is True:
            argv.append(f"--{flag}")
        elif value is False:
            if kind == "bool":
                argv.append(f"--no-{flag}")
        else:
            argv += [f"--{flag}", _format(value)]
    return [*argv, "--port", str(svc.port)]


def service_json(svc: ServiceSpec) -> dict[str, Any]:
    """The contract of ``--json`` output for one service."""
    return {
        "name": svc.name,
        "host": svc.host,
        "image": svc.image,
        "model": svc.model,
        "env": dict(svc.env),
        "vllm_args": render_args(svc),
        "gpus": list(svc.gpus),
        "port": svc.port,
    }


# What the deploy writes on a host. Every path and flag of the vLLM unit comes from here.
STOP_MARGIN_SECONDS = 30
START_SECONDS = 120


def repo_dir(cache: str, model: str) -> str:
    """Where a Hugging Face cache rooted at ``cache`` keeps ``model`` (huggingface_hub's layout)."""
    return f"{cache}/hub/models--{model.replace('/', '--')}"


def revision(svc: ServiceSpec) -> str:
    """The model revision the instance loads: its ``--revision``, else the hub's default branch."""
    value = svc.args.get("revision")
    return str(value) if isinstance(value, str) and value.strip() else "main"


def generates(svc: ServiceSpec) -> bool:
    """Whether the instance generates text: a pooling model (``--runner pooling``, ``--convert embed|classify``)
    has no completions route, so the health gate stops at /v1/models for it."""
    return svc.args.get("runner") != "pooling" and svc.args.get("convert") not in ("embed", "classify")


def served_model(svc: ServiceSpec) -> str:
    """The name /v1/models lists: --served-model-name when set, else the model."""
    name = svc.args.get("served-model-name")
    return str(name).split()[0] if isinstance(name, str) and name.strip() else svc.model


def drain_args(svc: ServiceSpec, drain_timeout: int) -> list[str]:
    """``--shutdown-timeout`` where the pinned vLLM has it and the instance does not set it: SIGTERM then drains."""
    if "shutdown-timeout" in svc.args or not has_flag(svc, "shutdown-timeout"):
        return []
    return ["--shutdown-timeout", str(drain_timeout)]


def serve_command(svc: ServiceSpec, drain_timeout: int) -> list[str]:
    """What the instance's container runs after its ``vllm`` entrypoint: the unit writes it, ``plan`` shows it."""
    return ["serve", svc.model, *render_args(svc), *drain_args(svc, drain_timeout)]


def unit_env(spec: HostSpec, svc: ServiceSpec, cluster: bool = True) -> dict[str, str]:
    """The instance's container env as its env file holds it, but for what the host's facts add (the token's path
    where it has one, VLLM_HOST_IP on a cluster node): its own, its image's compile cache, a cluster's RCCL settings
    (``cluster``: the node's cluster facts were read). The unit writes it, ``plan`` shows it."""
    env = {**svc.env, **compile_cache_env(spec.compile_cache(svc), svc)}
    return {**env, **spec.cluster.rccl_env()} if cluster and spec.cluster is not None else env


def compile_cache_env(cache: str, svc: ServiceSpec) -> dict[str, str]:
    """Where the container's compilers keep what they build, inside the image's cache directory (mounted at the
    same path): VLLM_CACHE_ROOT (vLLM's torch.compile and Triton caches, where the pinned vLLM reads it: its
    knowledge table), AITER_JIT_DIR (AITER's own variable for its JIT modules, aiter/jit/core.py) and, where
    TunableOp is on, PYTORCH_TUNABLEOP_FILENAME (PyTorch's; ``%d`` is the device)."""
    table = svc.table
    env = {"VLLM_CACHE_ROOT": f"{cache}/vllm"} if table is not None and "VLLM_CACHE_ROOT" in table.env_vars else {}
    env["AITER_JIT_DIR"] = f"{cache}/aiter"
    if svc.env.get("PYTORCH_TUNABLEOP_ENABLED") in TRUE:
        env["PYTORCH_TUNABLEOP_FILENAME"] = f"{cache}/tunableop/tunableop_results%d.csv"
    return env


def compile_config(svc: ServiceSpec, api_key_path: str | None) -> str | None:
    """A digest of what the pinned vLLM folds into its compile cache key: the image, the model, every engine flag
    (its server's own flags, such as --port and --api-key, aside: the table's ``frontend``) and the env vars its
    ``compile_factors`` hash (the table's ``compile_env``). Two instances with the same digest build the same cache
    entries, so one's cache starts the other warm. VLLM_API_KEY, set in the container from ``api_key_path``,
    counts by that path where the version hashes it. None for a version without a table.

    It may split what vLLM would share (it counts every engine flag), never the reverse; and vLLM checks its own
    key on every start, so a cache copied to a host that differs is unused, never misused."""
    table = svc.table
    if table is None:
        return None
    engine = {name: value for name, value in svc.args.items() if f"--{name}" not in table.frontend}
    env = {name: value for name, value in svc.env.items() if name in table.compile_env}
    if api_key_path is not None and "VLLM_API_KEY" in table.compile_env:
        env["VLLM_API_KEY"] = f"(read from {api_key_path})"
    factors = json.dumps([svc.image, svc.model, engine, env], sort_keys=True, default=str)
    return hashlib.sha256(factors.encode()).hexdigest()[:16]


def env_file(env: dict[str, str], with_token: bool) -> str:
    """docker --env-file lines. The token is never here: only the path of its read-only mount."""
    lines = dict(env)
    if with_token:
        lines["HF_TOKEN_PATH"] = paths.TOKEN_IN_CONTAINER
    return "".join(f"{key}={value}\n" for key, value in lines.items())


def has_flag(svc: ServiceSpec, flag: str) -> bool:
    """Whether the pinned vLLM version knows ``--flag`` (its knowledge table)."""
    table = svc.table
    return table is not None and f"--{flag}" in table.flags


def drain_seconds(svc: ServiceSpec, drain_timeout: int) -> int:
    """How long a stopping instance may finish in-flight requests: its own --shutdown-timeout, else rolling_drain_timeout."""
    own = svc.args.get("shutdown-timeout")
    return _seconds(own) if own is not None else drain_timeout


def start_seconds(cluster: ClusterSpec | None, head: bool) -> int:
    """A serving unit's TimeoutStartSec: two minutes for docker to create the container, plus, on a Ray head,
    the wait for every node of the cluster (ray_ready_timeout)."""
    return START_SECONDS + (cluster.ready_timeout if cluster is not None and head else 0)


def stop_seconds(svc: ServiceSpec, drain_timeout: int) -> int:
    """Grace for ``docker stop``: the drain plus a margin, so that vLLM ends on its own before docker kills it."""
    return drain_seconds(svc, drain_timeout) + STOP_MARGIN_SECONDS


def _seconds(value: ArgValue | None) -> int:
    try:
        return max(0, int(value)) if value is not None and not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        return 0


# vLLM reads VLLM_API_KEY from its environment. A shell sets it from the mounted file (paths.API_KEY_IN_CONTAINER)
# and then becomes vllm (exec, so docker stop's signal reaches it): the key is in no unit, argv, env file or docker inspect.


def with_api_key(
    entrypoint: str, command: list[str], key_path: str | None, variable: str = "VLLM_API_KEY"
) -> tuple[str, list[str], list[str]]:
    """(entrypoint, command, mounts) of a process that must see the key at ``key_path`` as ``variable``.

    vLLM's server reads VLLM_API_KEY; ``vllm bench serve`` sends OPENAI_API_KEY.
    """
    if key_path is None:
        return entrypoint, command, []
    script = f'{variable}="$(cat {paths.API_KEY_IN_CONTAINER})" exec {entrypoint} "$@"'
    return "/bin/sh", ["-c", script, entrypoint, *command], [f"{key_path}:{paths.API_KEY_IN_CONTAINER}:ro"]


SYSTEMD_PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """Quote one argument for an Exec line: systemd expands % and $, and splits on spaces."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if SYSTEMD_PLAIN.match(arg):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(argv: list[str]) -> str:
    """One Exec= value, continued over lines at each option so that a unit diff reads well."""
    parts: list[str] = []
    for arg in argv:
        quoted = systemd_quote(arg)
        if knowledge.is_option(arg) and parts:
            parts.append(" \\\n    " + quoted)
        else:
            parts.append((" " if parts else "") + quoted)
    return "".join(parts)
