"""Where instinct-fleet writes on a host: the paths the deploy, the preflight fact and the verify module share."""

from __future__ import annotations

import hashlib
import re

CONFIG_DIR = "/etc/instinct-fleet"
HOST_README = f"{CONFIG_DIR}/README"  # what an operator on the host reads: the units and files this tool manages
SYSTEMD_DIR = "/etc/systemd/system"
DAEMON_JSON = "/etc/docker/daemon.json"
DOCKER_DROP_IN = f"{SYSTEMD_DIR}/docker.service.d/90-instinct-fleet.conf"

# What the deploy writes on a host and the names it gives: every module reads them from here.
DOCKER = "/usr/bin/docker"
DOCKER_SOCKET = "/var/run/docker.sock"  # dockerd's API: the preflight fact asks it with curl
SYSCTL_FILE = "/etc/sysctl.d/90-instinct-fleet.conf"
GRUB_DROP_IN = "/etc/default/grub.d/90-instinct-fleet.cfg"
# What tune_kernel_cmdline adds to the kernel command line (docs/what-the-deploy-does.md).
KERNEL_ARGS = ("iommu=pt", "pci=realloc=off")
CPU_IDLE_UNIT = "instinct-fleet-cpu-idle"
RUN_DIR = "/run/instinct-fleet"
REBOOT_MARKER = f"{RUN_DIR}/reboot-required"
RAY_ENV = f"{CONFIG_DIR}/ray.env"
RAY_READY_SCRIPT = f"{CONFIG_DIR}/ray-ready.py"
CACHE_PREPARE = f"{CONFIG_DIR}/cache-prepare.sh"  # a serving unit's ExecStartPre for its image's compile cache
CACHE_SPREAD = f"{CONFIG_DIR}/cache-spread.sh"  # packs a compile cache on the host that built it, checks and merges a copy
RAY_TMP = "/var/lib/instinct-fleet/ray"  # shared /tmp/ray: the vLLM driver joins the head's Ray node through it
FIREWALL_FILE = f"{CONFIG_DIR}/firewall.nft"
FIREWALL_UNIT = "instinct-fleet-firewall"
FIREWALL_TABLE = "inet instinct_fleet"  # the nftables table the firewall owns, beside Docker's
NFT = "/usr/sbin/nft"
NUMA_BALANCING = "kernel.numa_balancing"
# Present while a host's roll batch runs (or after it failed): `instinct-fleet bench` refuses such a host.
ROLL_MARKER = f"{RUN_DIR}/roll-in-progress"
# A tune trial, and the restore after it, flock RUN_DIR itself while they write the instance's files and restart it
# (a lock file would be left behind).
TUNE_LOCK = RUN_DIR
EXPORTER_UNIT = "amd-metrics-exporter"
EXPORTER_DIR = f"{CONFIG_DIR}/metrics-exporter"
EXPORTER_CONFIG = f"{EXPORTER_DIR}/config.json"
CA_DIR = "/etc/docker/certs.d"
DOCKER_UNIT = "docker"
CREDENTIALS = "/root/.docker/config.json"
BENCH_ROOT = "/var/lib/instinct-fleet/bench"
DATASETS_DIR = "/var/lib/instinct-fleet/datasets"
# A host's generations: the serving files it ran, one numbered directory each, and which one last
# passed the health gate (instinct_fleet/converge/generations.py).
GENERATIONS_DIR = "/var/lib/instinct-fleet/generations"

SERVICE_USER_SHELL = "/usr/sbin/nologin"
DEVICE_GROUPS = ("render", "video")  # own /dev/kfd and /dev/dri; the service user and the containers join them
CPUPOWER = "/usr/bin/cpupower"
KFD = "/dev/kfd"
DRI = "/dev/dri"  # render nodes: /dev/dri/renderD*
INFINIBAND = "/dev/infiniband"

ROUTER_CONFIG = f"{CONFIG_DIR}/router"  # the launcher, the pool-sync script and one worker list per pool
ROUTER_LAUNCHER = f"{ROUTER_CONFIG}/launch.py"
ROUTER_FRONT = f"{ROUTER_CONFIG}/front.py"  # clients' port: the OpenAI routes alone, the worker API never
ROUTER_SYNC = f"{ROUTER_CONFIG}/sync.py"
PYTHON3 = "/usr/bin/python3"

# The watch of a serving host (templates/watch.py): its script, the progress rule it imports, its config, its unit, and
# where it keeps which instance it holds out and when it restarted them.
WATCH_DIR = f"{CONFIG_DIR}/watch"
WATCH_SCRIPT = f"{WATCH_DIR}/watch.py"
WATCH_RULE = f"{WATCH_DIR}/liveness.py"
WATCH_EVIDENCE = f"{WATCH_DIR}/evidence.py"
WATCH_CONFIG = f"{WATCH_DIR}/watch.json"
WATCH_UNIT = "instinct-fleet-watch"
WATCH_STATE = "/var/lib/instinct-fleet/watch"
# The GPU health quarantine of a host (converge/gpuhealth.py): the units held out and why; absent when none is.
QUARANTINE = "/var/lib/instinct-fleet/quarantine.json"


def watch_out(unit: str) -> str:
    """Present while the watch holds ``unit`` (with or without ``.service``) out of its router pools (restarting it, left
    out, or quarantined on its GPU's evidence)."""
    return f"{WATCH_STATE}/{unit.removesuffix('.service')}.out"


def watch_restarts(unit: str) -> str:
    """The times of the watch's restarts of ``unit``, which its restart budget counts."""
    return f"{WATCH_STATE}/{unit.removesuffix('.service')}.restarts"


def router_dir(version: str) -> str:
    """Where a vllm-router release's files live on a router host (one directory per version)."""
    return f"/opt/instinct-fleet/vllm-router-{version}"


def router_unit(port: int) -> str:
    """The unit of the router that serves one pool on ``port``."""
    return f"instinct-fleet-router-{port}"


def router_workers(port: int) -> str:
    """The pool's worker list the router unit starts with and the sync script converges it to."""
    return f"{ROUTER_CONFIG}/{port}.workers"


def router_watches(port: int) -> str:
    """The pool's worker URL -> its host's watch /state URL: the sync script adds no worker its watch holds out."""
    return f"{ROUTER_CONFIG}/{port}.watch"


def host_port(address: str, port: int) -> str:
    """``address:port`` as a URL authority: an IPv6 address in brackets, which Prometheus and HTTP clients require."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


# Unit names carry no ".service"; systemd and pyinfra get service(name).


def service(unit: str) -> str:
    return f"{unit}.service"


def unit_path(unit: str) -> str:
    """Where a unit file instinct-fleet writes lives; ``unit`` with or without ``.service``."""
    return f"{SYSTEMD_DIR}/{unit.removesuffix('.service')}.service"


def vllm_unit(instance: str) -> str:
    """The unit (and container) of one vLLM instance."""
    return f"vllm-{instance}"


def ray_unit(role: str) -> str:
    """``ray-head`` or ``ray-worker``: the unit and its container share the name."""
    return f"ray-{role}"


def unit_env_path(unit: str) -> str:
    """The env file of a vLLM or Ray unit this tool writes (a stale one included); both Ray roles use ray.env."""
    return RAY_ENV if unit.startswith("ray-") else f"{CONFIG_DIR}/{unit}.env"


def sysctl_path(key: str) -> str:
    """Where the kernel shows a setting's live value: ``kernel.numa_balancing`` is /proc/sys/kernel/numa_balancing."""
    return f"/proc/sys/{key.replace('.', '/')}"


def ca_path(registry: str) -> str:
    return f"{CA_DIR}/{registry}/ca.crt"


# Inside the containers.
TOKEN_IN_CONTAINER = "/run/secrets/hf-token"
API_KEY_IN_CONTAINER = "/run/secrets/vllm-api-key"
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
RESULTS_IN_CONTAINER = "/results"
RAY_TMP_IN_CONTAINER = "/tmp/ray"
EXPORTER_CONFIG_IN_CONTAINER = "/etc/metrics"

# Weight staging: written after a complete download into weights_source ("<revision> <commit>"),
# and after a complete copy into hf_cache_dir (the same line), so that a cut copy never counts.
WEIGHTS_COMPLETE = ".instinct-fleet-complete"
WEIGHTS_STAGED = ".instinct-fleet-staged"

# Files whose change restarts a serving unit; the preflight fact hashes them (roll.py).
# Every vLLM and Ray unit this tool may have written, stale ones included.
UNIT_PATTERNS = ("vllm-*.service", "ray-*.service")
UNIT_GLOBS = tuple(f"{SYSTEMD_DIR}/{pattern}" for pattern in UNIT_PATTERNS)
# The serving files: what a generation keeps and a rollback puts back.
SERVING_FILES = (*UNIT_GLOBS, f"{CONFIG_DIR}/*.env")
RESTART_FILES = (
    *SERVING_FILES,
    DAEMON_JSON,
    DOCKER_DROP_IN,
)
# Every router unit and worker list this tool may have written: one of a pool no longer here is removed.
ROUTER_PATTERN = "instinct-fleet-router-*.service"
ROUTER_GLOBS = (f"{SYSTEMD_DIR}/{ROUTER_PATTERN}", f"{CONFIG_DIR}/router/*.workers", f"{CONFIG_DIR}/router/*.watch")
# What the preflight fact hashes and stats besides the declared paths; and the unit patterns it lists.
PROBED_GLOBS = (*RESTART_FILES, *ROUTER_GLOBS)
PROBED_PATTERNS = (*UNIT_PATTERNS, ROUTER_PATTERN)


def spread_bundle(cache: str, digest: str) -> str:
    """Where a packed copy of the compile cache ``cache`` waits on a host, beside the caches (one filesystem, so that
    its entries move into place by rename); ``digest`` names one copy. A dot directory: no image's cache."""
    root, _, name = cache.rpartition("/")
    return f"{root}/.spread/{name}-{digest}.tar"


def compile_cache(root: str, image: str) -> str:
    """An image's compile-cache directory under ``root``: the same path on every host that runs the image.

    Named by the image reference (readable, with a hash so that two references never share a name); the image id
    it was built with is recorded inside (IMAGE_ID, by templates/cache-prepare.sh), and a start on another id empties it first.
    """
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", image.rsplit("/", 1)[-1])[:48]
    return f"{root}/{readable}_{hashlib.sha256(image.encode()).hexdigest()[:12]}"
