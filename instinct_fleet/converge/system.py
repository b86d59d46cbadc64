"""What the host's own managed files hold, each in one function: the kernel command line (GRUB) and sysctl, the CPU idle
unit, dockerd's daemon.json and limits drop-in (``tune_memlock``), the device metrics exporter's unit and config, the
watch's unit."""

from __future__ import annotations

import json
from typing import Any

from instinct_fleet.converge import templating
from instinct_fleet.converge.hostfacts import HostFacts
from instinct_fleet.model import paths
from instinct_fleet.model.defaults import FleetVars
from instinct_fleet.model.paths import KERNEL_ARGS
from instinct_fleet.model.render import exec_line

# The exporter's labels: those of the captured MI300X scrape (tests/fixtures, device-metrics-exporter-*).
EXPORTER_LABELS = (
    "GPU_UUID",
    "SERIAL_NUMBER",
    "GPU_ID",
    "GPU_PARTITION_ID",
    "GPU_COMPUTE_PARTITION_TYPE",
    "GPU_MEMORY_PARTITION_TYPE",
    "CARD_SERIES",
    "CARD_MODEL",
    "CARD_VENDOR",
    "DRIVER_VERSION",
    "VBIOS_VERSION",
    "HOSTNAME",
)


def exporter_config(port: int, fields: list[str]) -> str:
    """The device-metrics-exporter's config.json (its documented ``ServerPort`` and ``GPUConfig``)."""
    config = {"ServerPort": port, "GPUConfig": {"Fields": list(fields), "Labels": list(EXPORTER_LABELS)}}
    return json.dumps(config, indent=2) + "\n"


def exporter_argv(image: str) -> list[str]:
    """The exporter's ``docker run``, as its documentation gives it, with the host's network so the firewall sees its port."""
    argv = [
        paths.DOCKER,
        "run",
        "--rm",
        "--name",
        paths.EXPORTER_UNIT,
        "--label",
        f"instinct-fleet.unit={paths.EXPORTER_UNIT}",
        "--network",
        "host",
    ]
    argv += ["--device", paths.KFD, "--device", paths.DRI, "-v", f"{paths.EXPORTER_DIR}:{paths.EXPORTER_CONFIG_IN_CONTAINER}:ro", image]
    return argv


def memlock_limit(setting: bool | int) -> int | None:
    """``tune_memlock`` in bytes, -1 for unlimited, None when left alone; docker, daemon.json and systemd all derive from it."""
    if setting is False:
        return None
    return -1 if setting is True else int(setting)


def memlock_ulimit(setting: bool | int) -> str | None:
    """``docker --ulimit`` value for ``tune_memlock``."""
    limit = memlock_limit(setting)
    return None if limit is None else f"memlock={limit}:{limit}"


def cpu_idle_unit() -> str:
    return templating.template("cpu-idle.service.j2", cpupower=paths.CPUPOWER)


def watch_unit(port: int) -> str:
    return templating.template(
        "watch.service.j2", python=paths.PYTHON3, script=paths.WATCH_SCRIPT, config=paths.WATCH_CONFIG, state=paths.WATCH_STATE, port=port
    )


def daemon_json(v: FleetVars) -> str:
    """/etc/docker/daemon.json: only the keys instinct-fleet owns, sorted, so reruns are byte-identical."""
    config: dict[str, Any] = {}
    if v.docker_registry_mirrors:
        config["registry-mirrors"] = list(v.docker_registry_mirrors)
    if v.docker_insecure_registries:
        config["insecure-registries"] = list(v.docker_insecure_registries)
    limit = memlock_limit(v.tune_memlock)
    if limit is not None:
        config["default-ulimits"] = {"memlock": {"Name": "memlock", "Hard": limit, "Soft": limit}}
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def memlock_systemd(setting: bool | int) -> str | None:
    """LimitMEMLOCK= for dockerd's unit."""
    limit = memlock_limit(setting)
    return None if limit is None else "infinity" if limit == -1 else str(limit)


def grub_drop_in() -> str:
    args = " ".join(KERNEL_ARGS)
    return f'# Managed by instinct-fleet: IOMMU pass-through and no PCI BAR reallocation for MI300X (AMD MI300X system optimization guide).\nGRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {args}"\n'


def sysctl_file() -> str:
    return "# Managed by instinct-fleet: automatic NUMA balancing can hinder GPU performance and cause GPU hangs (004:171, after AMD MAD).\nkernel.numa_balancing = 0\n"


def docker_drop_in(plan: HostFacts) -> str | None:
    """dockerd's limits drop-in (None: must be absent)."""
    memlock = memlock_systemd(plan.spec.vars.tune_memlock)
    return templating.template("docker-limits.conf.j2", memlock=memlock) if memlock else None


def exporter_unit(plan: HostFacts) -> str:
    v = plan.spec.vars
    return templating.template(
        "amd-metrics-exporter.service.j2",
        unit=paths.EXPORTER_UNIT,
        docker=paths.DOCKER,
        port=v.metrics_exporter_port,
        config_dir=paths.EXPORTER_DIR,
        exec_start=exec_line(exporter_argv(v.metrics_exporter_image)),
    )
