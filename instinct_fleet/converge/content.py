"""What the files a host's deploy writes contain, from its plan (spec plus preflight facts).

Each function renders one kind of managed content; :mod:`instinct_fleet.converge.managed`
names where it goes, with which mode, and what a change of it restarts. The
verify module renders through the same functions, so the deploy and the check
cannot disagree about a flag.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from instinct_fleet.converge import gpuhealth, system, templating
from instinct_fleet.converge.hostfacts import HostFacts
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.model import liveness, paths, render, router
from instinct_fleet.model.defaults import FleetVars
from instinct_fleet.model.pools import Pool
from instinct_fleet.model.spec import ClusterSpec, HostSpec, ServiceSpec


@dataclass(frozen=True)
class Container:
    """One container a unit runs: the parts that differ between vLLM and Ray containers."""

    name: str
    image: str
    entrypoint: str
    command: list[str]
    env_path: str
    devices: list[str]
    mounts: list[str] = field(default_factory=list)
    infiniband: bool = False


def vllm_container(
    svc: ServiceSpec,
    devices: list[str],
    drain_timeout: int,
    mounts: list[str] | None = None,
    infiniband: bool = False,
    api_key_path: str | None = None,
) -> Container:
    command = render.serve_command(svc, drain_timeout)
    entrypoint, command, key_mounts = render.with_api_key("vllm", command, api_key_path)
    return Container(
        paths.vllm_unit(svc.name),
        svc.image,
        entrypoint,
        command,
        paths.unit_env_path(paths.vllm_unit(svc.name)),
        devices,
        [*(mounts or []), *key_mounts],
        infiniband,
    )


def docker_run(container: Container, v: FleetVars, group_ids: list[int], with_token: bool) -> list[str]:
    """The full ``docker run`` argv of a container, in a fixed order so that units only change when inputs do."""
    argv = [paths.DOCKER, "run", "--rm", "--name", container.name, "--label", f"instinct-fleet.unit={container.name}"]
    # --ipc host: the host's /dev/shm and IPC namespace, which PyTorch workers and RCCL share (004:290, in 004's docker run);
    # docker ignores --shm-size with it, so none is given.
    argv += ["--network", "host", "--ipc", "host"]
    argv += ["--device", paths.KFD]
    for device in container.devices:
        argv += ["--device", device]
    if container.infiniband:
        argv += ["--device", paths.INFINIBAND, "--cap-add", "IPC_LOCK"]
    for gid in group_ids:
        argv += ["--group-add", str(gid)]
    argv += ["--cap-add", "SYS_PTRACE", "--security-opt", "seccomp=unconfined"]
    ulimit = system.memlock_ulimit(v.tune_memlock)
    if ulimit:
        argv += ["--ulimit", ulimit]
    argv += ["--env-file", container.env_path, "-v", f"{v.hf_cache_dir}:{paths.HF_CACHE_IN_CONTAINER}"]
    if with_token:
        argv += ["-v", f"{v.hf_token_path}:{paths.TOKEN_IN_CONTAINER}:ro"]
    for mount in container.mounts:
        argv += ["-v", mount]
    argv += ["--entrypoint", container.entrypoint, container.image, *container.command]
    return argv


def ray_ready_command(nodes: int, gpus: int, timeout: int) -> list[str]:
    """ExecStartPre of the head's vLLM unit: wait until Ray shows every node and GPU of the cluster."""
    head = paths.ray_unit("head")
    wait = (
        f"end=$(( $(date +%s) + {timeout} )); until {paths.DOCKER} exec {head} true 2>/dev/null; do "
        f"if [ $(date +%s) -ge $end ]; then echo '{head} container not running after {timeout}s' >&2; exit 1; fi; sleep 2; done"
    )
    return ["/bin/sh", "-c", f"{wait}; exec {paths.DOCKER} exec -i {head} python3 - {nodes} {gpus} {timeout} < {paths.RAY_READY_SCRIPT}"]


# `ray start --block` returns only when one of its processes exits with a code it does not expect
# (ray/scripts/scripts.py treats 0 and SIGTERM as expected). A raylet that shuts itself down
# "gracefully" exits 0: when its dashboard agent fails, or when it reached a head whose GCS then
# restarted (WrongClusterID). `ray start` then blocks on with no raylet: systemd sees the node
# running, Ray sees it dead, and the cluster waits forever for a GPU node that never comes back.
# This shell runs `ray start --block` in the background, passes SIGTERM on (the unit's stop), and
# exits 1 when the container has no raylet, so that the unit restarts and joins the current head.
# It reads the container's own /proc (its PID namespace; a zombie raylet counts as gone) with the shell's own read:
# no ps or pgrep needed, and no cat for each of the container's processes at every look.
RAY_NODE_WATCH = (
    "ray \"$@\" & ray=$!; trap 'kill -TERM $ray; wait $ray; exit 0' TERM INT; seen=0; waited=0; "
    "while kill -0 $ray 2>/dev/null; do "
    "sleep {poll} & wait $!; up=0; "
    'for proc in /proc/[0-9]*; do read -r comm 2>/dev/null <"$proc/comm" '
    '&& [ "$comm" = raylet ] && ! grep -q "^State:.*Z" "$proc/status" 2>/dev/null && up=1 && break; done; '
    "if [ $up = 1 ]; then seen=1; else waited=$((waited + {poll})); fi; "
    "if [ $up = 0 ] && {{ [ $seen = 1 ] || [ $waited -ge {grace} ]; }}; then "
    "echo 'instinct-fleet: this node has no raylet, but ray start --block still runs (a raylet that shut itself down "
    "exits 0, which Ray does not count as a failure); stopping it so that systemd restarts the node' >&2; "
    "kill -TERM $ray; wait $ray; exit 1; fi; done; wait $ray"
)


RAY_NODE_POLL = 5  # seconds between two looks for the raylet


RAY_NODE_GRACE = 120  # seconds a starting node may take to show its raylet


def ray_node(command: list[str], poll: int = RAY_NODE_POLL, grace: int = RAY_NODE_GRACE) -> tuple[str, list[str]]:
    """(entrypoint, command) of a Ray node's container: ``ray`` with ``command``, under the watch above."""
    script = RAY_NODE_WATCH.format(poll=poll, grace=grace)
    return "/bin/sh", ["-c", script, "ray", *command]


def ray_start(cluster: ClusterSpec, node_ip: str, head_ip: str, num_gpus: int) -> list[str]:
    """``ray start`` for one node: every port pinned so that the firewall can name them."""
    ports = cluster.ports
    argv = ["start", "--block"]
    if cluster.role == "head":
        # client_server stays at Ray's default; passing it makes Ray demand the ray[client] extra.
        argv += ["--head", f"--port={ports['gcs']}", "--include-dashboard=false"]
    else:
        argv += [f"--address={head_ip}:{ports['gcs']}"]
    return [
        *argv,
        f"--node-ip-address={node_ip}",
        f"--num-gpus={num_gpus}",
        f"--object-manager-port={ports['object_manager']}",
        f"--node-manager-port={ports['node_manager']}",
        f"--min-worker-port={ports['min_worker']}",
        f"--max-worker-port={ports['max_worker']}",
        f"--dashboard-agent-listen-port={ports['dashboard_agent_listen']}",
        f"--dashboard-agent-grpc-port={ports['dashboard_agent_grpc']}",
        f"--metrics-export-port={ports['metrics_export']}",
        f"--runtime-env-agent-port={ports['runtime_env_agent']}",
        "--disable-usage-stats",
    ]


BASE_PACKAGES = {"curl": "curl"}  # command -> Debian package; curl runs the health checks
CPUPOWER_PACKAGES = {"debian": ("linux-cpupower",), "ubuntu": ("linux-tools-common", "linux-tools-generic")}


def env_text(plan: HostFacts, svc: ServiceSpec) -> str:
    return render.env_file(plan.env(svc), plan.has_token)


def vllm_argv(plan: HostFacts, svc: ServiceSpec) -> list[str]:
    cluster, v = plan.spec.cluster, plan.spec.vars
    cache = plan.spec.compile_cache(svc)
    mounts = [f"{paths.RAY_TMP}:{paths.RAY_TMP_IN_CONTAINER}"] if plan.role == "head" else []
    mounts.append(f"{cache}:{cache}")
    container = vllm_container(
        svc,
        plan.devices(svc),
        v.rolling_drain_timeout,
        mounts,
        infiniband=cluster is not None and cluster.infiniband,
        api_key_path=v.vllm_api_key_path,
    )
    return docker_run(container, v, plan.group_ids, plan.has_token)


def ray_argv(plan: HostFacts) -> list[str]:
    cluster = plan.spec.cluster
    assert cluster is not None and plan.cluster is not None
    svc = plan.spec.services[0]
    cache = plan.spec.compile_cache(svc)
    # --num-gpus from amd-smi; preflight has checked it equals gpu_count on every member.
    entrypoint, command = ray_node(ray_start(cluster, plan.cluster.node_ip, plan.cluster.head_ip, len(plan.report.gpus)))
    container = Container(
        name=paths.ray_unit(cluster.role),
        image=svc.image,
        entrypoint=entrypoint,
        command=command,
        env_path=paths.RAY_ENV,
        devices=plan.devices(svc),
        mounts=[f"{paths.RAY_TMP}:{paths.RAY_TMP_IN_CONTAINER}", f"{cache}:{cache}"],
        infiniband=cluster.infiniband,
    )
    return docker_run(container, plan.spec.vars, plan.group_ids, plan.has_token)


def unit_vars(plan: HostFacts, svc: ServiceSpec) -> dict[str, Any]:
    """Everything templates/vllm.service.j2 reads."""
    cluster = plan.spec.cluster
    ready = None
    if cluster is not None and plan.role == "head":
        nodes, gpus = svc.nodes, svc.nodes * plan.spec.gpu_count
        ready = render.exec_line(ray_ready_command(nodes, gpus, cluster.ready_timeout))
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
        paths.vllm_unit(svc.name): (templating.template("vllm.service.j2", **unit_vars(plan, svc)), env_text(plan, svc))
        for svc in plan.serves
    }
    if plan.role is not None:
        ray = templating.template("ray.service.j2", **ray_unit_vars(plan))
        units[paths.ray_unit(plan.role)] = (ray, env_text(plan, plan.spec.services[0]))
    return {unit: units[unit] for unit in plan.spec.serving_units}  # in start order


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
    """One pool's router unit: the front on the clients' port, which starts the launcher with the release's files, the
    pool's worker file and the router's options (the router on the pool's admin port)."""
    v = spec.vars
    front = [paths.PYTHON3, paths.ROUTER_FRONT, str(pool.port), str(pool.admin_port), "--"]
    argv = [*front, paths.PYTHON3, paths.ROUTER_LAUNCHER, paths.router_dir(v.router_version), paths.router_workers(pool.port)]
    return templating.template(
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
