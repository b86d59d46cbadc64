"""Render a typed service into what runs: the env file lines and the ``vllm serve`` argv.

Both the CLI's JSON and the deploy's templates call these functions, so what
``instinct-fleet plan`` prints is exactly what the unit runs.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from instinct_fleet.model import knowledge, paths
from instinct_fleet.model.defaults import FleetVars
from instinct_fleet.model.paths import KERNEL_ARGS
from instinct_fleet.model.recipes import ArgValue
from instinct_fleet.model.spec import ClusterSpec, ServiceSpec
from instinct_fleet.model.startup import TRUE


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


def repo_dir(cache: str, model: str) -> str:
    """Where a Hugging Face cache rooted at ``cache`` keeps ``model`` (huggingface_hub's layout)."""
    return f"{cache}/hub/models--{model.replace('/', '--')}"


def revision(svc: ServiceSpec) -> str:
    """The model revision the instance loads: its ``--revision``, else the hub's default branch."""
    value = svc.args.get("revision")
    return str(value) if isinstance(value, str) and value.strip() else "main"


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


def generates(svc: ServiceSpec) -> bool:
    """Whether the instance generates text: a pooling model (``--runner pooling``, ``--convert embed|classify``)
    has no completions route, so the health gate stops at /v1/models for it."""
    return svc.args.get("runner") != "pooling" and svc.args.get("convert") not in ("embed", "classify")


def served_model(svc: ServiceSpec) -> str:
    """The name /v1/models lists: --served-model-name when set, else the model."""
    name = svc.args.get("served-model-name")
    return str(name).split()[0] if isinstance(name, str) and name.strip() else svc.model


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


def memlock_limit(setting: bool | int) -> int | None:
    """``tune_memlock`` in bytes, -1 for unlimited, None when left alone; docker, daemon.json and systemd all derive from it."""
    if setting is False:
        return None
    return -1 if setting is True else int(setting)


def memlock_ulimit(setting: bool | int) -> str | None:
    """``docker --ulimit`` value for ``tune_memlock``."""
    limit = memlock_limit(setting)
    return None if limit is None else f"memlock={limit}:{limit}"


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


def drain_args(svc: ServiceSpec, drain_timeout: int) -> list[str]:
    """``--shutdown-timeout`` where the pinned vLLM has it and the instance does not set it: SIGTERM then drains."""
    if "shutdown-timeout" in svc.args or not has_flag(svc, "shutdown-timeout"):
        return []
    return ["--shutdown-timeout", str(drain_timeout)]


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


def vllm_container(
    svc: ServiceSpec,
    devices: list[str],
    drain_timeout: int,
    mounts: list[str] | None = None,
    infiniband: bool = False,
    api_key_path: str | None = None,
) -> Container:
    command = ["serve", svc.model, *render_args(svc), *drain_args(svc, drain_timeout)]
    entrypoint, command, key_mounts = with_api_key("vllm", command, api_key_path)
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
    ulimit = memlock_ulimit(v.tune_memlock)
    if ulimit:
        argv += ["--ulimit", ulimit]
    argv += ["--env-file", container.env_path, "-v", f"{v.hf_cache_dir}:{paths.HF_CACHE_IN_CONTAINER}"]
    if with_token:
        argv += ["-v", f"{v.hf_token_path}:{paths.TOKEN_IN_CONTAINER}:ro"]
    for mount in container.mounts:
        argv += ["-v", mount]
    argv += ["--entrypoint", container.entrypoint, container.image, *container.command]
    return argv


# The templates are package data (instinct_fleet/templates), read through importlib.resources as pyinfra's
# packaged deploys read theirs: an installed wheel renders exactly what a checkout does.
TEMPLATES = ("instinct_fleet", "templates")


@cache
def _templates() -> Environment:
    # The settings pyinfra's files.template uses, so a rendered file is byte for byte what pyinfra would write.
    return Environment(undefined=StrictUndefined, keep_trailing_newline=True, loader=PackageLoader(*TEMPLATES))


def template(name: str, **values: Any) -> str:
    """A file from ``templates/``, rendered: the deploy writes it, the verify module and the roll compare it."""
    return _templates().get_template(name).render(**values)


def cpu_idle_unit() -> str:
    return template("cpu-idle.service.j2", cpupower=paths.CPUPOWER)


def firewall_unit() -> str:
    return template("firewall.service.j2", nft=paths.NFT, ruleset=paths.FIREWALL_FILE, table=paths.FIREWALL_TABLE)


def watch_unit(port: int) -> str:
    return template(
        "watch.service.j2", python=paths.PYTHON3, script=paths.WATCH_SCRIPT, config=paths.WATCH_CONFIG, state=paths.WATCH_STATE, port=port
    )


def watch_module(package: str, name: str) -> bytes:
    """A module of the package as it holds it (the progress rule, the GPU evidence): the watch imports this very file on
    the host, so each must use the standard library alone (test_watch)."""
    return resources.files(package).joinpath(name).read_bytes()


def template_bytes(name: str) -> bytes:
    """A file from ``templates/`` copied as it is (the Ray readiness script)."""
    return resources.files(TEMPLATES[0]).joinpath(TEMPLATES[1], name).read_bytes()


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
# It reads the container's own /proc (its PID namespace; a zombie raylet counts as gone): no ps or pgrep needed.
RAY_NODE_WATCH = (
    "ray \"$@\" & ray=$!; trap 'kill -TERM $ray; wait $ray; exit 0' TERM INT; seen=0; waited=0; "
    "while kill -0 $ray 2>/dev/null; do "
    "sleep {poll} & wait $!; up=0; "
    'for proc in /proc/[0-9]*; do [ "$(cat "$proc/comm" 2>/dev/null)" = raylet ] && ! grep -q "^State:.*Z" "$proc/status" 2>/dev/null '
    "&& up=1 && break; done; "
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


def ray_ports(cluster: ClusterSpec) -> list[str]:
    """Ray's ports as nftables set elements: single ports and the worker range."""
    single = sorted({p for k, p in cluster.ports.items() if k not in ("min_worker", "max_worker")})
    return [*map(str, single), f"{cluster.ports['min_worker']}-{cluster.ports['max_worker']}"]


def _address_sets(name: str, networks: tuple[str, ...]) -> list[str]:
    """Two nftables sets, ``<name>_v4`` and ``<name>_v6``, of these addresses and networks.

    Overlapping entries are merged first (10.20.5.17 inside 10.20.0.0/16): ``nft -f``
    refuses an interval set whose elements overlap ("conflicting intervals").
    """
    nets = [ipaddress.ip_network(a, strict=False) for a in networks]
    lines = []
    for family, version in (("ipv4_addr", 4), ("ipv6_addr", 6)):
        same = [n for n in nets if n.version == version]
        chosen = [str(n) for n in ipaddress.collapse_addresses(same)]  # type: ignore[type-var]
        lines += [f"    set {name}_v{version} {{", f"        type {family}", "        flags interval"]
        lines += [f"        elements = {{ {', '.join(chosen)} }}"] if chosen else []
        lines += ["    }"]
    return lines


def firewall_ruleset(
    members: list[str],
    ray: list[str],
    vllm_ports: list[int],
    allow_from: tuple[str, ...] | None,
    scrapers: tuple[str, ...] | None = None,
    exporter_port: int | None = None,
    router_ports: tuple[list[int], list[int]] = ([], []),
    router_allowed: tuple[str, ...] | None = None,
) -> str:
    """The table ``inet instinct_fleet``, replaced atomically by ``nft -f`` and kept beside Docker's tables.

    Ray has no authentication and its ports run code, so they accept only cluster
    members; vLLM ports accept only loopback, members and ``vllm_allow_from``.
    ``prometheus_allow_from`` (``scrapers``) may reach the vLLM ports (their
    ``/metrics``) and the exporter's port, which then accepts nobody else.
    ``router_ports`` (client and worker-API ports, metrics ports) accept only
    ``router_allowed`` (``router_allow_from`` and the serving hosts, whose roll calls
    the worker API); the metrics ports accept the scrapers too.
    """
    lines = [
        "# Managed by instinct-fleet: loaded by instinct-fleet-firewall.service.",
        f"table {paths.FIREWALL_TABLE}",
        f"flush table {paths.FIREWALL_TABLE}",
        f"table {paths.FIREWALL_TABLE} {{",
    ]
    v4 = [m for m in members if ipaddress.ip_address(m).version == 4]
    lines += [
        "    set cluster_members {",
        "        type ipv4_addr",
        *([f"        elements = {{ {', '.join(v4)} }}"] if v4 else []),
        "    }",
    ]
    if allow_from is not None:
        lines += _address_sets("vllm_allowed", allow_from)
    if scrapers is not None:
        lines += _address_sets("scrapers", scrapers)
    routed = router_allowed is not None and bool(router_ports[0])
    if routed:
        lines += _address_sets("router_allowed", router_allowed or ())
    lines += ["    chain input {", "        type filter hook input priority filter - 10; policy accept;", '        iif "lo" accept']
    lines += ["        ip saddr @cluster_members accept"]
    if ray:
        lines += [f'        tcp dport {{ {", ".join(ray)} }} counter drop comment "Ray: cluster members only"']
    if scrapers is not None:
        scraped = ", ".join(map(str, sorted({*vllm_ports, *([exporter_port] if exporter_port else [])})))
        if scraped:
            lines += [
                f"        tcp dport {{ {scraped} }} ip saddr @scrapers_v4 accept",
                f"        tcp dport {{ {scraped} }} ip6 saddr @scrapers_v6 accept",
            ]
        if exporter_port:
            lines += [f'        tcp dport {exporter_port} counter drop comment "metrics exporter: prometheus_allow_from only"']
    if allow_from is not None and vllm_ports:
        ports = ", ".join(map(str, sorted(vllm_ports)))
        lines += [
            f"        tcp dport {{ {ports} }} ip saddr @vllm_allowed_v4 accept",
            f"        tcp dport {{ {ports} }} ip6 saddr @vllm_allowed_v6 accept",
            f'        tcp dport {{ {ports} }} counter drop comment "vLLM: vllm_allow_from only"',
        ]
    if routed:
        clients, metrics = router_ports
        every = ", ".join(map(str, sorted({*clients, *metrics})))
        if scrapers is not None and metrics:
            scraped = ", ".join(map(str, sorted(metrics)))
            lines += [
                f"        tcp dport {{ {scraped} }} ip saddr @scrapers_v4 accept",
                f"        tcp dport {{ {scraped} }} ip6 saddr @scrapers_v6 accept",
            ]
        lines += [
            f"        tcp dport {{ {every} }} ip saddr @router_allowed_v4 accept",
            f"        tcp dport {{ {every} }} ip6 saddr @router_allowed_v6 accept",
            f'        tcp dport {{ {every} }} counter drop comment "router: router_allow_from and the serving hosts only"',
        ]
    lines += ["    }", "}"]
    return "\n".join(lines) + "\n"


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
