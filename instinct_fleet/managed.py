"""The one declaration of what a host's deploy manages: every file, directory and unit, once.

Each entry says what it is, where, with which mode and owner, which stage
converges it, what a change of it restarts, and how its content is made. The
entries a host has follow from its spec alone (:func:`declare`); their content
may also need the preflight facts, and is made only when the plan is evaluated.
Everyone reads this table:

- the preflight fact reads the state of exactly the declared paths and units
  (:func:`probe`, the table's spec-only projection);
- the host plan's desired state is the table evaluated (:func:`desired`);
- the stages converge the entries that drifted (:mod:`instinct_fleet.apply`);
- the roll restarts what a drifted entry ``restarts`` (:mod:`instinct_fleet.roll`);
- the verify module and ``plan --explain`` compare a host with the same entries.

Adding a managed file is one entry here and its template, nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from instinct_fleet import content, paths, render
from instinct_fleet.hostplan import HostPlan
from instinct_fleet.preflight import Probe
from instinct_fleet.spec import HostSpec
from instinct_fleet.state import Desired, Directory, Endpoint, File, Stage, Unit, User, Weights


class _Skip:
    """Content of an entry this host does not manage in its current state (neither written nor removed)."""


SKIP = _Skip()
Made = bytes | None | _Skip  # bytes: the file's content; None: must be absent; SKIP: not managed here


class Rendered:
    """A plan's rendered content, each piece made once per evaluation of the table."""

    def __init__(self, plan: HostPlan) -> None:
        self.plan = plan

    @cached_property
    def units(self) -> dict[str, tuple[str, str]]:
        """Per serving unit, its unit and env file: rendered, or a generation's (``instinct-fleet rollback``)."""
        kept = self.plan.restoring
        if kept is None:
            return content.serving_units(self.plan)
        units = self.plan.spec.serving_units
        return {u: (kept[paths.unit_path(u)].decode(), kept[paths.unit_env_path(u)].decode()) for u in units}

    @cached_property
    def firewall(self) -> str | None:
        return content.firewall(self.plan)


@dataclass(frozen=True)
class Entry:
    """One managed file (``directory`` False) or directory; ``make`` gives its content from the rendered plan."""

    path: str
    stage: Stage
    label: str
    make: Callable[[Rendered], Made]
    mode: str | None = "644"
    owner: str = "root"
    group: str = "root"
    restarts: str | None = None
    directory: bool = False


@dataclass(frozen=True)
class UnitEntry:
    """One managed unit; ``want`` gives its wanted state from the rendered plan (None: not managed here)."""

    name: str
    want: Callable[[Rendered], Unit | None]


def _text(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


def _local(path: str) -> bytes:
    return Path(path).read_bytes()  # validation (local-file) has checked it exists


def _read(source: str) -> Callable[[Rendered], Made]:
    return lambda _r: _local(source)


def _serving_file(unit: str, which: int) -> Callable[[Rendered], Made]:
    """A serving unit's unit file (0) or env file (1)."""
    return lambda r: r.units[unit][which].encode()


def _running(unit: str) -> Callable[[Rendered], Unit | None]:
    return lambda _r: Unit(unit)


def _when(condition: bool, make: Callable[[Rendered], Made]) -> Callable[[Rendered], Made]:
    return make if condition else (lambda _r: SKIP)


def _removed_when_off(on: bool, path: str, make: Callable[[Rendered], Made]) -> Callable[[Rendered], Made]:
    """Written while ``on``; switched off, removed if an earlier deploy left it, else not managed."""
    return make if on else (lambda r: None if path in r.plan.report.stats else SKIP)


def declare(spec: HostSpec) -> tuple[tuple[Entry, ...], tuple[UnitEntry, ...]]:
    """Every file, directory and unit this host's deploy may write, remove or run, from its spec alone."""
    v, cluster = spec.vars, spec.cluster
    exporter_unit = paths.unit_path(paths.EXPORTER_UNIT)
    entries = [
        # Stage 2, tuning.
        Entry(
            paths.SYSCTL_FILE,
            "tuning",
            "NUMA balancing off at boot",
            _when(v.tune_numa_balancing, lambda r: render.sysctl_file().encode() if r.plan.report.numa_balancing is not None else SKIP),
        ),
        Entry(
            paths.GRUB_DROP_IN,
            "tuning",
            f"GRUB drop-in: {' '.join(paths.KERNEL_ARGS)}",
            _when(v.tune_kernel_cmdline, lambda _r: render.grub_drop_in().encode()),
        ),
        Entry(
            paths.REBOOT_MARKER,
            "tuning",
            "Report: reboot required",
            _when(v.tune_kernel_cmdline and not v.tune_reboot, lambda r: b"" if r.plan.report.missing_kernel_args else SKIP),
        ),
        Entry(
            paths.unit_path(paths.CPU_IDLE_UNIT),
            "tuning",
            "CPU idle unit",
            _when(v.tune_cpu_idle, lambda _r: render.cpu_idle_unit().encode()),
            restarts=paths.CPU_IDLE_UNIT,
        ),
        # Stage 3, container runtime: dockerd's settings restart it, so a serving host changes them in its roll batch.
        Entry(
            paths.DAEMON_JSON,
            "docker",
            f"docker settings {paths.DAEMON_JSON}",
            lambda _r: render.daemon_json(v).encode(),
            restarts=paths.DOCKER_UNIT,
        ),
        Entry(
            paths.DOCKER_DROP_IN,
            "docker",
            f"docker settings {paths.DOCKER_DROP_IN}",
            lambda r: _text(content.docker_drop_in(r.plan)),
            restarts=paths.DOCKER_UNIT,
        ),
        *(
            Entry(paths.ca_path(registry), "runtime", f"CA certificate for {registry}", _read(source))
            for registry, source in sorted(v.docker_registry_ca_certs.items())
        ),
        Entry(
            paths.CREDENTIALS,
            "runtime",
            "Registry credentials",
            lambda _r: SKIP if v.docker_credentials_file is None else _local(v.docker_credentials_file),
            mode="600",
        ),
        # Stage 5, Ray cluster.
        Entry(
            paths.RAY_TMP, "cluster", "Shared Ray session directory", _when(cluster is not None, lambda _r: b""), mode=None, directory=True
        ),
        Entry(
            paths.RAY_READY_SCRIPT,
            "cluster",
            "Ray readiness script",
            _when(cluster is not None, lambda _r: render.template_bytes("ray-ready.py")),
        ),
        # Stage 6, firewall.
        Entry(
            paths.FIREWALL_FILE,
            "firewall",
            f"nftables table {paths.FIREWALL_TABLE}",
            lambda r: SKIP if r.firewall is None else r.firewall.encode(),
            mode="600",
            restarts=paths.FIREWALL_UNIT,
        ),
        Entry(
            paths.unit_path(paths.FIREWALL_UNIT),
            "firewall",
            "Firewall unit",
            lambda r: SKIP if r.firewall is None else render.firewall_unit().encode(),
            restarts=paths.FIREWALL_UNIT,
        ),
        # Stage 7, device metrics exporter.
        Entry(
            exporter_unit,
            "exporter",
            f"Metrics exporter {exporter_unit}",
            _removed_when_off(v.metrics_exporter, exporter_unit, lambda r: content.exporter_unit(r.plan).encode()),
            restarts=paths.EXPORTER_UNIT,
        ),
        Entry(
            paths.EXPORTER_CONFIG,
            "exporter",
            f"Metrics exporter {paths.EXPORTER_CONFIG}",
            _removed_when_off(
                v.metrics_exporter,
                paths.EXPORTER_CONFIG,
                lambda _r: render.exporter_config(v.metrics_exporter_port, v.metrics_exporter_fields).encode(),
            ),
            restarts=paths.EXPORTER_UNIT,
        ),
        # Stage 8, services and the roll.
        Entry(paths.CONFIG_DIR, "services", "Config directory", lambda _r: b"", mode="755", directory=True),
        Entry(paths.GENERATIONS_DIR, "services", "Generations directory", lambda _r: b"", mode="700", directory=True),
        Entry(
            v.hf_cache_dir,
            "services",
            "Hugging Face cache",
            lambda _r: b"",
            mode="750",
            owner=v.service_user,
            group=v.service_user,
            directory=True,
        ),
    ]
    for unit in spec.serving_units:
        entries.append(Entry(paths.unit_path(unit), "roll", f"{unit} unit", _serving_file(unit, 0), restarts=unit))
        entries.append(Entry(paths.unit_env_path(unit), "roll", f"{unit} env file", _serving_file(unit, 1), mode="600", restarts=unit))
    entries.append(Entry(paths.ROLL_MARKER, "roll", "Roll: done on this host", lambda _r: None))  # a finished roll leaves none behind

    exporter_on = v.metrics_exporter
    units = [
        UnitEntry(paths.DOCKER_UNIT, lambda _r: Unit(paths.DOCKER_UNIT)),
        UnitEntry(paths.CPU_IDLE_UNIT, lambda _r: Unit(paths.CPU_IDLE_UNIT, running=None) if v.tune_cpu_idle else None),
        UnitEntry(paths.FIREWALL_UNIT, lambda r: Unit(paths.FIREWALL_UNIT) if r.firewall is not None else None),
        UnitEntry(
            paths.EXPORTER_UNIT,
            lambda r: (
                Unit(paths.EXPORTER_UNIT)
                if exporter_on
                else (Unit(paths.EXPORTER_UNIT, enabled=False, running=False) if exporter_unit in r.plan.report.stats else None)
            ),
        ),
        *(UnitEntry(unit, _running(unit)) for unit in spec.serving_units),
    ]
    return tuple(entries), tuple(units)


def probe(spec: HostSpec) -> Probe:
    """What the preflight fact reads besides the hardware: the declared paths and units, before any fact."""
    entries, units = declare(spec)
    return Probe(
        tuple(dict.fromkeys(e.path for e in entries)),
        tuple(paths.service(u.name) for u in units),
        spec.vars.service_user,
        spec.services[0].image if spec.services else None,
        tuple((svc.port, render.served_model(svc), render.generates(svc)) for svc in spec.serves),
        tuple((w.source, w.local) for w in weights_of(spec)),
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
        Weights(model, rev, render.repo_dir(source, model), render.repo_dir(spec.vars.hf_cache_dir, model)) for model, rev in wanted
    )


def service_user(spec: HostSpec) -> User:
    """The user the deploy runs vLLM's files as: in the device groups, its home the Hugging Face cache."""
    v = spec.vars
    return User(v.service_user, paths.DEVICE_GROUPS, v.hf_cache_dir, paths.SERVICE_USER_SHELL)


def desired(plan: HostPlan) -> Desired:
    """The declaration evaluated for this host: everything it should have, and what it must no longer have."""
    spec = plan.spec
    rendered = Rendered(plan)
    entries, unit_entries = declare(spec)
    files: list[File] = []
    directories: list[Directory] = []
    for e in entries:
        made = e.make(rendered)
        if isinstance(made, _Skip):
            continue
        if e.directory:
            directories.append(Directory(e.path, e.mode, e.stage, e.label, e.owner, e.group))
        else:
            files.append(File(e.path, made, e.stage, e.label, e.mode or "644", e.owner, e.group, e.restarts))
    units = [want for want in (u.want(rendered) for u in unit_entries) if want is not None]
    # Units an earlier deploy wrote for instances or a role no longer here (the fact globs for them).
    wanted = {f.path for f in files}
    for stale in plan.stale_units:
        for path in (paths.unit_path(stale), paths.unit_env_path(stale)):
            if path not in wanted:
                label = f"Remove {stale}" if path.endswith(".service") else f"Remove {stale} env"
                files.append(File(path, None, "roll", label, restarts=stale))
        units.append(Unit(stale, enabled=False, running=False))
    sysctl = {"kernel.numa_balancing": "0"} if any(f.path == paths.SYSCTL_FILE for f in files) else {}
    return Desired(
        files=tuple(files),
        directories=tuple(directories),
        units=tuple(units),
        groups=paths.DEVICE_GROUPS,
        user=service_user(spec),
        sysctl=sysctl,
        image=plan.image if spec.services else None,
        firewall=rendered.firewall is not None,
        serving=tuple(rendered.units),
        endpoints=tuple(Endpoint(paths.vllm_unit(s.name), s.port, render.served_model(s), render.generates(s)) for s in plan.serves),
        weights=weights_of(spec),
        exporter_image=exporter_image(spec),
    )


def untouched(plan: HostPlan) -> Desired:
    """The desired state of a host that failed preflight: the run manages nothing on it (its stages do not run)."""
    return Desired(files=(), directories=(), units=(), groups=(), user=service_user(plan.spec), sysctl={}, image=None, firewall=False)
