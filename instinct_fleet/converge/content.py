"""What the files a host's deploy writes contain, from its plan (spec plus preflight facts).

Each function renders one kind of managed content; :mod:`instinct_fleet.converge.managed`
names where it goes, with which mode, and what a change of it restarts. The
verify module renders through the same functions, so the deploy and the check
cannot disagree about a flag.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from instinct_fleet.converge import gpuhealth
from instinct_fleet.converge.hostfacts import HostFacts
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.model import liveness, paths, render, router
from instinct_fleet.model.pools import Pool
from instinct_fleet.model.spec import HostSpec, ServiceSpec

BASE_PACKAGES = {"curl": "curl"}  # command -> Debian package; curl runs the health checks
CPUPOWER_PACKAGES = {"debian": ("linux-cpupower",), "ubuntu": ("linux-tools-common", "linux-tools-generic")}


def env_text(plan: HostFacts, svc: ServiceSpec) -> str:
    return render.env_file(plan.env(svc), plan.has_token)


def vllm_argv(plan: HostFacts, svc: ServiceSpec) -> list[str]:
    cluster, v = plan.spec.cluster, plan.spec.vars
    cache = plan.spec.compile_cache(svc)
    mounts = [f"{paths.RAY_TMP}:{paths.RAY_TMP_IN_CONTAINER}"] if plan.role == "head" else []
    mounts.append(f"{cache}:{cache}")
    container = render.vllm_container(
        svc,
        plan.devices(svc),
        v.rolling_drain_timeout,
        mounts,
        infiniband=cluster is not None and cluster.infiniband,
        api_key_path=v.vllm_api_key_path,
    )
    return render.docker_run(container, v, plan.group_ids, plan.has_token)


def ray_argv(plan: HostFacts) -> list[str]:
    cluster = plan.spec.cluster
    assert cluster is not None and plan.cluster is not None
    svc = plan.spec.services[0]
    cache = plan.spec.compile_cache(svc)
    # --num-gpus from amd-smi; preflight has checked it equals gpu_count on every member.
    entrypoint, command = render.ray_node(render.ray_start(cluster, plan.cluster.node_ip, plan.cluster.head_ip, len(plan.report.gpus)))
    container = render.Container(
        name=paths.ray_unit(cluster.role),
        image=svc.image,
        entrypoint=entrypoint,
        command=command,
        env_path=paths.RAY_ENV,
        devices=plan.devices(svc),
        mounts=[f"{paths.RAY_TMP}:{paths.RAY_TMP_IN_CONTAINER}", f"{cache}:{cache}"],
        infiniband=cluster.infiniband,
    )
    return render.docker_run(container, plan.spec.vars, plan.group_ids, plan.has_token)


def unit_vars(plan: HostFacts, svc: ServiceSpec) -> dict[str, Any]:
    """Everything templates/vllm.service.j2 reads."""
    cluster = plan.spec.cluster
    ready = None
    if cluster is not None and plan.role == "head":
        nodes, gpus = svc.nodes, svc.nodes * plan.spec.gpu_count
        ready = render.exec_line(render.ray_ready_command(nodes, gpus, cluster.ready_timeout))
    unit = paths.vllm_unit(svc.name)
    return {
        "unit": unit,
        "model": svc.model,
        "recipe": svc.recipe,
        "port": svc.port,
        "gpus": ",".join(map(str, svc.gpus)),
        "env_path": paths.unit_env_path(unit),
        "docker": paths.DOCKER,
        "exec_start": render.exec_line(vllm_argv(plan, svc)),
        "stop_seconds": render.stop_seconds(svc, plan.spec.vars.rolling_drain_timeout),
        "ray_unit": paths.ray_unit("head") if ready else None,
        "ray_ready": ready,
        "start_timeout": render.start_seconds(cluster, ready is not None),
        "cache_prepare": cache_prepare(plan, svc),
    }


def cache_prepare(plan: HostFacts, svc: ServiceSpec) -> str:
    """The ExecStartPre that readies the image's compile cache (templates/cache-prepare.sh)."""
    return render.exec_line(
        ["/bin/sh", paths.CACHE_PREPARE, plan.spec.compile_cache(svc), svc.image, str(plan.spec.vars.compile_cache_keep)]
    )


def ray_unit_vars(plan: HostFacts) -> dict[str, Any]:
    cluster = plan.spec.cluster
    assert cluster is not None
    return {
        "unit": paths.ray_unit(cluster.role),
        "role": cluster.role,
        "cluster": cluster.name,
        "docker": paths.DOCKER,
        "env_path": paths.RAY_ENV,
        "exec_start": render.exec_line(ray_argv(plan)),
        "cache_prepare": cache_prepare(plan, plan.spec.services[0]),
    }


def serving_units(plan: HostFacts) -> dict[str, tuple[str, str]]:
    """Per serving unit this host runs (ray-* first): its unit file's and env file's content."""
    units = {
        paths.vllm_unit(svc.name): (render.template("vllm.service.j2", **unit_vars(plan, svc)), env_text(plan, svc)) for svc in plan.serves
    }
    if plan.role is not None:
        ray = render.template("ray.service.j2", **ray_unit_vars(plan))
        units[paths.ray_unit(plan.role)] = (ray, env_text(plan, plan.spec.services[0]))
    return {unit: units[unit] for unit in plan.spec.serving_units}  # in start order


def docker_drop_in(plan: HostFacts) -> str | None:
    """dockerd's limits drop-in (None: must be absent)."""
    memlock = render.memlock_systemd(plan.spec.vars.tune_memlock)
    return render.template("docker-limits.conf.j2", memlock=memlock) if memlock else None


def exporter_unit(plan: HostFacts) -> str:
    v = plan.spec.vars
    return render.template(
        "amd-metrics-exporter.service.j2",
        unit=paths.EXPORTER_UNIT,
        docker=paths.DOCKER,
        port=v.metrics_exporter_port,
        config_dir=paths.EXPORTER_DIR,
        exec_start=render.exec_line(render.exporter_argv(v.metrics_exporter_image)),
    )


def firewall(plan: HostFacts) -> str | None:
    """The nftables ruleset for this host, or None when the firewall is not needed or switched off."""
    v, cluster = plan.spec.vars, plan.spec.cluster
    allow, scrapers = v.vllm_allow_from, v.prometheus_allow_from
    routed = router.allowed(plan.spec)
    if not v.firewall or (cluster is None and allow is None and scrapers is None and routed is None):
        return None
    members = list(plan.cluster.member_ips) if plan.cluster else []
    ray = render.ray_ports(cluster) if cluster else []
    exporter = v.metrics_exporter_port if v.metrics_exporter else None
    ports = [s.port for s in plan.serves]
    if v.watch and ports:  # the watch's /state and /metrics: exactly who may reach the instances' /metrics
        ports.append(v.watch_port)
    pools = plan.spec.pools
    return render.firewall_ruleset(
        members,
        ray,
        ports,
        None if allow is None else tuple(allow),
        None if scrapers is None else tuple(scrapers),
        exporter,
        ([p.port for p in pools], [p.metrics_port for p in pools]),
        routed,
    )


def missing_packages(plan: HostPlan) -> list[str]:
    """Debian packages the stages need that the host lacks: docker, curl, nft with a firewall, python3 for a router, cpupower."""
    report = plan.report
    missing = [] if report.docker_version else ["docker.io"]
    missing += [pkg for cmd, pkg in BASE_PACKAGES.items() if cmd not in report.commands]
    if plan.desired.firewall and "nft" not in report.commands:
        missing.append("nftables")
    if plan.spec.pools and "python3" not in report.commands:  # the router's launcher and sync script
        missing.append("python3")
    if plan.spec.vars.tune_cpu_idle and "cpupower" not in report.commands:
        missing += CPUPOWER_PACKAGES.get(report.os_id, CPUPOWER_PACKAGES["debian"])
    return missing


def router_unit(spec: HostSpec, pool: Pool) -> str:
    """One pool's router unit: the launcher with the release's files, the pool's worker file and the router's options."""
    v = spec.vars
    argv = [paths.PYTHON3, paths.ROUTER_LAUNCHER, paths.router_dir(v.router_version), paths.router_workers(pool.port)]
    return render.template(
        "router.service.j2",
        version=v.router_version,
        model=pool.model,
        port=pool.port,
        workers=paths.router_workers(pool.port),
        exec_start=render.exec_line(argv + router.argv(spec, pool)),
    )


def watch_config(spec: HostSpec) -> str:
    """The watch's config (templates/watch.py): the rule's series from the pinned vLLM's own metrics, its timings, and
    per instance what its gate asks and the router pools it leaves and joins."""
    v = spec.vars
    assert spec.table is not None
    names = liveness.series(spec.table.metrics)
    assert names is not None  # validation (watch-metrics)
    instances: list[dict[str, Any]] = []
    for svc in spec.serves:
        unit = paths.vllm_unit(svc.name)
        routers = [{"router": m.router, "api": m.api, "url": m.url} for m in spec.memberships if m.unit == unit]
        instances.append(
            {
                "unit": unit,
                "port": svc.port,
                "served": render.served_model(svc),
                "generates": render.generates(svc),
                "start_seconds": v.health_timeout,
                "routers": routers,
                "gpus": list(svc.gpus),
            }
        )
    config = {
        "interval": v.watch_interval,
        "stall": v.watch_stall_seconds,
        "max_restarts": v.watch_max_restarts,
        "window": v.watch_restart_window,
        "listen_port": v.watch_port,
        "docker": paths.DOCKER,
        "key_in_container": paths.API_KEY_IN_CONTAINER,
        "series": names.as_json(),
        "state_dir": paths.WATCH_STATE,
        "roll_marker": paths.ROLL_MARKER,
        # How long a roll's marker pauses the watch: one unit's restart and gate, and a margin (a failed roll leaves its
        # marker until the next deploy; past this the watch acts again, and only on a real stall). Like everything here,
        # it follows from inventory-wide settings, not from a serving file's flags, which a rollback puts back alone.
        "roll_pause": v.health_timeout + 600,
        "tune_lock": paths.TUNE_LOCK,
        "quarantine": paths.QUARANTINE,
        "instances": instances,
        # The GPU evidence between deploys: amd-smi's commands and the per-GPU rules are the deploy's (evidence.py), at
        # this host's thresholds and severities.
        "gpu": (
            {
                "interval": v.watch_gpu_interval,
                "amd_smi": "amd-smi",
                "thresholds": dataclasses.asdict(gpuhealth.thresholds(v)),
                "levels": gpuhealth.gpu_levels(v),
            }
            if v.gpu_health
            else None
        ),
    }
    return json.dumps(config, indent=2, sort_keys=True) + "\n"
