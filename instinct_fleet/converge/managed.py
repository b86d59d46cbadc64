"""The one declaration of what a host's deploy manages: every file, directory, unit, kernel setting, user,
image and firewall table, once, with how a change of it converges.

Each entry says what it is, where, with which mode and owner, which stage
converges it, what runs after it changed (its actions: restart or reload a
unit, run a command, reboot, or leave the restart to the roll), and how its
content is made. The entries a host has follow from its spec alone
(:func:`declare`); their content may also need the preflight facts, and is
made only when the plan is evaluated. Everyone reads this table: the preflight fact, the
host plan's desired state and ``plan --explain`` through :mod:`instinct_fleet.converge.evaluate`;
the one applier (:mod:`instinct_fleet.converge.apply`) writes what drifted, stage by stage, and
runs the actions; the roll restarts what a drifted entry leaves to it; the verify module
compares a host with the same entries. The entries' shapes are in
:mod:`instinct_fleet.converge.entries`.

Adding a managed file is one entry here and its template, nowhere else: the
stage named in the entry converges it (docs/development.md, Adding a managed thing).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable

from instinct_fleet.converge import content, firewall, routerwheel, system, templating
from instinct_fleet.converge.entries import (
    SKIP,
    Entry,
    FileEntry,
    ImageEntry,
    Made,
    Off,
    Rendered,
    SysctlEntry,
    TableEntry,
    UnitEntry,
    UserEntry,
    WeightsEntry,
)
from instinct_fleet.converge.state import (
    Action,
    Reboot,
    Reload,
    Restart,
    Roll,
    Run,
    Stage,
    Unit,
    User,
    Weights,
)
from instinct_fleet.model import paths, render, router, secrets
from instinct_fleet.model.pools import Pool
from instinct_fleet.model.spec import HostSpec


def _text(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


def _local(spec: HostSpec, path: str) -> bytes:
    return spec.local(path).read_bytes()  # validation (local-file) has checked it exists


def _read(spec: HostSpec, source: str) -> Callable[[Rendered], Made]:
    return lambda _r: _local(spec, source)


def _token(spec: HostSpec) -> Made:
    """The Hugging Face token the control machine holds (hf_token_source), one line; not managed without a source."""
    token, wrong = secrets.hf_token(spec)
    if wrong is not None:  # validation (hf-token-source) refused it before any host; it changed since
        raise ValueError(f"hf_token_source: {wrong}")
    return SKIP if token is None else f"{token}\n".encode()


def _serving_file(unit: str, which: int) -> Callable[[Rendered], Made]:
    """A serving unit's unit file (0) or env file (1)."""
    return lambda r: r.units[unit][which].encode() if unit in r.units else SKIP  # a quarantined unit keeps its files


def _running(unit: str) -> Callable[[Rendered], Unit | None]:
    """Running and enabled, in its roll batch; quarantined, stopped and disabled in the services stage, after its drain
    (deploys.serving), so that no roll starts it and no reboot does."""

    def want(r: Rendered) -> Unit:
        held = r.facts.quarantine
        if held is not None and unit in held.units:
            return Unit(unit, "services", enabled=False, running=False, why=f"quarantined: {held.reason(unit)}")
        return Unit(unit, "roll")

    return want


def _when(condition: bool, make: Callable[[Rendered], Made], off: str) -> Callable[[Rendered], Made]:
    """Managed while ``condition`` holds; else (``off`` says why) not managed on this host at all."""
    return make if condition else Off(off)


def _removed_when_off(on: bool, path: str, make: Callable[[Rendered], Made], off: str) -> Callable[[Rendered], Made]:
    """Written while ``on``; switched off (``off`` says why), removed if an earlier deploy left it, else not managed."""
    return make if on else Off(off, path)


def _unit_while(on: bool, name: str, stage: Stage, off: str) -> UnitEntry:
    """A unit that runs while ``on``; switched off (``off`` says why), stopped and disabled where a deploy left its file."""
    unit_file = paths.unit_path(name)
    return UnitEntry(
        name,
        stage,
        lambda r: (
            Unit(name, stage)
            if on
            else (Unit(name, stage, enabled=False, running=False, why=off) if unit_file in r.facts.report.stats else None)
        ),
        off=None if on else off,
    )


def _host_readme(r: Rendered) -> bytes:
    """What an operator on the host reads in paths.HOST_README: the units and files of this declaration."""
    files = [(e.path, e.mode or "-", f"{e.owner}:{e.group}") for e in r.declared if isinstance(e, FileEntry)]
    units = [e.name for e in r.declared if isinstance(e, UnitEntry)]
    return templating.template("host-readme.j2", units=units, files=files, generations=paths.GENERATIONS_DIR).encode()


def declare(spec: HostSpec) -> tuple[Entry, ...]:
    """Everything this host's deploy may write, remove, run, load or pull, from its spec alone."""
    v, cluster = spec.vars, spec.cluster
    exporter_unit = paths.unit_path(paths.EXPORTER_UNIT)
    grub_then: tuple[Action, ...] = (Run("Regenerate the GRUB configuration", "update-grub"),)
    if v.tune_reboot:
        grub_then += (Reboot("Reboot for the new kernel command line"),)
    entries: list[Entry] = [
        # Stage 2, tuning.
        SysctlEntry(
            paths.NUMA_BALANCING,
            "tuning",
            "NUMA balancing off now",
            lambda r: "0" if v.tune_numa_balancing and r.facts.report.numa_balancing is not None else None,
        ),
        FileEntry(
            paths.GRUB_DROP_IN,
            "tuning",
            f"GRUB drop-in: {' '.join(paths.KERNEL_ARGS)}",
            _when(v.tune_kernel_cmdline, lambda _r: system.grub_drop_in().encode(), "tune_kernel_cmdline is off"),
            then=grub_then,
        ),
        FileEntry(
            paths.SYSCTL_FILE,
            "tuning",
            "NUMA balancing off at boot",
            _when(
                v.tune_numa_balancing,
                lambda r: system.sysctl_file().encode() if r.facts.report.numa_balancing is not None else SKIP,
                "tune_numa_balancing is off",
            ),
        ),
        FileEntry(
            paths.REBOOT_MARKER,
            "tuning",
            "Report: reboot required",
            _when(
                v.tune_kernel_cmdline and not v.tune_reboot,
                lambda r: b"" if r.facts.report.missing_kernel_args else SKIP,
                "tune_kernel_cmdline is off, or tune_reboot reboots instead",
            ),
        ),
        FileEntry(
            paths.unit_path(paths.CPU_IDLE_UNIT),
            "tuning",
            "CPU idle unit",
            _when(v.tune_cpu_idle, lambda _r: system.cpu_idle_unit().encode(), "tune_cpu_idle is off"),
            then=(Restart(paths.CPU_IDLE_UNIT),),
        ),
        UnitEntry(
            paths.CPU_IDLE_UNIT,
            "tuning",
            lambda _r: Unit(paths.CPU_IDLE_UNIT, "tuning", running=None) if v.tune_cpu_idle else None,
            off=None if v.tune_cpu_idle else "tune_cpu_idle is off",
        ),
        UserEntry(service_user(spec)),
        # Stage 3, container runtime: dockerd's settings restart it, so a serving host changes them in its roll batch.
        FileEntry(
            paths.DAEMON_JSON,
            "docker",
            f"docker settings {paths.DAEMON_JSON}",
            lambda _r: system.daemon_json(v).encode(),
            then=(Restart(paths.DOCKER_UNIT),),
        ),
        FileEntry(
            paths.DOCKER_DROP_IN,
            "docker",
            f"docker settings {paths.DOCKER_DROP_IN}",
            lambda r: _text(system.docker_drop_in(r.facts)),
            then=(Restart(paths.DOCKER_UNIT),),
        ),
        UnitEntry(paths.DOCKER_UNIT, "docker", lambda _r: Unit(paths.DOCKER_UNIT, "docker")),
        *(
            FileEntry(paths.ca_path(registry), "runtime", f"CA certificate for {registry}", _read(spec, source))
            for registry, source in sorted(v.docker_registry_ca_certs.items())
        ),
        FileEntry(
            paths.CREDENTIALS,
            "runtime",
            "Registry credentials",
            Off("no docker_credentials_file")
            if (credentials := v.docker_credentials_file) is None
            else lambda _r: _local(spec, credentials),
            mode="600",
            secret=True,
        ),
        FileEntry(
            v.hf_token_path,
            "runtime",
            "Hugging Face token (hf_token_source)",
            Off("no hf_token_source: the operator places the token") if v.hf_token_source is None else lambda _r: _token(spec),
            mode="600",
            secret=True,
        ),
        # Compile caches: the root, the directory of each image this host serves, the script that readies one
        # before a unit starts (its image id, stale build locks, older images' caches), and the one that packs a
        # cache and merges a checked copy of one (the roll's spreading, instinct_fleet/roll/spread.py).
        *(
            [
                FileEntry(v.compile_cache_dir, "runtime", "Compile-cache root", lambda _r: b"", mode="755", directory=True),
                *(
                    FileEntry(cache, "runtime", f"Compile cache of {image}", lambda _r: b"", mode="755", directory=True)
                    for image, cache in sorted({svc.image: spec.compile_cache(svc) for svc in spec.services}.items())
                ),
                FileEntry(paths.CACHE_PREPARE, "runtime", "Compile-cache script", lambda _r: templating.template_bytes("cache-prepare.sh")),
                FileEntry(
                    paths.CACHE_SPREAD, "runtime", "Compile-cache copy script", lambda _r: templating.template_bytes("cache-spread.sh")
                ),
            ]
            if spec.services
            else []
        ),
        # The serving image: one seed host per image pulls first (deploys.runtime), then the rest.
        *([ImageEntry(spec.services[0].image, "pull", "vLLM image present")] if spec.services else []),
        # Stage 4, model weights (with weights_source).
        *(WeightsEntry(w) for w in weights_of(spec)),
        # Stage 5, Ray cluster.
        FileEntry(
            paths.RAY_TMP,
            "cluster",
            "Shared Ray session directory",
            _when(cluster is not None, lambda _r: b"", "no ray_cluster"),
            mode=None,
            directory=True,
        ),
        FileEntry(
            paths.RAY_READY_SCRIPT,
            "cluster",
            "Ray readiness script",
            _when(cluster is not None, lambda _r: templating.template_bytes("ray-ready.py"), "no ray_cluster"),
        ),
        # Stage 6, firewall.
        FileEntry(
            paths.FIREWALL_FILE,
            "firewall",
            f"nftables ruleset {paths.FIREWALL_FILE}",
            lambda r: SKIP if r.firewall is None else r.firewall.encode(),
            mode="600",
            then=(Reload(paths.FIREWALL_UNIT),),
        ),
        FileEntry(
            paths.unit_path(paths.FIREWALL_UNIT),
            "firewall",
            "Firewall unit",
            lambda r: SKIP if r.firewall is None else firewall.firewall_unit().encode(),
        ),
        UnitEntry(
            paths.FIREWALL_UNIT,
            "firewall",
            lambda r: Unit(paths.FIREWALL_UNIT, "firewall") if r.firewall is not None else None,
        ),
        # A table flushed by hand, under an active unit, is loaded again.
        TableEntry(
            paths.FIREWALL_TABLE,
            "firewall",
            f"nftables table {paths.FIREWALL_TABLE} loaded",
            lambda r: r.firewall is not None,
            then=(Reload(paths.FIREWALL_UNIT),),
        ),
        # Stage 7, device metrics exporter.
        *(
            [ImageEntry(v.metrics_exporter_image, "exporter", "Metrics exporter image present", then=(Restart(paths.EXPORTER_UNIT),))]
            if v.metrics_exporter
            else []
        ),
        FileEntry(
            exporter_unit,
            "exporter",
            f"Metrics exporter {exporter_unit}",
            _removed_when_off(
                v.metrics_exporter, exporter_unit, lambda r: system.exporter_unit(r.facts).encode(), "metrics_exporter is off"
            ),
            then=(Restart(paths.EXPORTER_UNIT),),
        ),
        FileEntry(
            paths.EXPORTER_CONFIG,
            "exporter",
            f"Metrics exporter {paths.EXPORTER_CONFIG}",
            _removed_when_off(
                v.metrics_exporter,
                paths.EXPORTER_CONFIG,
                lambda _r: system.exporter_config(v.metrics_exporter_port, v.metrics_exporter_fields).encode(),
                "metrics_exporter is off",
            ),
            then=(Restart(paths.EXPORTER_UNIT),),
        ),
        _unit_while(v.metrics_exporter, paths.EXPORTER_UNIT, "exporter", "metrics_exporter is off"),
        # Stage 8, vLLM's router: its release's files, launcher and sync script, and one unit and worker file per pool.
        *router_entries(spec),
        # Stage 9, services and the roll.
        FileEntry(paths.CONFIG_DIR, "services", "Config directory", lambda _r: b"", mode="755", directory=True),
        FileEntry(paths.HOST_README, "services", f"Operator's README {paths.HOST_README}", _host_readme),
        FileEntry(paths.GENERATIONS_DIR, "services", "Generations directory", lambda _r: b"", mode="700", directory=True),
        FileEntry(
            paths.QUARANTINE,
            "services",
            "GPU health quarantine record",
            lambda r: r.facts.quarantine.record if r.facts.quarantine is not None else None,
            mode="644",
        ),
        *watch_entries(spec),
        FileEntry(
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
        entries.append(FileEntry(paths.unit_path(unit), "roll", f"{unit} unit", _serving_file(unit, 0), then=(Roll(unit),)))
        entries.append(
            FileEntry(paths.unit_env_path(unit), "roll", f"{unit} env file", _serving_file(unit, 1), mode="600", then=(Roll(unit),))
        )
        entries.append(UnitEntry(unit, "roll", _running(unit)))
    entries.append(FileEntry(paths.ROLL_MARKER, "roll", "Roll: done on this host", lambda _r: None))  # a finished roll leaves none
    return tuple(entries)


def watch_entries(spec: HostSpec) -> list[Entry]:
    """The watch of a serving host (templates/watch.py, docs/rolling.md, Live engines): its script, the
    progress rule it imports, its config and unit, and its state directory; removed from a host where it is off."""
    on = spec.vars.watch and bool(spec.serves)
    restart = (Restart(paths.WATCH_UNIT),)
    unit_file = paths.unit_path(paths.WATCH_UNIT)

    why = "watch is off" if spec.serves else "the host serves no instance"

    def off(path: str, make: Callable[[Rendered], Made]) -> Callable[[Rendered], Made]:
        return _removed_when_off(on, path, make, why)

    return [
        FileEntry(paths.WATCH_DIR, "services", "Watch directory", _when(on, lambda _r: b"", why), mode="755", directory=True),
        FileEntry(paths.WATCH_STATE, "services", "Watch state directory", _when(on, lambda _r: b"", why), mode="700", directory=True),
        FileEntry(
            paths.WATCH_RULE,
            "services",
            "Watch: the progress rule",
            off(paths.WATCH_RULE, lambda _r: templating.watch_module("instinct_fleet.model", "liveness.py")),
            then=restart,
        ),
        FileEntry(
            paths.WATCH_EVIDENCE,
            "services",
            "Watch: the GPU evidence and its rules",
            off(paths.WATCH_EVIDENCE, lambda _r: templating.watch_module("instinct_fleet.converge", "evidence.py")),
            then=restart,
        ),
        FileEntry(
            paths.WATCH_SCRIPT,
            "services",
            "Watch script",
            off(paths.WATCH_SCRIPT, lambda _r: templating.template_bytes("watch.py")),
            then=restart,
        ),
        FileEntry(
            paths.WATCH_CONFIG,
            "services",
            "Watch config",
            off(paths.WATCH_CONFIG, lambda _r: content.watch_config(spec).encode()),
            then=restart,
        ),
        FileEntry(
            unit_file,
            "services",
            f"Watch {unit_file}",
            off(unit_file, lambda _r: system.watch_unit(spec.vars.watch_port).encode()),
            then=restart,
        ),
        _unit_while(on, paths.WATCH_UNIT, "services", why),
    ]


def router_entries(spec: HostSpec) -> list[Entry]:
    """A router host's files and units (none elsewhere): the wheel's members under the release's directory, whose
    content the controller reads from the pinned wheel (routerwheel), so each is probed and repaired like any file."""
    v = spec.vars
    if not spec.pools:
        return []
    restarts = tuple(Restart(p.unit) for p in spec.pools)
    table = router.load(v.router_version)
    assert table is not None  # validation (router-version)
    release = paths.router_dir(v.router_version)

    def member(name: str) -> Callable[[Rendered], Made]:
        return lambda _r: routerwheel.members(v.router_version, v.router_wheel)[name]

    entries: list[Entry] = [
        FileEntry(release, "router", f"vllm-router {v.router_version} directory", lambda _r: b"", mode="755", directory=True),
        *(
            FileEntry(f"{release}/{d}", "router", f"vllm-router {d}", lambda _r: b"", mode="755", directory=True)
            for d in sorted({posixpath.dirname(n) for n in table.members} - {""})
        ),
        *(FileEntry(f"{release}/{name}", "router", f"vllm-router {name}", member(name), then=restarts) for name in table.members),
        FileEntry(paths.ROUTER_CONFIG, "router", "Router config directory", lambda _r: b"", mode="755", directory=True),
        FileEntry(
            paths.ROUTER_LAUNCHER, "router", "Router launcher", lambda _r: templating.template_bytes("router-launch.py"), then=restarts
        ),
        FileEntry(
            paths.ROUTER_FRONT,
            "router",
            "Router front (the OpenAI routes alone)",
            lambda _r: templating.template_bytes("router-front.py"),
            then=restarts,
        ),
        FileEntry(paths.ROUTER_SYNC, "router", "Router pool sync script", lambda _r: templating.template_bytes("router-sync.py")),
    ]
    for pool in spec.pools:
        entries += _pool_entries(spec, pool)
    return entries


def sync_command(pool: Pool, wait: bool = False) -> str:
    """The sync script (router-sync.py) that converges a running router's pool to its worker list, never adding (and
    taking out) the workers that join after their own gate (``Pool.joining``); ``wait``: for a router the stage has just
    (re)started, which read every worker of its file."""
    q = shlex.quote
    joining = "".join(f" --joining {q(url)}" for url in sorted(pool.joining))
    waits = " --wait" if wait else ""
    return f"{paths.PYTHON3} {paths.ROUTER_SYNC} {pool.admin_port} {paths.router_workers(pool.port)} {paths.router_watches(pool.port)}{joining}{waits}"


def _pool_entries(spec: HostSpec, pool: Pool) -> list[Entry]:
    """One pool's worker file (the sync converges the running router to it, without a restart) and its unit."""
    unit_file = paths.unit_path(pool.unit)
    return [
        # Which worker's host runs a watch, and where it says whom it holds out: read by the sync script alone.
        FileEntry(
            paths.router_watches(pool.port),
            "router",
            f"Router watch list of {pool.model}",
            lambda _r: pool.watch_list.encode(),
        ),
        # A new list is applied to the running router at once: a worker gone from the inventory leaves its pool before
        # the roll stops it, one that answers joins (one that does not yet joins after its gate, in the roll).
        FileEntry(
            paths.router_workers(pool.port),
            "router",
            f"Router worker list of {pool.model}",
            lambda _r: pool.worker_list.encode(),
            then=(Run(f"Router pool of {pool.model}: synced to its new worker list", sync_command(pool)),),
        ),
        FileEntry(
            unit_file,
            "router",
            f"Router {pool.unit} for {pool.model}",
            lambda _r: content.router_unit(spec, pool).encode(),
            then=(Restart(pool.unit),),
        ),
        UnitEntry(pool.unit, "router", lambda _r: Unit(pool.unit, "router")),
    ]


def weights_of(spec: HostSpec) -> tuple[Weights, ...]:
    """The models this host stages from ``weights_source``: every instance's (a Ray worker loads its share
    from its own cache too), except models given as a path."""
    source = spec.vars.weights_source
    if source is None:
        return ()
    wanted = {(svc.model, render.revision(svc)): None for svc in spec.services if not svc.model.startswith("/")}
    return tuple(
        Weights(model, rev, render.repo_dir(source, model), render.repo_dir(spec.vars.hf_cache_dir, model), spec.vars.service_user)
        for model, rev in wanted
    )


def service_user(spec: HostSpec) -> User:
    """The user the deploy runs vLLM's files as: in the device groups, its home the Hugging Face cache."""
    v = spec.vars
    return User(v.service_user, paths.DEVICE_GROUPS, v.hf_cache_dir, paths.SERVICE_USER_SHELL, "tuning")
