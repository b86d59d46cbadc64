"""The simulated MI300X fleet the end-to-end tests and ``make demo`` deploy onto.

Nothing here is product code. It builds, on one machine with only the Debian
mirror and PyPI in reach:

* a base image from ``debootstrap`` (the mirror is read from this machine's apt
  sources), imported with ``docker import``;
* a simulated host image on top of it: systemd as PID 1, sshd, Debian's docker.io;
* the stand-in vLLM image (``tests/fleet/standin/vllm``), pushed to a local
  Debian ``docker-registry`` bound to the docker bridge's gateway;
* hosts started with the flags a systemd container needs. GPU hosts get the
  stand-in ``amd-smi`` (real captured MI300X output), stand-in /dev/kfd and
  /dev/dri nodes (the numbers of /dev/null and /dev/zero, which the container's
  device cgroup already allows), /dev/dri/by-path links for the captured PCI
  addresses and a stand-in /sys/module/amdgpu.

``up`` writes ``.fleet/fleet.json``, which ``inventories/local.py`` reads.
Usage: ``python3 tests/fleet/fleet.py images|up|down|sample`` (``images`` builds what ``up`` would,
and starts no host); the end-to-end tests also use
``revive HOST``, ``registry stop|start`` and ``tag NEW_TAG`` to inject and remove faults.

``INSTINCT_FLEET_SLOT=N`` (N ≥ 1) makes another fleet beside the first, on the same dockerd
and images: its state in ``.fleet/slotN/``, its own registries, its SSH ports 1000·N higher,
its host containers named ``<host>-fN`` (each still calls itself ``<host>``). ``make test``
runs the end-to-end modules on two such fleets at once: one fleet leaves the CPU idle for
much of a run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / ".fleet"  # what every slot shares: dockerd's log, the Ray wheels, the lock for image builds


def slot() -> int:
    value = os.environ.get("INSTINCT_FLEET_SLOT", "0")
    if not value.isdigit() or int(value) > 9:
        sys.exit(f"fleet: INSTINCT_FLEET_SLOT={value!r}: give a number from 0 to 9")
    return int(value)


SLOT = slot()
STATE = SHARED if SLOT == 0 else SHARED / f"slot{SLOT}"
PORT_OFFSET = 1000 * SLOT  # of the ports published on the machine's loopback (a host's own API port is the same in every slot)
HERE = Path(__file__).resolve().parent
FIXTURES = ROOT / "tests" / "fixtures"
STATIC_JSON = FIXTURES / "amd-smi-static-json_mi300x-x8_rocm7.2.1_amdsmi26.2.2.json"
VERSION_JSON = FIXTURES / "amd-smi-version-json_rocm7.2.1_amdsmi26.2.2.json"

WEIGHTS = STATE / "weights"  # the fleet's shared model store
WEIGHTS_MOUNT = "/mnt/fleet-weights"
BASE_IMAGE = "instinct-fleet-test/base:bookworm-2"
HOST_IMAGE = "instinct-fleet-test/host:bookworm-4"
STANDIN_REPO = "instinct-fleet-standin/vllm-openai-rocm"
STANDIN_VERSION = "0.22.0"
RAY_VERSION = "2.52.1"  # the stand-in's Ray; a real vLLM image brings its own
REGISTRY_PORT = 5000 + 10 * SLOT  # and the pull-through cache on the next port
SEED_PORT = 4990  # the registry that fills the seed storage every slot's registry copies (seed_registry), for a moment
# The machine's dockerd is Debian's docker.io, driven by Debian's own CLI: another docker
# CLI may come first on PATH (a newer one defaults to buildx, which Debian does not ship).
DOCKER = "/usr/bin/docker"
DOCKERD = "/usr/sbin/dockerd"
# The bridge is given explicitly: dockerd 20.10 started without --bip leaves the gateway out of
# `docker network inspect`, so the fleet reads the address from the interface, never from that field.
BRIDGE = "docker0"
BRIDGE_CIDR = "172.17.0.1/16"
LABEL_KEY = "instinct-fleet-test"
LABEL = f"{LABEL_KEY}={SLOT + 1}"  # slot 0 keeps the label fleets had before slots
# A fake token the tests look for everywhere it must not appear.
HF_TOKEN = "hf_standinTOKENdoNotLeak" + "0123456789abcdef"
API_KEY = "sk-standinAPIKEYdoNotLeak" + "fedcba9876543210"  # at /etc/instinct-fleet/api-key; inventories/local.py gives it to sim-gpu-2

HOST_FLAGS = [
    "--cap-add",
    "SYS_ADMIN",
    "--cap-add",
    "NET_ADMIN",
    # The vLLM container asks for SYS_PTRACE (seed 004's docker run); a nested
    # container can only get capabilities its parent has.
    "--cap-add",
    "SYS_PTRACE",
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
    "--security-opt",
    "systempaths=unconfined",
    "--cgroupns=host",
    "-v",
    "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs",
    "/run",
    "--tmpfs",
    "/run/lock",
    # Room for Ray's object store in /dev/shm (the vLLM and Ray containers use --ipc host).
    "--shm-size",
    "1g",
    # The host's dockerd keeps its images on a volume (the machine's ext4), not in the container's
    # overlay: there it can use overlay2, sharing layers and creating containers copy-on-write,
    # where it would fall back to vfs, a full copy of the tree per layer and per container.
    "-v",
    "/var/lib/docker",
]


@dataclass(frozen=True)
class SimHost:
    name: str
    gpus: bool
    ssh_port: int
    api_port: int
    address: str = ""
    cluster: str | None = None  # light fleets (up --hosts N): the Ray cluster and role this host is built for
    role: str | None = None
    container: str = ""  # the machine's name for it: the host's name, with -fN in slot N

    def __post_init__(self) -> None:
        if not self.container:
            object.__setattr__(self, "container", self.name if SLOT == 0 else f"{self.name}-f{SLOT}")


HOSTS = (
    SimHost("sim-gpu-1", True, 2201 + PORT_OFFSET, 18001),
    SimHost("sim-gpu-2", True, 2202 + PORT_OFFSET, 18002),
    SimHost("sim-nogpu", False, 2203 + PORT_OFFSET, 18003),
    SimHost("sim-c1", True, 2204 + PORT_OFFSET, 18004),
    SimHost("sim-c2", True, 2205 + PORT_OFFSET, 18005),
)


CLUSTER_EVERY = 16  # a light fleet has one two-node Ray cluster per 16 hosts


def light_hosts(count: int, clusters: int | None = None) -> tuple[SimHost, ...]:
    """``count`` simulated GPU hosts for scale runs: single-node hosts, and ``clusters`` two-node clusters among them
    (by default one per 16 hosts)."""
    hosts = []
    clusters = count // CLUSTER_EVERY if clusters is None else clusters
    if not 0 <= 2 * clusters <= count:
        sys.exit(f"fleet: {clusters} two-node clusters do not fit in {count} hosts")
    for i in range(count):
        name = f"sim-s{i + 1:02d}"
        cluster = role = None
        if i < 2 * clusters:
            cluster, role = f"sim-scale-{i // 2 + 1}", "head" if i % 2 == 0 else "worker"
        hosts.append(SimHost(name, True, 2301 + i + PORT_OFFSET, 18101 + i, cluster=cluster, role=role))
    return tuple(hosts)


def log(message: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(*argv: str, check: bool = True, capture: bool = False, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    done = subprocess.run(list(argv), capture_output=capture, input=stdin)
    if check and done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip() if capture else ""
        sys.exit(f"fleet: {' '.join(argv[:3])} ... failed ({done.returncode}): {detail}")
    return done


def out(*argv: str) -> str:
    return run(*argv, capture=True).stdout.decode().strip()


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources)."""
    sources = [*Path("/etc/apt/sources.list.d").glob("*.sources"), *Path("/etc/apt/sources.list.d").glob("*.list")]
    sources.append(Path("/etc/apt/sources.list"))
    for path in sources:
        if not path.is_file():
            continue
        text = path.read_text()
        for match in re.finditer(r"^URIs:\s*(\S+)", text, re.M):
            if not match.group(1).rstrip("/").endswith("-security"):
                return match.group(1)
        for match in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.M):
            if not match.group(1).rstrip("/").endswith("-security"):
                return match.group(1)
    sys.exit("fleet: no Debian mirror found in /etc/apt/sources.list(.d)")


def docker_ok() -> bool:
    if not os.access(DOCKER, os.X_OK):
        return False
    return run(DOCKER, "info", check=False, capture=True).returncode == 0


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of a network interface, read from the kernel (SIOCGIFADDR); None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def gateway() -> str:
    """The docker bridge's address, which the hosts reach the machine (and its registry) on."""
    address = interface_ipv4(BRIDGE)
    if address is None:
        sys.exit(f"fleet: the docker bridge {BRIDGE} has no IPv4 address; is dockerd running?")
    return address


def ensure_dockerd() -> None:
    """Start Debian's dockerd with an explicit bridge, trusting the local registry on its gateway."""
    for tool in (DOCKER, DOCKERD):
        if not os.access(tool, os.X_OK):
            sys.exit(f"fleet: {tool} is missing: apt-get install docker.io (make fleet-deps does)")
    if docker_ok():
        address = gateway()
        if address != BRIDGE_CIDR.split("/")[0]:
            log(f"note: a dockerd already runs with its bridge on {address}; its registry must be trusted there")
        return
    log("starting dockerd")
    logfile = (SHARED / "dockerd.log").open("ab")
    subprocess.Popen(
        # Every slot's registry is on the bridge's gateway, each on its own port: trust the bridge.
        [DOCKERD, "--bip", BRIDGE_CIDR, "--insecure-registry", str(ipaddress.ip_network(BRIDGE_CIDR, strict=False))],
        stdout=logfile,
        stderr=logfile,
        start_new_session=True,
    )
    for _ in range(60):
        if docker_ok():
            break
        time.sleep(1)
    else:
        sys.exit(f"fleet: dockerd did not start; see {SHARED / 'dockerd.log'}")
    if gateway() != BRIDGE_CIDR.split("/")[0]:
        sys.exit(f"fleet: the docker bridge {BRIDGE} is on {gateway()}, not {BRIDGE_CIDR}; the registry would be untrusted")


def check_trusted(registry: str) -> None:
    """A dockerd this fleet did not start must trust the slot's registry, or every push fails over HTTPS."""
    config = json.loads(out(DOCKER, "info", "-f", "{{json .RegistryConfig}}"))
    host = ipaddress.ip_address(registry.split(":")[0])
    cidrs = [ipaddress.ip_network(c) for c in config.get("InsecureRegistryCIDRs") or []]
    named = {name for name, index in (config.get("IndexConfigs") or {}).items() if not index.get("Secure", True)}
    if registry not in named and not any(host in cidr for cidr in cidrs):
        sys.exit(
            f"fleet: the running dockerd does not trust the registry {registry} (slot {SLOT}). Stop that dockerd "
            f"(pkill dockerd), and `up` starts one that trusts {BRIDGE_CIDR}, every slot's registry."
        )


@contextlib.contextmanager
def images_lock() -> Iterator[None]:
    """One slot at a time starts dockerd and builds the shared images (a concurrent `docker build` of one tag races)."""
    SHARED.mkdir(exist_ok=True)
    with (SHARED / "images.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def image_exists(ref: str) -> bool:
    return run(DOCKER, "image", "inspect", ref, check=False, capture=True).returncode == 0


def build_base() -> None:
    if image_exists(BASE_IMAGE):
        return
    mirror = apt_mirror()
    log(f"debootstrap bookworm from {mirror}")
    with tempfile.TemporaryDirectory(dir=SHARED) as tmp:
        rootfs = Path(tmp) / "rootfs"
        run("debootstrap", "--variant=minbase", "--include=python3,ca-certificates", "bookworm", str(rootfs), mirror)
        # What no image built on it reads (the host image runs its own apt-get update): 45% of the base,
        # which every simulated host would otherwise pull and unpack with each stand-in image.
        for unread in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
            shutil.rmtree(rootfs / unread)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run([DOCKER, "import", "-", BASE_IMAGE], stdin=tar.stdout, check=True)
        tar.wait()


def build_host() -> None:
    if image_exists(HOST_IMAGE):
        return
    log("building the simulated host image")
    run(DOCKER, "build", "-q", "-t", HOST_IMAGE, "--build-arg", f"BASE={BASE_IMAGE}", "-f", str(HERE / "host.Dockerfile"), str(HERE))


def ray_packages() -> Path:
    """Ray and its dependencies for the image's Python (3.11, manylinux), installed on this machine."""
    target = SHARED / f"ray-{RAY_VERSION}"
    if not (target / "ray").is_dir():
        log(f"downloading Ray {RAY_VERSION} wheels")
        shutil.rmtree(target, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), "--only-binary=:all:"]
        run(*pip, "--python-version", "3.11", "--platform", "manylinux2014_x86_64", f"ray=={RAY_VERSION}")
        shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts name this machine's Python
        # Libraries ray start and placement groups never import: a third less to push and pull.
        for unused in ("jars", "rllib", "tune", "train", "data", "serve"):
            shutil.rmtree(target / "ray" / unused, ignore_errors=True)
    return target


def standin_ref(registry: str) -> str:
    return f"{registry}/{STANDIN_REPO}:v{STANDIN_VERSION}"


def slim_ref(registry: str) -> str:
    """The stand-in without Ray, for the single-node hosts of a light fleet (a real vLLM image is one image for both)."""
    return f"{registry}/{STANDIN_REPO}:v{STANDIN_VERSION}-slim"


EXPORTER_REPO = "instinct-fleet-standin/device-metrics-exporter"
EXPORTER_VERSION = "v1.2.0"  # the tag the product pins; the stand-in is built from this repository


def exporter_ref(registry: str) -> str:
    return f"{registry}/{EXPORTER_REPO}:{EXPORTER_VERSION}"


def content_tag(repo: str, inputs: tuple[Path, ...], extra: str) -> str:
    """A local image reference named by what the image is built from, so that an image is built once per
    content: by ``make``'s image step, then found by every slot's ``up``, and rebuilt when a stand-in changes."""
    digest = hashlib.sha256(extra.encode())
    for base in inputs:
        for path in sorted(base.rglob("*")) if base.is_dir() else [base]:
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return f"instinct-fleet-test/{repo}:{digest.hexdigest()[:16]}"


def build_standin(ray: bool = True) -> str:
    """The stand-in vLLM image with the real flag table of the vLLM it stands in for; ``ray`` False leaves
    Ray out (the slim image of a light fleet's single-node hosts). Returns its local reference."""
    knowledge = ROOT / "instinct_fleet" / "model" / "knowledge"
    inputs = (HERE / "standin" / "vllm", knowledge / f"vllm-{STANDIN_VERSION}.json", knowledge / "checkpoints.toml")
    local = content_tag("standin-vllm", inputs, f"{BASE_IMAGE} ray={RAY_VERSION if ray else 'none'} hub-token={HF_TOKEN}")
    if image_exists(local):
        return local
    log(f"building the stand-in vLLM image v{STANDIN_VERSION}" + ("" if ray else " (no Ray)"))
    with tempfile.TemporaryDirectory(dir=SHARED) as tmp:
        context = Path(tmp)
        shutil.copytree(HERE / "standin" / "vllm", context, dirs_exist_ok=True)
        shutil.copy(inputs[1], context / "vllm-knowledge.json")
        shutil.copy(inputs[2], context / "checkpoints.toml")
        (context / "hub-token").write_text(HF_TOKEN + "\n")  # the token the stand-in Hub accepts for gated models
        if ray:
            shutil.copytree(ray_packages(), context / "ray-packages")
        else:
            (context / "ray-packages").mkdir()
        run(DOCKER, "build", "-q", "-t", local, "--build-arg", f"BASE={BASE_IMAGE}", str(context), capture=True)
    return local


def build_exporter() -> str:
    """The stand-in device-metrics-exporter image: the base image plus one small layer. Returns its local reference."""
    context = HERE / "standin" / "exporter"
    local = content_tag("standin-exporter", (context,), BASE_IMAGE)
    if not image_exists(local):
        log("building the stand-in device-metrics-exporter image")
        run(DOCKER, "build", "-q", "-t", local, "--build-arg", f"BASE={BASE_IMAGE}", str(context), capture=True)
    return local


def publish(local: str, ref: str, push: bool = True) -> None:
    """Tag a built image with the reference the fleet's inventory pins, and push it to that registry (``push``
    False: the registry holds it already, a copy of the seed storage; ``tag`` still finds the reference here)."""
    run(DOCKER, "tag", local, ref)
    if push:
        run(DOCKER, "push", "-q", ref, capture=True)


@dataclass(frozen=True)
class Images:
    standin: str
    exporter: str
    slim: str | None


def images(light: bool = False) -> Images:
    """dockerd and every image a fleet runs, built once for all slots (``make`` builds them while pip installs).

    The Ray wheels download while debootstrap runs, and the host image builds beside the stand-ins:
    on a fresh machine that is most of a minute less than one step after another.
    """
    with images_lock():
        ensure_dockerd()
        with ThreadPoolExecutor(max_workers=2) as pool:
            wheels = pool.submit(ray_packages)
            build_base()
            host = pool.submit(build_host)
            wheels.result()
            built = Images(build_standin(), build_exporter(), build_standin(ray=False) if light else None)
            host.result()
        seed_registry(built)
    log("images ready")
    return built


def seed_path(built: Images) -> Path:
    """Where the registry storage holding exactly these images is kept (its name: their image ids)."""
    refs = [ref for ref in (built.standin, built.exporter, built.slim) if ref is not None]
    ids = out(DOCKER, "image", "inspect", "-f", "{{.Id}}", *refs).split()
    return SHARED / "registry-seed" / hashlib.sha256(" ".join(ids).encode()).hexdigest()[:16]


def seed_registry(built: Images) -> None:
    """Push the fleet's images once, into a registry storage that each slot's registry starts from as a copy
    (:func:`up`): the shares of make test then push nothing, where each pushed (and gzipped) the same layers
    at once. A storage holds no registry address, so one serves every slot."""
    seed = seed_path(built)
    if seed.is_dir():
        return
    log("pushing the images into the registry storage every slot starts from")
    tmp = seed.with_name(seed.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    address = f"{gateway()}:{SEED_PORT}"
    config = tmp.with_name("seed.yml")
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {tmp}\nhttp:\n  addr: {address}\n")
    registry = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(30):
            if run("curl", "-sf", f"http://{address}/v2/", check=False, capture=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            sys.exit(f"fleet: the seed docker-registry did not answer on {address}")
        publish(built.standin, standin_ref(address))
        publish(built.exporter, exporter_ref(address))
        if built.slim is not None:
            publish(built.slim, slim_ref(address))
    finally:
        registry.terminate()
        registry.wait()
    for old in seed.parent.iterdir():  # the storages of images built before these
        if old.is_dir() and old != tmp:
            shutil.rmtree(old)
    tmp.rename(seed)


def image_bytes(ref: str) -> int:
    return int(out(DOCKER, "image", "inspect", "-f", "{{.Size}}", ref).strip())


# What a simulated host writes besides the vLLM image: its dockerd's state, journals, container layers.
HOST_OVERHEAD_BYTES = 300 * 2**20
DISK_RESERVE_BYTES = 4 * 2**30  # left free for the machine itself


def check_disk(hosts: tuple[SimHost, ...], registry: str) -> None:
    """Refuse a fleet that would fill the disk: each host pulls its own copy of its image (layers shared
    by overlay2 inside the host), on the filesystem of the machine's Docker root."""
    slim, full = image_bytes(slim_ref(registry)), image_bytes(standin_ref(registry))
    need = sum((full if h.cluster else slim) + HOST_OVERHEAD_BYTES for h in hosts) + DISK_RESERVE_BYTES
    root = out(DOCKER, "info", "-f", "{{.DockerRootDir}}").strip()
    free = shutil.disk_usage(root).free
    if need > free:
        gib = 2**30
        sys.exit(
            f"fleet: {len(hosts)} hosts need about {need / gib:.1f} GiB on {root} (images, host state, "
            f"{DISK_RESERVE_BYTES / gib:.0f} GiB reserve); {free / gib:.1f} GiB is free. Use fewer hosts, or free space first "
            "(`python3 tests/fleet/fleet.py down` removes a fleet and its volumes)."
        )
    log(f"disk: {len(hosts)} hosts need about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free on {root}")


def start_registry(address: str, name: str = "registry", proxy: str | None = None) -> None:
    """Debian's docker-registry on ``address``; with ``proxy``, a pull-through cache of that upstream registry.

    Its access log (``.fleet/<name>.log``) records every blob it serves, which is how the
    benchmark counts what the upstream registry had to send.
    """
    if run("curl", "-sf", f"http://{address}/v2/", check=False, capture=True).returncode == 0:
        if registry_pids(name):
            return
        # Another checkout's fleet left its registry on the fleet's address: its storage is not ours,
        # and `registry stop` could not stop it. Replace it.
        others = registry_pids_on(address)
        if not others:
            sys.exit(f"fleet: something other than a fleet's docker-registry answers on {address}; stop it first")
        log(f"stopping the docker-registry another checkout left on {address}")
        stop_pids(others)
    log(f"starting docker-registry on {address}" + (f" (pull-through cache of {proxy})" if proxy else ""))
    config = STATE / f"{name}.yml"
    text = f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {STATE / name}\nhttp:\n  addr: {address}\n"
    if proxy:
        text += f"proxy:\n  remoteurl: http://{proxy}\n"
    config.write_text(text)
    logfile = (STATE / f"{name}.log").open("ab")
    subprocess.Popen(["docker-registry", "serve", str(config)], stdout=logfile, stderr=logfile, start_new_session=True)
    for _ in range(30):
        if run("curl", "-sf", f"http://{address}/v2/", check=False, capture=True).returncode == 0:
            return
        time.sleep(0.5)
    sys.exit(f"fleet: docker-registry did not answer on {address}; see {STATE / f'{name}.log'}")


def ssh_key() -> Path:
    key = STATE / "id_ed25519"
    if not key.exists():
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "instinct-fleet-test", "-f", str(key))
    return key


SMI_ANSWERS = {
    "metric.json": "metric --ecc --ecc-blocks --pcie --json",
    "bad-pages.json": "bad-pages --json",
    "xgmi.json": "xgmi -m -l --json",
}


def standin_smi_healthy() -> Path:
    """What the stand-in amd-smi answers on a host without faults, written once: the hosts print these files."""
    root = STATE / "amd-smi-healthy"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    data = STATE / "amd-smi-data"
    data.mkdir(parents=True, exist_ok=True)
    shutil.copy(STATIC_JSON, data / "amd-smi-static.json")
    shutil.copy(VERSION_JSON, data / "amd-smi-version.json")
    env = {**os.environ, "STANDIN_AMD_SMI_DATA": str(data), "STANDIN_AMD_SMI_FAULTS": str(data / "no-faults.json")}
    for name, command in SMI_ANSWERS.items():
        argv = [sys.executable, str(HERE / "standin" / "amd_smi.py"), *command.split()]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
        (root / name).write_text(done.stdout)
    return root


def standin_sysfs() -> Path:
    """A stand-in /sys/module: amdgpu loaded, one PCI device per captured GPU in SPX/NPS1."""
    root = STATE / "sys-module"
    shutil.rmtree(root, ignore_errors=True)
    amdgpu = root / "amdgpu"
    (amdgpu / "drivers" / "pci:amdgpu").mkdir(parents=True)
    (amdgpu / "initstate").write_text("live\n")
    version = json.loads(VERSION_JSON.read_text())[0]["amdgpu_version"]
    (amdgpu / "version").write_text(f"{version}\n")
    for gpu in json.loads(STATIC_JSON.read_text())["gpu_data"]:
        device = amdgpu / "drivers" / "pci:amdgpu" / gpu["bus"]["bdf"]
        device.mkdir()
        # Values from the captured host: 8 logical GPUs of 304 CUs is SPX/NPS1 (see the fixture's source file).
        (device / "current_compute_partition").write_text("SPX\n")
        (device / "current_memory_partition").write_text("NPS1\n")
        (device / "available_compute_partition").write_text("SPX, DPX, QPX, CPX\n")
        (device / "available_memory_partition").write_text("NPS1, NPS2, NPS4\n")
        # The PCI device's link as trained, as sysfs gives it (and lspci's LnkSta: "Speed 32GT/s (ok), Width x16 (ok)",
        # the Dell XE9680 capture in the fixtures).
        (device / "current_link_width").write_text("16\n")
        (device / "current_link_speed").write_text("32.0 GT/s PCIe\n")
    return root


def gpu_device_script() -> str:
    """Shell that creates the stand-in device nodes inside a GPU host after boot."""
    lines = [
        "set -e",
        "mknod -m 666 /dev/kfd c 1 3",
        "mkdir -p /dev/dri/by-path",
    ]
    for index, gpu in enumerate(json.loads(STATIC_JSON.read_text())["gpu_data"]):
        render = 128 + index
        lines += [
            f"mknod -m 666 /dev/dri/renderD{render} c 1 5",
            f"mknod -m 660 /dev/dri/card{index} c 1 5",
            f"ln -sf ../renderD{render} /dev/dri/by-path/pci-{gpu['bus']['bdf']}-render",
            f"ln -sf ../card{index} /dev/dri/by-path/pci-{gpu['bus']['bdf']}-card",
        ]
    lines += ["chgrp render /dev/dri/renderD* && chgrp video /dev/dri/card*"]
    return "\n".join(lines)


def start_host(host: SimHost, key: Path, sysfs: Path, smi_healthy: Path) -> None:
    name = host.container
    run(DOCKER, "rm", "-f", name, check=False, capture=True)
    argv = [
        DOCKER,
        "run",
        "-d",
        "--name",
        name,
        "--hostname",
        host.name,
        "--label",
        LABEL,
        *HOST_FLAGS,
        "-p",
        f"127.0.0.1:{host.ssh_port}:22",
        "-p",
        f"127.0.0.1:{host.api_port + PORT_OFFSET}:{host.api_port}",
        "-v",
        f"{key}.pub:/root/.ssh/authorized_keys:ro",
    ]
    if host.gpus:
        WEIGHTS.mkdir(exist_ok=True)
        argv += [
            # A directory every host shares, as an NFS mount would be: weights_source in inventories/local.py.
            "-v",
            f"{WEIGHTS}:{WEIGHTS_MOUNT}",
            "-v",
            f"{sysfs}:/sys/module:ro",
            "-v",
            f"{HERE / 'standin' / 'amd-smi'}:/usr/bin/amd-smi:ro",
            "-v",
            f"{HERE / 'standin' / 'amd_smi.py'}:/usr/share/instinct-fleet-standin/amd_smi.py:ro",
            "-v",
            f"{smi_healthy}:/usr/share/instinct-fleet-standin/healthy:ro",
            "-v",
            f"{STATIC_JSON}:/usr/share/instinct-fleet-standin/amd-smi-static.json:ro",
            "-v",
            f"{VERSION_JSON}:/usr/share/instinct-fleet-standin/amd-smi-version.json:ro",
        ]
    run(*argv, HOST_IMAGE, "/lib/systemd/systemd", capture=True)
    if host.gpus:
        run(DOCKER, "exec", name, "sh", "-c", gpu_device_script())
        # The operator's job on a real host: the API key in a root-only file. The Hugging Face token is the
        # deploy's to write (hf_token_source, inventories/local.py), from the file the control machine holds.
        key = f"mkdir -p /etc/instinct-fleet && umask 077 && printf '%s\\n' {API_KEY} > /etc/instinct-fleet/api-key"
        run(DOCKER, "exec", name, "sh", "-c", key)


def wait_hosts(hosts: list[SimHost], key: Path) -> None:
    for host in hosts:
        for _ in range(90):
            probe = run(
                "ssh",
                *ssh_options(key, host.ssh_port),
                "root@127.0.0.1",
                "systemctl is-system-running --wait >/dev/null; systemctl is-active ssh docker",
                check=False,
                capture=True,
            )
            if probe.returncode == 0:
                break
            time.sleep(1)
        else:
            sys.exit(f"fleet: {host.name} did not come up: {probe.stdout.decode()} {probe.stderr.decode()}")


def ssh_options(key: Path, port: int) -> list[str]:
    return [
        "-i",
        str(key),
        "-p",
        str(port),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "BatchMode=yes",
    ]


def up(count: int | None = None, clusters: int | None = None) -> dict[str, object]:
    """The demo fleet, or with ``count`` a light fleet of that many GPU hosts behind a pull-through cache (``clusters``
    two-node Ray clusters among them; by default one per 16)."""
    STATE.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    built = images(light=count is not None)
    registry = f"{gateway()}:{REGISTRY_PORT}"
    check_trusted(registry)
    # A slot's first registry starts from a copy of the seed storage, which holds its images already.
    seeded = not registry_pids() and not (STATE / "registry").exists()
    if seeded:
        shutil.copytree(seed_path(built), STATE / "registry")
    start_registry(registry)
    cache = f"{gateway()}:{REGISTRY_PORT + 1}"
    start_registry(cache, "cache", proxy=registry)
    publish(built.standin, standin_ref(registry), push=not seeded)
    publish(built.exporter, exporter_ref(registry), push=not seeded)
    if built.slim is not None:
        publish(built.slim, slim_ref(registry), push=not seeded)
    if count is not None:
        check_disk(light_hosts(count, clusters), registry)
    key = ssh_key()
    sysfs, smi_healthy = standin_sysfs(), standin_smi_healthy()
    log(f"images in {registry}; starting hosts")
    # systemd in each host takes inotify instances from the machine's per-user pool (128 on
    # Debian); past about 18 hosts the next one's systemd exits at once without it.
    inotify = Path("/proc/sys/fs/inotify/max_user_instances")
    others = out(DOCKER, "ps", "-q", "--filter", f"label={LABEL_KEY}").split()  # another slot's hosts
    wanted = 64 * (len(others) + len(HOSTS if count is None else light_hosts(count, clusters)))
    if int(inotify.read_text()) < wanted:
        inotify.write_text(str(wanted))
    hosts = []
    for host in HOSTS if count is None else light_hosts(count, clusters):
        start_host(host, key, sysfs, smi_healthy)
        address = out(DOCKER, "inspect", "-f", "{{.NetworkSettings.IPAddress}}", host.container)
        hosts.append(dataclasses.replace(host, address=address))
    wait_hosts(hosts, key)
    # The Hugging Face token as a team keeps it on its control machine: a file only its user reads.
    token_file = STATE / "hf-token"
    write_private(token_file, HF_TOKEN + "\n")
    fleet = {
        "registry": registry,
        "cache": cache,
        "image": standin_ref(registry),
        "slim_image": slim_ref(registry) if count is not None else None,
        "exporter_image": exporter_ref(registry),
        "weights_source": WEIGHTS_MOUNT,
        "weights_dir": str(WEIGHTS),  # the share, as the machine sees it
        "vllm_version": STANDIN_VERSION,
        "ssh_key": str(key),
        "hf_token": HF_TOKEN,
        "hf_token_file": str(token_file),
        "api_key": API_KEY,
        "hosts": [asdict(h) for h in hosts],
    }
    write_private(STATE / "fleet.json", json.dumps(fleet, indent=2) + "\n")
    log(f"fleet up in {time.monotonic() - started:.0f}s: {', '.join(h.name for h in hosts)}")
    return fleet


def write_private(path: Path, text: str) -> None:
    """Write a file only root reads (0600 from its creation, never briefly wider): the fleet file holds the token and the key."""
    scratch = path.with_name(path.name + ".new")
    scratch.unlink(missing_ok=True)
    with os.fdopen(os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        handle.write(text)
    os.replace(scratch, path)


def revive(name: str) -> None:
    """Start a host container that was killed, and give it back what a boot does not: its stand-in devices."""
    host = next(h for h in HOSTS if h.name == name)
    run(DOCKER, "start", host.container, capture=True)
    if host.gpus:
        run(DOCKER, "exec", host.container, "sh", "-c", gpu_device_script())
    wait_hosts([host], ssh_key())


def registry_pids(name: str = "registry") -> list[int]:
    """The pids of this checkout's and slot's registry ``name``."""
    config = re.escape(str(STATE / f"{name}.yml"))
    found = run("pgrep", "-f", f"^docker-registry serve {config}$", check=False, capture=True).stdout.decode().split()
    return [int(pid) for pid in found]


def registry_pids_on(address: str) -> list[int]:
    """The pids of any fleet's docker-registry (any checkout, any slot) whose config listens on ``address``."""
    found = run("pgrep", "-f", "^docker-registry serve ", check=False, capture=True).stdout.decode().split()
    pids = []
    for pid in found:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            config = Path(argv[2].decode()).read_text()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not a config we can read
        if re.search(rf"^\s+addr: {re.escape(address)}$", config, re.M):
            pids.append(int(pid))
    return pids


def stop_pids(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, 15)
    for _ in range(50):
        if not [pid for pid in pids if Path(f"/proc/{pid}").exists()]:
            return
        time.sleep(0.1)
    sys.exit(f"fleet: docker-registry {pids} did not stop")


def registry(action: str) -> None:
    """Stop or start the fleet's registry (a fault the end-to-end tests inject)."""
    fleet = json.loads((STATE / "fleet.json").read_text())
    if action == "stop":
        stop_pids(registry_pids())
        return
    start_registry(fleet["registry"])


def tag(new_tag: str) -> str:
    """Push the stand-in image under another tag, as a release of a new image would; returns the reference."""
    fleet = json.loads((STATE / "fleet.json").read_text())
    ref = f"{fleet['registry']}/{STANDIN_REPO}:{new_tag}"
    run(DOCKER, "tag", fleet["image"], ref)
    run(DOCKER, "push", "-q", ref, capture=True)
    return ref


def down() -> None:
    if not docker_ok():
        return
    ids = out(DOCKER, "ps", "-aq", "--filter", f"label={LABEL}").split()
    if ids:
        log(f"removing {len(ids)} hosts")
    for _ in range(120):  # a removal already in progress makes docker rm fail: wait until all are gone
        if not ids:
            break
        run(DOCKER, "rm", "-f", "-v", *ids, check=False, capture=True)
        ids = out(DOCKER, "ps", "-aq", "--filter", f"label={LABEL}").split()
        if ids:
            time.sleep(1)
    else:
        sys.exit(f"fleet: hosts {ids} could not be removed")
    (STATE / "fleet.json").unlink(missing_ok=True)
    shutil.rmtree(WEIGHTS, ignore_errors=True)  # written as root by the hosts' containers
    log("fleet down")


def sample() -> None:
    """Print each published endpoint and one completion from it, then the same through the router (the end of ``make demo``)."""
    fleet = json.loads((STATE / "fleet.json").read_text())
    # inventories/local.py guards sim-gpu-2's instances with this key; an instance without one ignores it.
    key = ["-H", f"Authorization: Bearer {fleet['api_key']}"]
    shown = "Authorization: Bearer $API_KEY"  # printed instead of the key: API_KEY=$(jq -r .api_key .fleet/fleet.json)
    print("The API key is in .fleet/fleet.json (root's alone): API_KEY=$(jq -r .api_key .fleet/fleet.json)")
    for host in fleet["hosts"]:
        url = f"http://127.0.0.1:{host['api_port'] + PORT_OFFSET}"  # published on the machine
        models = run("curl", "-s", "-m", "5", *key, f"{url}/v1/models", check=False, capture=True)
        try:
            model = json.loads(models.stdout)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            print(f"{host['name']}: nothing serving on {url} (see the deploy output above)")
            continue
        body = json.dumps({"model": model, "prompt": "The MI300X has 192 GB of", "max_tokens": 12})
        reply = out("curl", "-s", "-m", "10", *key, "-H", "Content-Type: application/json", "-d", body, f"{url}/v1/completions")
        print(f"{host['name']}: {url}  model {model}")
        print(f"  curl {url}/v1/completions -H \"{shown}\" -H 'Content-Type: application/json' -d '{body}'")
        print(f"  -> {json.loads(reply)['choices'][0]['text'].strip()!r}")
    # inventories/local.py puts vLLM's router on sim-gpu-1, gpt-oss-120b's pool on its port 30000: the
    # machine reaches the host's container address (the router's port is not published).
    router = next(h for h in fleet["hosts"] if h["name"] == "sim-gpu-1")
    url = f"http://{router['address']}:30000"
    body = json.dumps({"model": "openai/gpt-oss-120b", "prompt": "The MI300X has 192 GB of", "max_tokens": 12})
    reply = run(
        "curl",
        "-s",
        "-m",
        "10",
        *key,
        "-H",
        "Content-Type: application/json",
        "-d",
        body,
        f"{url}/v1/completions",
        check=False,
        capture=True,
    )
    try:
        text = json.loads(reply.stdout)["choices"][0]["text"].strip()
    except (ValueError, KeyError, IndexError, TypeError):
        print(f"router: nothing answers on {url} (see the deploy output above)")
        return
    print(f"router (vllm-router on sim-gpu-1, every gpt-oss-120b instance of the fleet behind it): {url}")
    print(f"  curl {url}/v1/completions -H \"{shown}\" -H 'Content-Type: application/json' -d '{body}'")
    print(f"  -> {text!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["images", "up", "down", "sample", "revive", "registry", "tag"])
    parser.add_argument("argument", nargs="?", help="revive: host name; registry: stop or start; tag: the new tag")
    parser.add_argument("--hosts", type=int, help="up: a light fleet of this many GPU hosts (one two-node cluster per 16)")
    parser.add_argument("--clusters", type=int, help="up --hosts N: this many two-node Ray clusters among the N hosts")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("fleet: run as root (dockerd, debootstrap)")
    if args.command == "images":
        images()
    elif args.command == "up":
        up(args.hosts, args.clusters)
    elif args.command == "sample":
        sample()
    elif args.command == "revive":
        revive(args.argument)
    elif args.command == "registry":
        registry(args.argument)
    elif args.command == "tag":
        print(tag(args.argument))
    else:
        down()


if __name__ == "__main__":
    main()
