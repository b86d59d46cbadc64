"""The preflight fact's command: what a host really has, and the state of what its deploy manages, in one SSH round trip.

:data:`SCRIPT` reads the hardware, the driver and the OS; :func:`script` adds
the state of exactly what the declaration names (:class:`Probe`, projected from
the spec by :func:`instinct_fleet.converge.managed.probe`). It prints one section per
probe, so a host without ``amd-smi``, ``docker`` or ``/dev/dri`` still gives a
full report; :mod:`instinct_fleet.converge.preflight` parses it.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from instinct_fleet.converge import evidence, generations
from instinct_fleet.converge import health as health_checks
from instinct_fleet.model import paths
from instinct_fleet.model.paths import (
    DOCKER_SOCKET,
    PROBED_GLOBS,
    PROBED_PATTERNS,
    PYTHON3,
    ROUTER_SYNC,
    UNIT_GLOBS,
    WEIGHTS_COMPLETE,
    WEIGHTS_STAGED,
    router_watches,
    router_workers,
    sysctl_path,
)

MARK = "@@instinct-fleet:"

# In the docker section, after each image's answer: the image it was about.
IMAGE_MARK = "@@image:"


def docker_probe(images: tuple[str, ...]) -> str:
    """dockerd's version and the id of each of ``images``, from one curl through its socket: ``HEAD /_ping``
    (its ``Server: Docker/<version>`` header; ``/version`` also asks containerd, twice the cost) and each
    image's inspect JSON, each followed by an ``@@image:`` line naming it. Without curl or the socket, the
    docker CLI (a Go program: 20-40 ms a call) prints the same lines.
    """
    q = shlex.quote
    api = f"curl -sS -m 10 --unix-socket {DOCKER_SOCKET} -I http://docker/_ping"
    for image in images:
        mark = q("\\n" + IMAGE_MARK + image + "\\n")  # curl's -w reads \n as a newline
        api += f" --next -sS -m 10 --unix-socket {DOCKER_SOCKET} -w {mark} {q(f'http://docker/images/{image}/json')}"
    cli = "printf 'Server: Docker/%s\\n' \"$(docker version --format '{{.Server.Version}}' 2>/dev/null)\""
    for image in images:
        cli += f"; docker image inspect --format '{{{{.Id}}}}' {q(image)} 2>/dev/null; printf '\\n%s\\n' {q(IMAGE_MARK + image)}"
    return (
        f"if command -v curl >/dev/null 2>&1 && [ -S {DOCKER_SOCKET} ] && {api} 2>/dev/null; then :; "
        f"elif command -v docker >/dev/null 2>&1; then {cli}; fi"
    )


def first_line(path: str) -> str:
    """Shell: the first line of a one-line file, read by the shell itself (no process; a cat was one per file)."""
    return f'line=; read -r line 2>/dev/null <{path}; [ -n "$line" ] && printf \'%s\\n\' "$line"'


def _smi(command: str) -> str:
    """amd-smi with these arguments, its stderr merged (its warnings are not data: evidence.json_in skips them)."""
    return f"command -v amd-smi >/dev/null 2>&1 && amd-smi {command} 2>&1"


# The sections :func:`join` puts on one line: amd-smi's JSON, its indentation off (a JSON string never spans lines,
# so no value changes). The static JSON's 3000 lines were most of what a no-op run read, line by line, from every host.
ONE_LINE = tuple(name for name, _ in evidence.COMMANDS)
# One awk for every one-line section in a row, where a sed and a tr per command started 8 processes on every host.
_FLATTEN = f'awk \'index($0, "{MARK}") == 1 {{ printf "\\n%s\\n", $0; next }} {{ sub(/^[[:space:]]+/, ""); printf "%s", $0 }}\''


def join(probes: Iterable[tuple[str, str]]) -> str:
    """One shell script of ``probes`` (name, command): each prints its marker line, then its output. The sections
    of :data:`ONE_LINE` that follow one another share one pipe into one awk, which puts each on one line.
    """
    parts = []
    for one_line, group in itertools.groupby(probes, key=lambda probe: probe[0] in ONE_LINE):
        sections = "; ".join(f"printf '\\n%s\\n' '{MARK}{name}'; {command}" for name, command in group)
        parts.append(f"{{ {sections}; }} | {_FLATTEN}" if one_line else sections)
    return "; ".join(parts)


# Each probe is one section; a probe that fails leaves its section empty. Globs and read, the shell's own, where
# ls, grep and cat would start a process each: a no-op run pays for every process on every host.
HARDWARE: tuple[tuple[str, str], ...] = (
    # The static JSON, then the GPU health evidence (converge/evidence.py): ECC totals and blocks with the PCIe link,
    # bad pages, XGMI links; and where amd-smi gives no current PCIe link, sysfs's.
    *((name, _smi(command)) for name, command in evidence.COMMANDS),
    ("amd-smi-version", _smi("version --json")),
    ("pcie-links", evidence.PCIE_LINKS),
    ("quarantine", f"tr -d '\\n' 2>/dev/null <{paths.QUARANTINE}"),  # the record the last deploy left (converge/gpuhealth.py)
    ("rocm-smi", "command -v amd-smi >/dev/null 2>&1 || { command -v rocm-smi >/dev/null 2>&1 && rocm-smi --showproductname 2>&1; }"),
    ("kfd", f"test -c {paths.KFD} && echo present"),
    ("render-nodes", f'for node in {paths.DRI}/renderD*; do [ -e "$node" ] && echo "${{node##*/}}"; done'),
    ("render-by-path", f"ls -l {paths.DRI}/by-path 2>/dev/null"),  # the parser takes the -render links
    ("amdgpu-initstate", first_line("/sys/module/amdgpu/initstate")),
    ("amdgpu-version", first_line("/sys/module/amdgpu/version")),
    (
        "partitions",
        # "COMPUTE MEMORY" per GPU device, read by one awk (a shell loop ran three processes per GPU).
        'awk \'{ d = FILENAME; sub(/\\/[^\\/]*$/, "", d); if (FILENAME ~ /compute_partition$/) c[d] = $0; else m[d] = $0 } '
        "END { for (d in c) print c[d], m[d] }' /sys/module/amdgpu/drivers/pci:amdgpu/*/current_compute_partition "
        "/sys/module/amdgpu/drivers/pci:amdgpu/*/current_memory_partition 2>/dev/null",
    ),
    ("cmdline", first_line("/proc/cmdline")),
    ("os-release", "cat /etc/os-release 2>/dev/null"),
    ("groups", "getent group render video"),
    ("interfaces", "ip -o -4 addr show 2>/dev/null"),
    # The deploy's own connection, as sshd sets it: "client_address client_port server_address server_port". The
    # firewall keeps the port sshd answers on open, whatever port the inventory reaches it through (NAT, a bastion).
    ("ssh", "printf '%s\\n' \"$SSH_CONNECTION\""),
    ("commands", "for c in cpupower curl nft python3; do command -v $c >/dev/null 2>&1 && echo $c; done"),
    ("infiniband", "ls /dev/infiniband 2>/dev/null"),
    ("units", f"grep -l 'Managed by instinct-fleet' {' '.join(UNIT_GLOBS)} 2>/dev/null"),
    # What decides a restart: the files a unit runs from, and whether it is running now (roll.py).
)
# printf starts each marker on a new line: amd-smi's JSON does not end with one.
SCRIPT = join(HARDWARE)


@dataclass(frozen=True)
class Probe:
    """What the fact reads besides the hardware: instinct_fleet/converge/managed.py projects it from the spec, before any fact."""

    paths: tuple[str, ...]
    units: tuple[str, ...]  # with .service
    user: str
    images: tuple[str, ...]
    endpoints: tuple[tuple[int, str, bool], ...]  # port, served model, whether it generates
    weights: tuple[tuple[str, str], ...] = ()  # (repository in weights_source, repository in hf_cache_dir)
    tables: tuple[str, ...] = ()  # nftables tables, "family name"
    sysctls: tuple[str, ...] = ()  # kernel settings, "kernel.numa_balancing"
    api_key_path: str | None = None  # vllm_api_key_path: /v1 answers only with the key, and its file must be root's alone
    # a router host's pools (client port, the router's own port): how each running router's pool differs from its worker file
    router_ports: tuple[tuple[int, int], ...] = ()
    restore: str | None = None  # instinct-fleet rollback: the generation to read back ("previous" or a number)


def script(token_path: str, probe: Probe) -> str:
    """:data:`SCRIPT` plus the state of what this host's deploy manages (``probe``), in the same round trip."""
    q = shlex.quote
    paths = " ".join(q(p) for p in probe.paths)
    globs = " ".join(PROBED_GLOBS)
    units = " ".join(q(u) for u in probe.units)
    patterns = " ".join(q(p) for p in PROBED_PATTERNS)
    health = "; ".join(
        f"{health_checks.serving(port, served, probe.api_key_path, generates=generates)} && echo {port}"
        for port, served, generates in probe.endpoints
    )
    weights = "; ".join(
        f"printf '%s|%s|%s\\n' {q(source)} \"$(head -n1 {q(source + '/' + WEIGHTS_COMPLETE)} 2>/dev/null)\" "
        f'"$(head -n1 {q(local + "/" + WEIGHTS_STAGED)} 2>/dev/null)"'
        for source, local in probe.weights
    )
    # The sync script's --check (routers converge their running pool to the worker file without a restart).
    router_drift = "; ".join(
        f"[ -f {ROUTER_SYNC} ] && {PYTHON3} {ROUTER_SYNC} {admin} {q(router_workers(port))} {q(router_watches(port))} --check 2>/dev/null | sed 's/^/{port} /'"
        for port, admin in probe.router_ports
    )
    tables = "; ".join(f"nft list table {table} >/dev/null 2>&1 && echo {q(table)}" for table in probe.tables)
    # Each value read by the shell (a $(cat) forked a subshell and a cat per setting).
    sysctls = "; ".join(f"v=; read -r v 2>/dev/null <{q(sysctl_path(key))}; printf '%s|%s\\n' {q(key)} \"$v\"" for key in probe.sysctls)
    probes = (
        ("hf-token", f"test -r {q(token_path)} && echo present"),
        ("api-key", f"stat -c '%a|%U|%s' {q(probe.api_key_path)} 2>/dev/null" if probe.api_key_path else "true"),
        # sha256sum and stat of what the deploy manages, and of every unit and env file it ever wrote (stale ones too).
        ("files", f"sha256sum {paths} {globs} 2>/dev/null"),
        ("stat", f"stat -c '%a|%U|%G|%F|%n' {paths} {globs} 2>/dev/null"),
        ("active", f"systemctl list-units --state=active --plain --no-legend {patterns} {units} 2>/dev/null"),
        ("enabled", f"systemctl list-unit-files --state=enabled --plain --no-legend {patterns} {units} 2>/dev/null"),
        ("user", f"getent passwd {q(probe.user)} && id -nG {q(probe.user)}"),
        ("docker", docker_probe(probe.images)),
        ("healthy", health or "true"),
        ("tables", tables or "true"),
        ("sysctls", sysctls or "true"),
        ("weights", weights or "true"),
        ("generations", generations.probe_command(probe.restore)),
        ("router-drift", router_drift or "true"),
    )
    return f"{SCRIPT}; {join(probes)}; true"
