"""What a host really has, read in one SSH round trip, and the hard checks on it.

:data:`SCRIPT` is the command of the ``HostReport`` fact. It prints one section
per probe, so a host without ``amd-smi``, ``docker`` or ``/dev/dri`` still gives
a full report. :func:`parse_report` turns that text into a typed
:class:`HostReport`; :func:`hard_problems` says, for one host, what is missing
and how to fix it. Both are pure so that unit tests run them on captured output.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from instinct_fleet import generations, paths
from instinct_fleet import health as health_checks
from instinct_fleet.defaults import GPU_MODELS
from instinct_fleet.generations import Generations
from instinct_fleet.paths import KERNEL_ARGS, RESTART_FILES, UNIT_GLOBS, UNIT_PATTERNS, WEIGHTS_COMPLETE, WEIGHTS_STAGED, sysctl_path
from instinct_fleet.rules import Finding, finding
from instinct_fleet.spec import HostSpec

MARK = "@@instinct-fleet:"

# Each probe is one section; a probe that fails leaves its section empty.
# printf starts each marker on a new line: amd-smi's JSON does not end with one.
SCRIPT = "; ".join(
    f"printf '\\n%s\\n' '{MARK}{name}'; {probe}"
    for name, probe in (
        ("amd-smi-static", "command -v amd-smi >/dev/null 2>&1 && amd-smi static --json 2>&1"),
        ("amd-smi-version", "command -v amd-smi >/dev/null 2>&1 && amd-smi version --json 2>&1"),
        ("rocm-smi", "command -v amd-smi >/dev/null 2>&1 || { command -v rocm-smi >/dev/null 2>&1 && rocm-smi --showproductname 2>&1; }"),
        ("kfd", f"test -c {paths.KFD} && echo present"),
        ("render-nodes", f"ls {paths.DRI} 2>/dev/null | grep '^renderD'"),
        ("render-by-path", f"ls -l {paths.DRI}/by-path 2>/dev/null | grep -- '-render '"),
        ("amdgpu-initstate", "cat /sys/module/amdgpu/initstate 2>/dev/null"),
        ("amdgpu-version", "cat /sys/module/amdgpu/version 2>/dev/null"),
        (
            "partitions",
            'for d in /sys/module/amdgpu/drivers/pci:amdgpu/*/; do test -r "$d/current_compute_partition" && '
            'echo "$(cat "$d/current_compute_partition") $(cat "$d/current_memory_partition" 2>/dev/null)"; done 2>/dev/null',
        ),
        ("cmdline", "cat /proc/cmdline"),
        ("numa-balancing", "cat /proc/sys/kernel/numa_balancing 2>/dev/null"),
        ("docker", "command -v docker >/dev/null 2>&1 && docker version --format '{{.Server.Version}}' 2>/dev/null"),
        ("os-release", "cat /etc/os-release 2>/dev/null"),
        ("groups", "getent group render video"),
        ("interfaces", "ip -o -4 addr show 2>/dev/null"),
        ("commands", "for c in cpupower curl nft; do command -v $c >/dev/null 2>&1 && echo $c; done"),
        ("infiniband", "ls /dev/infiniband 2>/dev/null"),
        ("units", f"grep -l 'Managed by instinct-fleet' {' '.join(UNIT_GLOBS)} 2>/dev/null"),
        # What decides a restart: the files a unit runs from, and whether it is running now (roll.py).
    )
)


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
    numa_balancing: str | None
    docker_version: str | None
    os_id: str
    os_like: tuple[str, ...]
    group_ids: dict[str, int]
    addresses: dict[str, str] = field(default_factory=dict)
    commands: tuple[str, ...] = ()
    managed_units: tuple[str, ...] = ()
    hf_token: bool = False
    api_key: str | None = None  # "mode|owner|size" of vllm_api_key_path; None when it is not there (or not asked for)
    infiniband: tuple[str, ...] = ()
    file_hashes: dict[str, str] = field(default_factory=dict)
    active_units: tuple[str, ...] = ()
    # The managed state (instinct_fleet/managed.py): what the fact's probe named, as the host has it.
    stats: dict[str, Stat] = field(default_factory=dict)
    enabled_units: tuple[str, ...] = ()
    user: tuple[str, str, tuple[str, ...]] | None = None  # home, shell, groups
    image_ids: dict[str, str] = field(default_factory=dict)  # image reference -> id, of the images the probe named
    healthy_ports: tuple[int, ...] = ()
    tables: tuple[str, ...] = ()  # the nftables tables the probe named that are loaded
    sysctls: dict[str, str] = field(default_factory=dict)  # the kernel settings the probe named -> their live value
    # weights_source repository -> (its completion marker, the host's staged marker); "" when absent.
    weights: dict[str, tuple[str, str]] = field(default_factory=dict)
    generations: Generations = field(default_factory=Generations)

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


def _json(text: str) -> Any:
    """amd-smi may print warnings before its JSON; take the JSON part."""
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError:
        return None


def _by_path(text: str) -> dict[str, str]:
    """``pci-0000:1b:00.0-render -> ../renderD128`` lines to {bdf: renderD128}."""
    mapping = {}
    for match in re.finditer(r"pci-([0-9a-fA-F:.]+)-render -> \S*?(renderD\d+)", text):
        mapping[match.group(1).lower()] = match.group(2)
    return mapping


def _na(value: Any) -> str | None:
    return None if value in (None, "", "N/A") or isinstance(value, (dict, list)) else str(value)


def _dig(row: Any, *keys: str) -> Any:
    """row[k1][k2]..., or None where amd-smi put "N/A" (or nothing) instead of an object."""
    for key in keys:
        if not isinstance(row, dict):
            return None
        row = row.get(key)
    return row


def _amd_smi_gpus(static: Any, by_path: dict[str, str], nodes: tuple[str, ...]) -> tuple[tuple[Gpu, ...], str | None]:
    rows = static.get("gpu_data") if isinstance(static, dict) else static
    if not isinstance(rows, list):
        return (), "amd-smi static --json printed no GPU list"
    gpus = []
    for position, row in enumerate(rows):
        market = _na(_dig(row, "asic", "market_name")) or "N/A"
        bdf = _na(_dig(row, "bus", "bdf"))
        render = by_path.get(bdf.lower()) if bdf else None
        if render is None and not by_path and position < len(nodes):
            render = nodes[position]  # no udev by-path links: render nodes follow PCI order
        gpus.append(
            Gpu(
                index=int(gpu) if isinstance(gpu := _dig(row, "gpu"), int) else position,
                model=model_of(market),
                market_name=market,
                bdf=bdf,
                render_node=render,
                driver=_na(_dig(row, "driver", "version")),
                firmware=_na(_dig(row, "ifwi", "version")) or _na(_dig(row, "vbios", "version")),
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


def parse_report(text: str) -> HostReport:
    """Turn the output of :data:`SCRIPT` into a :class:`HostReport`."""
    part = sections(text)
    nodes = tuple(sorted(part.get("render-nodes", "").split(), key=lambda n: int(n[7:]) if n[7:].isdigit() else 0))
    smi: str | None = None
    smi_error = None
    gpus: tuple[Gpu, ...] = ()
    if part.get("amd-smi-static"):
        smi = "amd-smi"
        static = _json(part["amd-smi-static"])
        if static is None:
            smi_error = f"amd-smi static --json failed: {part['amd-smi-static'].splitlines()[-1][:200]}"
        else:
            gpus, smi_error = _amd_smi_gpus(static, _by_path(part.get("render-by-path", "")), nodes)
    elif part.get("rocm-smi"):
        smi = "rocm-smi"
        gpus = _rocm_smi_gpus(part["rocm-smi"], nodes)
    version = _json(part.get("amd-smi-version", ""))
    version_row = version[0] if isinstance(version, list) and version and isinstance(version[0], dict) else {}
    partitions = [line.split() for line in part.get("partitions", "").splitlines() if line.strip()]
    compute = sorted({p[0] for p in partitions if p})
    memory = sorted({p[1] for p in partitions if len(p) > 1})
    osr = _os_release(part.get("os-release", ""))
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
        rocm_version=_na(version_row.get("rocm_version")),
        amdgpu_version=_na(version_row.get("amdgpu_version")) or _na(part.get("amdgpu-version")),
        amdgpu_loaded=part.get("amdgpu-initstate") == "live",
        kfd=part.get("kfd") == "present",
        render_nodes=nodes,
        compute_partition="/".join(compute) or None,
        memory_partition="/".join(memory) or None,
        cmdline=part.get("cmdline", ""),
        numa_balancing=part.get("numa-balancing") or None,
        docker_version=part.get("docker") or None,
        os_id=osr.get("ID", ""),
        os_like=tuple(osr.get("ID_LIKE", "").split()),
        group_ids=groups,
        addresses=addresses,
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
        image_ids=_pairs(part.get("images", ""), lambda value: value.startswith("sha256:")),
        healthy_ports=tuple(int(p) for p in part.get("healthy", "").split() if p.isdigit()),
        tables=tuple(line.strip() for line in part.get("tables", "").splitlines() if line.strip()),
        sysctls=_pairs(part.get("sysctls", ""), lambda value: value != ""),
        weights=_weights(part.get("weights", "")),
        generations=generations.parse(part.get("generations", "")),
    )


def _pairs(text: str, valid: Callable[[str], bool]) -> dict[str, str]:
    """``name|value`` lines, as the probe prints them for images and kernel settings; a value that is not ``valid``
    (an image docker does not have, a setting the kernel lacks) leaves its name out."""
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


@dataclass(frozen=True)
class Probe:
    """What the fact reads besides the hardware: instinct_fleet/managed.py projects it from the spec, before any fact."""

    paths: tuple[str, ...]
    units: tuple[str, ...]  # with .service
    user: str
    images: tuple[str, ...]
    endpoints: tuple[tuple[int, str, bool], ...]  # port, served model, whether it generates
    weights: tuple[tuple[str, str], ...] = ()  # (repository in weights_source, repository in hf_cache_dir)
    tables: tuple[str, ...] = ()  # nftables tables, "family name"
    sysctls: tuple[str, ...] = ()  # kernel settings, "kernel.numa_balancing"
    api_key_path: str | None = None  # vllm_api_key_path: /v1 answers only with the key, and its file must be root's alone
    restore: str | None = None  # instinct-fleet rollback: the generation to read back ("previous" or a number)


def script(token_path: str, probe: Probe) -> str:
    """:data:`SCRIPT` plus the state of what this host's deploy manages (``probe``), in the same round trip."""
    q = shlex.quote
    paths = " ".join(q(p) for p in probe.paths)
    globs = " ".join(RESTART_FILES)
    units = " ".join(q(u) for u in probe.units)
    patterns = " ".join(q(p) for p in UNIT_PATTERNS)
    health = "; ".join(
        f"{health_checks.serving(port, served, probe.api_key_path, generates=generates)} && echo {port}"
        for port, served, generates in probe.endpoints
    )
    weights = "; ".join(
        f"printf '%s|%s|%s\\n' {q(source)} \"$(head -n1 {q(source + '/' + WEIGHTS_COMPLETE)} 2>/dev/null)\" "
        f'"$(head -n1 {q(local + "/" + WEIGHTS_STAGED)} 2>/dev/null)"'
        for source, local in probe.weights
    )
    images = "; ".join(
        f"printf '%s|%s\\n' {q(image)} \"$(docker image inspect --format '{{{{.Id}}}}' {q(image)} 2>/dev/null)\"" for image in probe.images
    )
    tables = "; ".join(f"nft list table {table} >/dev/null 2>&1 && echo {q(table)}" for table in probe.tables)
    sysctls = "; ".join(f"printf '%s|%s\\n' {q(key)} \"$(cat {q(sysctl_path(key))} 2>/dev/null)\"" for key in probe.sysctls)
    probes = (
        ("hf-token", f"test -r {q(token_path)} && echo present"),
        ("api-key", f"stat -c '%a|%U|%s' {q(probe.api_key_path)} 2>/dev/null" if probe.api_key_path else "true"),
        # sha256sum and stat of what the deploy manages, and of every unit and env file it ever wrote (stale ones too).
        ("files", f"sha256sum {paths} {globs} 2>/dev/null"),
        ("stat", f"stat -c '%a|%U|%G|%F|%n' {paths} {globs} 2>/dev/null"),
        ("active", f"systemctl list-units --state=active --plain --no-legend {patterns} {units} 2>/dev/null"),
        ("enabled", f"systemctl list-unit-files --state=enabled --plain --no-legend {patterns} {units} 2>/dev/null"),
        ("user", f"getent passwd {q(probe.user)} && id -nG {q(probe.user)}"),
        ("images", images or "true"),
        ("healthy", health or "true"),
        ("tables", tables or "true"),
        ("sysctls", sysctls or "true"),
        ("weights", weights or "true"),
        ("generations", generations.probe_command(probe.restore)),
    )
    extra = "; ".join(f"printf '\\n%s\\n' '{MARK}{name}'; {command}" for name, command in probes)
    return f"{SCRIPT}; {extra}; true"


def host_findings(report: HostReport, spec: HostSpec) -> list[Finding]:
    """Warnings about this host that do not stop it serving (host-* rules), each with how to act on it."""
    v, host = spec.vars, spec.host
    warnings = []
    if v.tune_kernel_cmdline and report.missing_kernel_args and not v.tune_reboot:
        warnings.append(
            finding(
                "host-reboot-required",
                host,
                "tune_kernel_cmdline",
                f"kernel command line lacks {' '.join(report.missing_kernel_args)}: reboot required (or set tune_reboot = True)",
            )
        )
    if v.tune_numa_balancing and report.numa_balancing is None:
        warnings.append(
            finding(
                "host-numa-balancing",
                host,
                "tune_numa_balancing",
                "kernel.numa_balancing does not exist (kernel without NUMA balancing): nothing to turn off",
            )
        )
    if not report.hf_token:
        warnings.append(
            finding(
                "host-hf-token",
                host,
                "hf_token_path",
                f"no Hugging Face token at {v.hf_token_path}: gated models will fail to download",
            )
        )
    return warnings


def restore_problems(report: HostReport, spec: HostSpec, restore: str) -> list[Finding]:
    """Why ``instinct-fleet rollback`` cannot put back generation ``restore`` on this host; empty when it can."""
    found = report.generations
    have = " ".join(map(str, found.numbers)) or "none"
    if found.restore is None and restore == "previous":
        # Nothing older passed the gate here: the change did not touch this host (a Ray worker whose files
        # stayed the same), or it is the first generation. The host keeps what it runs.
        return []
    if found.restore is None:
        why = f"no generation {restore} on this host (generations: {have}; healthy: {found.healthy})"
        return [finding("host-generation", spec.host, "--to", why)]
    wanted = {p for unit in spec.serving_units for p in (paths.unit_path(unit), paths.unit_env_path(unit))}
    if set(found.restore_files) != wanted:
        kept = sorted(p.rsplit("/", 1)[-1] for p in found.restore_files)
        why = f"generation {found.restore} holds {', '.join(kept) or 'nothing'}, the inventory's serving units need {', '.join(sorted(p.rsplit('/', 1)[-1] for p in wanted))}"
        return [finding("host-generation", spec.host, "--to", f"{why}: deploy an inventory with those instances instead")]
    return []


def hard_problems(report: HostReport, spec: HostSpec) -> list[Finding]:
    """Why this host cannot serve its instances, each with its rule and how to fix it. Empty when it can."""
    host = spec.host
    problems = []
    if not report.is_debian_family:
        problems.append(
            finding(
                "host-os",
                host,
                "preflight.os",
                f"the host runs {report.os_id or 'an unknown OS'}; instinct-fleet installs packages and regenerates GRUB on Debian and Ubuntu only",
            )
        )
    if report.smi is None:
        problems.append(
            finding(
                "host-gpu",
                host,
                "preflight.smi",
                "no AMD GPU found: neither amd-smi nor rocm-smi is installed. Install ROCm (amdgpu-install --usecase=rocm) "
                "or remove the host from the inventory",
            )
        )
    elif report.smi_error:
        problems.append(finding("host-gpu", host, "preflight.smi", report.smi_error))
    elif not report.gpus:
        problems.append(
            finding(
                "host-gpu",
                host,
                "preflight.smi",
                f"{report.smi} lists no GPU: check that the amdgpu driver is loaded (dmesg | grep amdgpu)",
            )
        )
    if not report.kfd:
        problems.append(
            finding(
                "host-driver",
                host,
                "preflight./dev/kfd",
                "/dev/kfd is missing: the amdgpu kernel driver is not loaded. Install amdgpu-dkms or load the module (modprobe amdgpu)",
            )
        )
    if report.smi is not None and not report.amdgpu_loaded:
        problems.append(
            finding(
                "host-driver",
                host,
                "preflight.amdgpu",
                "the amdgpu module is not live (/sys/module/amdgpu/initstate): modprobe amdgpu, then check dmesg",
            )
        )
    if problems:
        return problems
    models = sorted({g.model or g.market_name for g in report.gpus})
    if models != [spec.gpu_model]:
        problems.append(
            finding(
                "host-gpu-model",
                host,
                "gpu_model",
                f"gpu_model is {spec.gpu_model} but {report.smi} reports {', '.join(models)}: set gpu_model for this host or group",
            )
        )
    needed = max([g + 1 for svc in spec.services for g in svc.gpus] or [0])
    if len(report.gpus) < max(needed, spec.gpu_count):
        problems.append(
            finding(
                "host-gpu-count",
                host,
                "gpu_count",
                f"{len(report.gpus)} GPUs visible, but gpu_count is {spec.gpu_count} and the instances use GPU indices up to {needed - 1}. "
                f"Check the partition mode (compute {report.compute_partition or 'unknown'}) with amd-smi static --partition, or lower gpu_count",
            )
        )
    cluster = spec.cluster
    if cluster is not None and len(report.gpus) > spec.gpu_count:
        problems.append(
            finding(
                "host-gpu-count",
                host,
                "gpu_count",
                f"{len(report.gpus)} GPUs visible but gpu_count is {spec.gpu_count}: Ray would offer them all to the cluster; "
                "set gpu_count to the GPUs of each node",
            )
        )
    if cluster is not None and cluster.nic is not None and cluster.nic not in report.addresses:
        have = ", ".join(sorted(report.addresses)) or "none with IPv4"
        problems.append(
            finding(
                "host-cluster-nic",
                host,
                "cluster_nic",
                f"cluster_nic {cluster.nic} has no IPv4 address on this host (interfaces: {have}): set cluster_nic for this host or group",
            )
        )
    if cluster is not None and cluster.infiniband and not report.infiniband:
        problems.append(
            finding(
                "host-driver",
                host,
                "infiniband",
                "infiniband is True but /dev/infiniband is missing: install the RDMA drivers (rdma-core) or set infiniband = False",
            )
        )
    problems += api_key_problems(spec, report)
    used = range(spec.gpu_count) if cluster is not None else sorted({g for svc in spec.services for g in svc.gpus})
    missing = sorted({g for g in used if g < len(report.gpus) and report.gpus[g].render_node is None})
    if missing:
        problems.append(
            finding(
                "host-driver",
                host,
                "preflight./dev/dri",
                f"no /dev/dri render node found for GPUs {missing}: check /dev/dri/by-path and the udev rules of the amdgpu driver",
            )
        )
    return problems


def api_key_problems(spec: HostSpec, report: HostReport) -> list[Finding]:
    """``vllm_api_key_path`` must be a non-empty file that only root can read: it holds the key every client needs."""
    path = spec.vars.vllm_api_key_path
    if path is None:
        return []
    fields = (report.api_key or "").split("|")
    if len(fields) != 3:
        return [
            finding("host-api-key", spec.host, "vllm_api_key_path", f"{path} does not exist: write the key there (umask 077), one line")
        ]
    mode, owner, size = fields
    if owner != "root" or int(mode, 8) & 0o077:
        return [
            finding(
                "host-api-key",
                spec.host,
                "vllm_api_key_path",
                f"{path} is mode {mode}, owner {owner}: only root may read it (chown root {path}; chmod 600 {path})",
            )
        ]
    if size == "0":
        return [finding("host-api-key", spec.host, "vllm_api_key_path", f"{path} is empty: write the key there, one line")]
    return []


def render_nodes(report: HostReport, gpus: tuple[int, ...]) -> list[str]:
    """``/dev/dri/renderD*`` paths of these GPU indices (hard_problems has checked they exist)."""
    return [f"{paths.DRI}/{report.gpus[g].render_node}" for g in gpus]
