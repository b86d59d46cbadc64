"""The preflight facts of a host: :class:`HostReport`, parsed from the probe's output (:mod:`instinct_fleet.converge.probe`).

:func:`parse_report` is pure, so unit tests run it on captured output; what the
facts mean for a host, the policy, is :mod:`instinct_fleet.converge.hostchecks`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from instinct_fleet.converge import evidence, generations
from instinct_fleet.converge.evidence import Evidence, dig, json_in
from instinct_fleet.converge.generations import Generations
from instinct_fleet.converge.probe import IMAGE_MARK, MARK
from instinct_fleet.model import paths
from instinct_fleet.model.defaults import GPU_MODELS
from instinct_fleet.model.paths import KERNEL_ARGS, NUMA_BALANCING


@dataclass(frozen=True)
class Stat:
    """Mode, owner, group and kind (``regular file``, ``directory``) of a path, as ``stat`` prints them."""

    mode: str
    owner: str
    group: str
    kind: str


@dataclass(frozen=True)
class Gpu:
    index: int
    model: str | None
    market_name: str
    bdf: str | None
    render_node: str | None
    driver: str | None
    firmware: str | None
    arch: str | None = None  # amd-smi's target_graphics_version (gfx942 on MI300X); rocm-smi's listing has none


@dataclass(frozen=True)
class HostReport:
    """The preflight facts of one host. ``smi`` names the tool that listed the GPUs."""

    smi: str | None
    smi_error: str | None
    gpus: tuple[Gpu, ...]
    rocm_version: str | None
    amdgpu_version: str | None
    amdgpu_loaded: bool
    kfd: bool
    render_nodes: tuple[str, ...]
    compute_partition: str | None
    memory_partition: str | None
    cmdline: str
    docker_version: str | None
    os_id: str
    os_like: tuple[str, ...]
    group_ids: dict[str, int]
    addresses: dict[str, str] = field(default_factory=dict)
    ssh_port: int | None = None  # the port sshd answered the deploy on ($SSH_CONNECTION); None: not over SSH
    commands: tuple[str, ...] = ()
    managed_units: tuple[str, ...] = ()
    hf_token: bool = False
    api_key: str | None = None  # "mode|owner|size" of vllm_api_key_path; None when it is not there (or not asked for)
    infiniband: tuple[str, ...] = ()
    file_hashes: dict[str, str] = field(default_factory=dict)
    active_units: tuple[str, ...] = ()
    # The managed state (instinct_fleet/converge/managed.py): what the fact's probe named, as the host has it.
    stats: dict[str, Stat] = field(default_factory=dict)
    enabled_units: tuple[str, ...] = ()
    user: tuple[str, str, tuple[str, ...]] | None = None  # home, shell, groups
    image_ids: dict[str, str] = field(default_factory=dict)  # image reference -> id, of the images the probe named
    router_drift: dict[int, tuple[str, ...]] = field(default_factory=dict)  # router port -> "add URL" / "remove URL"
    healthy_ports: tuple[int, ...] = ()
    tables: tuple[str, ...] = ()  # the nftables tables the probe named that are loaded
    sysctls: dict[str, str] = field(default_factory=dict)  # the kernel settings the probe named -> their live value
    # weights_source repository -> (its completion marker, the host's staged marker); "" when absent.
    weights: dict[str, tuple[str, str]] = field(default_factory=dict)
    generations: Generations = field(default_factory=Generations)
    evidence: Evidence = field(default_factory=Evidence)  # GPU health (converge/evidence.py, judged by converge/gpuhealth.py)
    quarantine: dict[str, Any] = field(default_factory=dict)  # the quarantine record on the host (paths.QUARANTINE), {} without

    @property
    def numa_balancing(self) -> str | None:
        """kernel.numa_balancing's live value, None on a kernel without it (the probe reads it as a declared sysctl)."""
        return self.sysctls.get(NUMA_BALANCING)

    @property
    def gpu_arch(self) -> str | None:
        """The one GPU architecture of the host (gfx942): compiled kernels and JIT modules built for it run only
        on it, so a compile cache goes only to hosts with the same; None when the GPUs do not all name the same."""
        archs = {gpu.arch for gpu in self.gpus}
        return next(iter(archs)) if len(archs) == 1 else None

    @property
    def missing_kernel_args(self) -> tuple[str, ...]:
        words = self.cmdline.split()
        return tuple(arg for arg in KERNEL_ARGS if arg not in words)

    @property
    def is_debian_family(self) -> bool:
        return self.os_id in ("debian", "ubuntu") or "debian" in self.os_like


def model_of(name: str) -> str | None:
    """``AMD Instinct MI300X OAM`` -> ``MI300X``; None for anything else."""
    match = re.search(r"MI3\d\dX", name.upper())
    return match.group(0) if match and match.group(0) in GPU_MODELS else None


def sections(text: str, mark: str = MARK) -> dict[str, str]:
    """A script's output cut at its ``mark`` lines: section name -> the text under it (status.py's script uses its own mark)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(mark):
            current = line[len(mark) :].strip()
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return {name: "\n".join(lines).strip() for name, lines in found.items()}


def _by_path(text: str) -> dict[str, str]:
    """``pci-0000:1b:00.0-render -> ../renderD128`` lines to {bdf: renderD128}."""
    mapping = {}
    for match in re.finditer(r"pci-([0-9a-fA-F:.]+)-render -> \S*?(renderD\d+)", text):
        mapping[match.group(1).lower()] = match.group(2)
    return mapping


def _amd_smi_gpus(static: Any, by_path: dict[str, str], nodes: tuple[str, ...]) -> tuple[tuple[Gpu, ...], str | None]:
    rows = static.get("gpu_data") if isinstance(static, dict) else static
    if not isinstance(rows, list):
        return (), "amd-smi static --json printed no GPU list"
    gpus = []
    for position, row in enumerate(rows):
        market = evidence.text(dig(row, "asic", "market_name")) or "N/A"
        bdf = evidence.text(dig(row, "bus", "bdf"))
        render = by_path.get(bdf.lower()) if bdf else None
        if render is None and not by_path and position < len(nodes):
            render = nodes[position]  # no udev by-path links: render nodes follow PCI order
        gpus.append(
            Gpu(
                index=int(gpu) if isinstance(gpu := dig(row, "gpu"), int) else position,
                model=model_of(market),
                market_name=market,
                bdf=bdf,
                render_node=render,
                driver=evidence.text(dig(row, "driver", "version")),
                firmware=evidence.text(dig(row, "ifwi", "version")) or evidence.text(dig(row, "vbios", "version")),
                arch=evidence.text(dig(row, "asic", "target_graphics_version")),
            )
        )
    if gpus and all(g.market_name == "N/A" for g in gpus):
        return tuple(gpus), "amd-smi answered N/A for every GPU: it needs root (run pyinfra with --sudo or as root)"
    return tuple(gpus), None


def _rocm_smi_gpus(text: str, nodes: tuple[str, ...]) -> tuple[Gpu, ...]:
    gpus = []
    for match in re.finditer(r"^GPU\[(\d+)\]\s*:\s*Card Series:\s*(.+?)\s*$", text, re.M):
        index = int(match.group(1))
        name = match.group(2)
        render = nodes[index] if index < len(nodes) else None
        gpus.append(Gpu(index, model_of(name), name, None, render, None, None))
    return tuple(gpus)


def _os_release(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value.strip().strip('"')
    return values


def _router_drift(text: str) -> dict[int, tuple[str, ...]]:
    """The sync script's --check lines, each prefixed with its router's port: what to add to or remove from each pool."""
    found: dict[int, list[str]] = {}
    for line in text.splitlines():
        port, _, change = line.strip().partition(" ")
        if port.isdigit() and change.startswith(("add ", "remove ")):
            found.setdefault(int(port), []).append(change)
    return {port: tuple(changes) for port, changes in found.items()}


def parse_report(text: str) -> HostReport:
    """Turn the output of :data:`SCRIPT` into a :class:`HostReport`."""
    part = sections(text)
    nodes = tuple(sorted(part.get("render-nodes", "").split(), key=lambda n: int(n[7:]) if n[7:].isdigit() else 0))
    smi: str | None = None
    smi_error = None
    gpus: tuple[Gpu, ...] = ()
    if part.get("amd-smi-static"):
        smi = "amd-smi"
        static = json_in(part["amd-smi-static"])
        if static is None:
            smi_error = f"amd-smi static --json failed: {part['amd-smi-static'].splitlines()[-1][:200]}"
        else:
            gpus, smi_error = _amd_smi_gpus(static, _by_path(part.get("render-by-path", "")), nodes)
    elif part.get("rocm-smi"):
        smi = "rocm-smi"
        gpus = _rocm_smi_gpus(part["rocm-smi"], nodes)
    version = json_in(part.get("amd-smi-version", ""))
    version_row = version[0] if isinstance(version, list) and version and isinstance(version[0], dict) else {}
    partitions = [line.split() for line in part.get("partitions", "").splitlines() if line.strip()]
    compute = sorted({p[0] for p in partitions if p})
    memory = sorted({p[1] for p in partitions if len(p) > 1})
    osr = _os_release(part.get("os-release", ""))
    docker = _docker(part.get("docker", ""))
    groups = {}
    for line in part.get("groups", "").splitlines():
        bits = line.split(":")
        if len(bits) >= 3 and bits[2].isdigit():
            groups[bits[0]] = int(bits[2])
    addresses: dict[str, str] = {}
    for match in re.finditer(r"^\d+:\s+(\S+)\s+inet\s+([0-9.]+)/", part.get("interfaces", ""), re.M):
        addresses.setdefault(match.group(1), match.group(2))
    return HostReport(
        smi=smi,
        smi_error=smi_error,
        gpus=gpus,
        rocm_version=evidence.text(version_row.get("rocm_version")),
        amdgpu_version=evidence.text(version_row.get("amdgpu_version")) or evidence.text(part.get("amdgpu-version")),
        amdgpu_loaded=part.get("amdgpu-initstate") == "live",
        kfd=part.get("kfd") == "present",
        render_nodes=nodes,
        compute_partition="/".join(compute) or None,
        memory_partition="/".join(memory) or None,
        cmdline=part.get("cmdline", ""),
        docker_version=docker[0],
        os_id=osr.get("ID", ""),
        os_like=tuple(osr.get("ID_LIKE", "").split()),
        group_ids=groups,
        addresses=addresses,
        ssh_port=_ssh_port(part.get("ssh", "")),
        commands=tuple(part.get("commands", "").split()),
        managed_units=tuple(line.rsplit("/", 1)[-1].removesuffix(".service") for line in part.get("units", "").split()),
        hf_token=part.get("hf-token") == "present",
        api_key=part.get("api-key", "").strip() or None,
        infiniband=tuple(part.get("infiniband", "").split()),
        file_hashes={path: digest for digest, path in (line.split(None, 1) for line in part.get("files", "").splitlines() if " " in line)},
        active_units=_unit_names(part.get("active", "")),
        stats=_stats(part.get("stat", "")),
        enabled_units=_unit_names(part.get("enabled", "")),
        user=_user(part.get("user", "")),
        image_ids=docker[1],
        healthy_ports=tuple(int(p) for p in part.get("healthy", "").split() if p.isdigit()),
        tables=tuple(line.strip() for line in part.get("tables", "").splitlines() if line.strip()),
        sysctls=_pairs(part.get("sysctls", ""), lambda value: value != ""),
        weights=_weights(part.get("weights", "")),
        generations=generations.parse(part.get("generations", "")),
        router_drift=_router_drift(part.get("router-drift", "")),
        evidence=evidence.parse(part) if smi == "amd-smi" else Evidence(),
        quarantine=record if isinstance(record := json_in(part.get("quarantine", "")), dict) else {},
    )


def _ssh_port(text: str) -> int | None:
    """The server port of ``$SSH_CONNECTION`` (client address, client port, server address, server port)."""
    words = text.split()
    return int(words[3]) if len(words) == 4 and words[3].isdigit() and 0 < int(words[3]) < 65536 else None


SERVER_HEADER = re.compile(r"^server:\s*docker/(\S+)", re.I)


def _docker(text: str) -> tuple[str | None, dict[str, str]]:
    """The docker section (:func:`instinct_fleet.converge.probe.docker_probe`): dockerd's version from its
    ``Server: Docker/<version>`` line, and the id of each image it has, from the answer (inspect JSON from
    the API, an id from the CLI) before each ``@@image:`` line. None and no ids: no docker answered."""
    version = None
    ids: dict[str, str] = {}
    answer = ""
    for line in text.splitlines():
        if found := SERVER_HEADER.match(line):
            version = found.group(1)
        elif line.startswith(IMAGE_MARK):
            if image_id := _image_id(answer):
                ids[line[len(IMAGE_MARK) :]] = image_id
            answer = ""
        elif line.strip():
            answer = line.strip()
    return version, ids


def _image_id(value: str) -> str | None:
    """An image's id: its API's inspect JSON (``Id``), or what ``docker image inspect`` printed; None: docker lacks it."""
    if value.startswith("{"):
        found = json_in(value)
        value = str(found.get("Id", "")) if isinstance(found, dict) else ""
    return value if value.startswith("sha256:") else None


def _pairs(text: str, valid: Callable[[str], bool]) -> dict[str, str]:
    """``name|value`` lines, as the probe prints them for kernel settings; a value that is not ``valid``
    (a setting the kernel lacks) leaves its name out."""
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition("|")
        if name and valid(value.strip()):
            found[name] = value.strip()
    return found


def _weights(text: str) -> dict[str, tuple[str, str]]:
    """``source|complete|staged`` lines: each weights_source repository with both markers' first lines."""
    found = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0]:
            found[parts[0]] = (parts[1].strip(), parts[2].strip())
    return found


def _unit_names(text: str) -> tuple[str, ...]:
    return tuple(line.split()[0].removesuffix(".service") for line in text.splitlines() if line.strip())


def _stats(text: str) -> dict[str, Stat]:
    """``stat -c '%a|%U|%G|%F|%n'`` lines; the path comes last, so it may hold anything but a newline."""
    found = {}
    for line in text.splitlines():
        bits = line.split("|", 4)
        if len(bits) == 5:
            kind = "regular file" if bits[3] == "regular empty file" else bits[3]  # stat's %F for an empty file
            found[bits[4]] = Stat(bits[0], bits[1], bits[2], kind)
    return found


def _user(text: str) -> tuple[str, str, tuple[str, ...]] | None:
    """``getent passwd`` then ``id -nG``: the user's home, shell and groups; None when there is no such user."""
    lines = text.splitlines()
    fields = lines[0].split(":") if lines else []
    if len(fields) < 7:
        return None
    return fields[5], fields[6], tuple(sorted(lines[1].split())) if len(lines) > 1 else ()


def render_nodes(report: HostReport, gpus: tuple[int, ...]) -> list[str]:
    """``/dev/dri/renderD*`` paths of these GPU indices (hard_problems has checked they exist)."""
    return [f"{paths.DRI}/{report.gpus[g].render_node}" for g in gpus]
