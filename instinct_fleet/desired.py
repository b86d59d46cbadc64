"""What one host should look like: every file, directory, unit, group, image and endpoint the deploy manages.

:class:`Desired` is built from a host's plan (spec plus preflight facts) and read
by three parties: the deploy's stages act on what differs from it
(:meth:`Desired.drift`), the verify module checks a host against it, and the
preflight fact reads the actual state of exactly what it names
(:func:`probe`). A re-tune that changes nothing therefore runs that one fact and
nothing else on the host.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from instinct_fleet import paths, render
from instinct_fleet.paths import CONFIG_DIR, DAEMON_JSON, DOCKER_DROP_IN
from instinct_fleet.spec import HostSpec

if TYPE_CHECKING:
    from instinct_fleet.hostplan import HostPlan
    from instinct_fleet.preflight import HostReport


@dataclass(frozen=True)
class File:
    """A file with this content (None: the file must be absent), mode and owner."""

    path: str
    content: bytes | None
    mode: str = "644"
    owner: str = "root"
    group: str = "root"

    @property
    def sha256(self) -> str | None:
        return None if self.content is None else hashlib.sha256(self.content).hexdigest()


@dataclass(frozen=True)
class Directory:
    """A directory; ``mode`` None leaves the mode to whoever uses it (Ray sets 1777 on its own)."""

    path: str
    mode: str | None
    owner: str = "root"
    group: str = "root"


@dataclass(frozen=True)
class Unit:
    """A unit's wanted state; ``running`` None: whatever its conditions make it (the CPU idle unit in a VM)."""

    name: str  # with .service
    enabled: bool = True
    running: bool | None = True


@dataclass(frozen=True)
class Endpoint:
    """A vLLM instance that must answer /health and list ``served`` in /v1/models."""

    unit: str
    port: int
    served: str


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]
    home: str
    shell: str = "/usr/sbin/nologin"


@dataclass(frozen=True)
class Weights:
    """A model copied from ``weights_source`` (``source``) into the host's HF cache (``local``) before its first start."""

    model: str
    revision: str
    source: str
    local: str


@dataclass(frozen=True)
class Desired:
    files: tuple[File, ...]
    directories: tuple[Directory, ...]
    units: tuple[Unit, ...]
    groups: tuple[str, ...]
    user: User
    sysctl: dict[str, str]
    image: str | None
    firewall: bool
    endpoints: tuple[Endpoint, ...] = field(default_factory=tuple)
    weights: tuple[Weights, ...] = field(default_factory=tuple)
    exporter_image: str | None = None

    def file(self, path: str) -> File:
        return next(f for f in self.files if f.path == path)


@dataclass(frozen=True)
class Probe:
    """What the preflight fact reads besides the hardware: derived from the spec alone, before any fact."""

    paths: tuple[str, ...]
    units: tuple[str, ...]
    user: str
    image: str | None
    endpoints: tuple[tuple[int, str], ...]
    weights: tuple[tuple[str, str], ...] = ()  # (repository in weights_source, repository in hf_cache_dir)
    exporter_image: str | None = None
    api_key_path: str | None = None  # vllm_api_key_path: /v1 answers only with the key, and its file must be root's alone


def probe(spec: HostSpec) -> Probe:
    """The paths, units and endpoints this host's deploy may touch, so the fact can read their state."""
    settings = spec.settings
    files = [paths.SYSCTL_FILE, paths.GRUB_DROP_IN, paths.REBOOT_MARKER, render.unit_path(paths.CPU_IDLE_UNIT)]
    files += [DAEMON_JSON, DOCKER_DROP_IN, paths.CREDENTIALS, *(f"{paths.CA_DIR}/{r}/ca.crt" for r in sorted(settings.registry_ca_certs))]
    files += [CONFIG_DIR, settings.hf_cache_dir, paths.RAY_TMP, paths.RAY_READY_SCRIPT, paths.RAY_ENV]
    files += [paths.FIREWALL_FILE, render.unit_path(paths.FIREWALL_UNIT), paths.ROLL_MARKER]
    files += [render.unit_path(paths.EXPORTER_UNIT), paths.EXPORTER_CONFIG]
    units = ["docker.service", paths.CPU_IDLE_UNIT, paths.FIREWALL_UNIT, f"{paths.EXPORTER_UNIT}.service"]
    for svc in spec.services:
        files += [render.unit_path(render.unit_name(svc)), render.env_path(svc)]
        units.append(f"{render.unit_name(svc)}.service")
    if settings.cluster is not None:
        ray = render.ray_unit(settings.cluster.role)
        files.append(render.unit_path(ray))
        units.append(f"{ray}.service")
    image = spec.services[0].image if spec.services else None
    endpoints = tuple((svc.port, render.served_model(svc)) for svc in spec.services)
    weights = tuple((w.source, w.local) for w in weights_of(spec))
    return Probe(
        tuple(dict.fromkeys(files)),
        tuple(dict.fromkeys(units)),
        settings.service_user,
        image,
        endpoints,
        weights,
        exporter_image(spec),
        spec.vars.vllm_api_key_path,
    )


def exporter_image(spec: HostSpec) -> str | None:
    """The device metrics exporter's image, when ``metrics_exporter`` is on."""
    return spec.vars.metrics_exporter_image if spec.vars.metrics_exporter else None


def weights_of(spec: HostSpec) -> tuple[Weights, ...]:
    """The models this host stages from ``weights_source``: every instance's (a Ray worker loads its share
    from its own cache too), except models given as a path."""
    source = spec.vars.weights_source
    if source is None:
        return ()
    wanted = {(svc.model, render.revision(svc)): None for svc in spec.services if not svc.model.startswith("/")}
    return tuple(
        Weights(model, rev, render.repo_dir(source, model), render.repo_dir(spec.settings.hf_cache_dir, model)) for model, rev in wanted
    )


def _local(path: str) -> bytes:
    return Path(path).read_bytes()  # validation (local-file) has checked it exists


def desired(plan: HostPlan) -> Desired:
    """The whole managed state of this host, from its plan."""
    spec, settings = plan.spec, plan.spec.settings
    files: list[File] = []
    units: list[Unit] = [Unit("docker.service")]
    directories = [Directory(CONFIG_DIR, "755"), Directory(settings.hf_cache_dir, "750", settings.service_user, settings.service_user)]
    sysctl = {}
    if settings.tune_numa_balancing and plan.report.numa_balancing is not None:
        sysctl["kernel.numa_balancing"] = "0"
        files.append(File(paths.SYSCTL_FILE, render.sysctl_file().encode()))
    if settings.tune_kernel_cmdline:
        files.append(File(paths.GRUB_DROP_IN, render.grub_drop_in().encode()))
        if not settings.tune_reboot and plan.report.missing_kernel_args:
            files.append(File(paths.REBOOT_MARKER, b""))
    if settings.tune_cpu_idle:
        files.append(File(render.unit_path(paths.CPU_IDLE_UNIT), render.cpu_idle_unit().encode()))
        units.append(Unit(paths.CPU_IDLE_UNIT, running=None))
    for path, content in plan.docker_files().items():
        files.append(File(path, None if content is None else content.encode()))
    for registry, source in sorted(settings.registry_ca_certs.items()):
        files.append(File(f"{paths.CA_DIR}/{registry}/ca.crt", _local(source)))
    if settings.credentials_file:
        files.append(File(paths.CREDENTIALS, _local(settings.credentials_file), "600"))
    if plan.role is not None:
        directories.append(Directory(paths.RAY_TMP, None))
        files.append(File(paths.RAY_READY_SCRIPT, render.template_bytes("ray-ready.py")))
    ruleset = plan.firewall()
    if ruleset is not None:
        files.append(File(paths.FIREWALL_FILE, ruleset.encode(), "600"))
        files.append(File(render.unit_path(paths.FIREWALL_UNIT), render.firewall_unit().encode()))
        units.append(Unit(paths.FIREWALL_UNIT))
    for name, unit_files in plan.unit_files.items():
        for path, content in unit_files.items():
            files.append(File(path, content.encode(), "644" if path.endswith(".service") else "600"))
        units.append(Unit(f"{name}.service"))
    exporter_unit = render.unit_path(paths.EXPORTER_UNIT)
    if spec.vars.metrics_exporter:
        files += [File(path, content.encode()) for path, content in plan.exporter_files().items()]
        units.append(Unit(f"{paths.EXPORTER_UNIT}.service"))
    elif exporter_unit in plan.report.stats:  # switched off: stopped, disabled and removed
        files += [File(exporter_unit, None), File(paths.EXPORTER_CONFIG, None)]
        units.append(Unit(f"{paths.EXPORTER_UNIT}.service", enabled=False, running=False))
    files.append(File(paths.ROLL_MARKER, None))  # a finished roll leaves none behind
    wanted = {f.path for f in files}
    for stale in plan.stale_units:
        files += [File(path, None) for path in (render.unit_path(stale), render.unit_env_path(stale)) if path not in wanted]
        units.append(Unit(f"{stale}.service", enabled=False, running=False))
    endpoints = tuple(Endpoint(f"{render.unit_name(s)}.service", s.port, render.served_model(s)) for s in plan.serves)
    return Desired(
        files=tuple(files),
        directories=tuple(directories),
        units=tuple(units),
        groups=("render", "video"),
        user=User(settings.service_user, ("render", "video"), settings.hf_cache_dir),
        sysctl=sysctl,
        image=plan.image if spec.services else None,
        firewall=ruleset is not None,
        endpoints=endpoints,
        weights=weights_of(spec),
        exporter_image=exporter_image(spec),
    )


def file_drifts(want: File, report: HostReport) -> bool:
    """Whether the host's file differs from ``want`` in presence, content, mode or owner."""
    have = report.stats.get(want.path)
    if want.content is None:
        return have is not None
    if have is None or have.kind != "regular file":
        return True
    return (report.file_hashes.get(want.path), have.mode, have.owner, have.group) != (want.sha256, want.mode, want.owner, want.group)


def directory_drifts(want: Directory, report: HostReport) -> bool:
    have = report.stats.get(want.path)
    if have is None or have.kind != "directory":
        return True
    return (want.mode is not None and have.mode != want.mode) or (have.owner, have.group) != (want.owner, want.group)


def unit_drifts(want: Unit, report: HostReport) -> bool:
    name = want.name.removesuffix(".service")
    running = want.running is not None and (name in report.active_units) != want.running
    return (name in report.enabled_units) != want.enabled or running
