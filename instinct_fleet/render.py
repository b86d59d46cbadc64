"""Render a typed service into what runs: the env file lines and the ``vllm serve`` argv.

Both the CLI's JSON and the deploy's templates call these functions, so what
``instinct-fleet plan`` prints is exactly what the unit runs.
"""

from __future__ import annotations

import json
import re
from typing import Any

from instinct_fleet import knowledge
from instinct_fleet.preflight import KERNEL_ARGS
from instinct_fleet.recipes import ArgValue
from instinct_fleet.spec import HostSettings, ServiceSpec


def _format(value: ArgValue) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def render_args(svc: ServiceSpec) -> list[str]:
    """The flags after ``vllm serve MODEL``; the port comes last, from the instance."""
    try:
        table: knowledge.VllmKnowledge | None = knowledge.load(svc.version)
    except KeyError:
        table = None
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
CONFIG_DIR = "/etc/instinct-fleet"
DOCKER = "/usr/bin/docker"
TOKEN_IN_CONTAINER = "/run/secrets/hf-token"
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
STOP_MARGIN_SECONDS = 30
SYSCTL_FILE = "/etc/sysctl.d/90-instinct-fleet.conf"
GRUB_DROP_IN = "/etc/default/grub.d/90-instinct-fleet.cfg"
DOCKER_DROP_IN = "/etc/systemd/system/docker.service.d/90-instinct-fleet.conf"
CPU_IDLE_UNIT = "instinct-fleet-cpu-idle.service"
REBOOT_MARKER = "/run/instinct-fleet/reboot-required"


def unit_name(svc: ServiceSpec) -> str:
    return f"vllm-{svc.name}"


def env_path(svc: ServiceSpec) -> str:
    return f"{CONFIG_DIR}/{unit_name(svc)}.env"


def served_model(svc: ServiceSpec) -> str:
    """The name /v1/models lists: --served-model-name when set, else the model."""
    name = svc.args.get("served-model-name")
    return str(name).split()[0] if isinstance(name, str) and name.strip() else svc.model


def env_file(svc: ServiceSpec, with_token: bool) -> str:
    """docker --env-file lines. The token is never here: only the path of its read-only mount."""
    env = dict(svc.env)
    if with_token:
        env["HF_TOKEN_PATH"] = TOKEN_IN_CONTAINER
    return "".join(f"{key}={value}\n" for key, value in env.items())


def stop_seconds(svc: ServiceSpec) -> int:
    """Grace for ``docker stop``: vLLM's --shutdown-timeout (drain in-flight requests) plus a margin."""
    return _seconds(svc.args.get("shutdown-timeout")) + STOP_MARGIN_SECONDS


def _seconds(value: ArgValue | None) -> int:
    try:
        return max(0, int(value)) if value is not None and not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        return 0


def memlock_ulimit(setting: bool | int) -> str | None:
    """``docker --ulimit`` value for ``tune_memlock``: -1 is unlimited."""
    if setting is False:
        return None
    limit = -1 if setting is True else int(setting)
    return f"memlock={limit}:{limit}"


def docker_run(svc: ServiceSpec, settings: HostSettings, devices: list[str], group_ids: list[int], with_token: bool) -> list[str]:
    """The full ``docker run`` argv of one instance, in a fixed order so that units only change when inputs do."""
    argv = [DOCKER, "run", "--rm", "--name", unit_name(svc), "--label", f"instinct-fleet.instance={svc.name}"]
    argv += ["--network", "host", "--ipc", "host", "--shm-size", settings.shm_size]
    argv += ["--device", "/dev/kfd"]
    for device in devices:
        argv += ["--device", device]
    for gid in group_ids:
        argv += ["--group-add", str(gid)]
    argv += ["--cap-add", "SYS_PTRACE", "--security-opt", "seccomp=unconfined"]
    ulimit = memlock_ulimit(settings.tune_memlock)
    if ulimit:
        argv += ["--ulimit", ulimit]
    argv += ["--env-file", env_path(svc), "-v", f"{settings.hf_cache_dir}:{HF_CACHE_IN_CONTAINER}"]
    if with_token:
        argv += ["-v", f"{settings.hf_token_path}:{TOKEN_IN_CONTAINER}:ro"]
    argv += ["--entrypoint", "vllm", svc.image, "serve", svc.model, *render_args(svc)]
    return argv


SYSTEMD_PLAIN = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """Quote one argument for an Exec line: systemd expands % and $, and splits on spaces."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if SYSTEMD_PLAIN.match(arg):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(argv: list[str]) -> str:
    """One Exec= value, continued over lines at each flag so that a unit diff reads well."""
    parts: list[str] = []
    for arg in argv:
        quoted = systemd_quote(arg)
        if arg.startswith("-") and parts:
            parts.append(" \\\n    " + quoted)
        else:
            parts.append((" " if parts else "") + quoted)
    return "".join(parts)


def daemon_json(settings: HostSettings) -> str:
    """/etc/docker/daemon.json: only the keys instinct-fleet owns, sorted, so reruns are byte-identical."""
    config: dict[str, Any] = {}
    if settings.registry_mirrors:
        config["registry-mirrors"] = list(settings.registry_mirrors)
    if settings.insecure_registries:
        config["insecure-registries"] = list(settings.insecure_registries)
    ulimit = memlock_ulimit(settings.tune_memlock)
    if ulimit:
        limit = int(ulimit.split("=")[1].split(":")[0])
        config["default-ulimits"] = {"memlock": {"Name": "memlock", "Hard": limit, "Soft": limit}}
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def memlock_systemd(setting: bool | int) -> str | None:
    """LimitMEMLOCK= for dockerd's unit."""
    if setting is False:
        return None
    return "infinity" if setting is True else str(int(setting))


def grub_drop_in() -> str:
    args = " ".join(KERNEL_ARGS)
    return f'# Managed by instinct-fleet: IOMMU pass-through and no PCI BAR reallocation for MI300X (AMD MAD, 002).\nGRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {args}"\n'


def sysctl_file() -> str:
    return "# Managed by instinct-fleet: automatic NUMA balancing stalls GPU DMA buffers (004, AMD MAD).\nkernel.numa_balancing = 0\n"
