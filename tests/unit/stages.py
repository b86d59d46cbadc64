"""Test harness for the stage decisions: (spec, fact) in, the operations a stage emits out.

pyinfra tests its operations on JSON fixtures of arguments and facts; this does
the same for this tool's stages. A :class:`SimHost` holds a host's managed state
and answers the preflight fact's probe as the fact's shell would, reading only
the paths and units the probe names (so a gap between the declaration and the
probe shows as drift here too). :func:`emitted` runs a real stage of
:mod:`instinct_fleet.deploys` with the pyinfra operations it calls replaced by a recorder, and returns the
name of every operation that would run, in order: each ``_if`` is evaluated as
pyinfra does at execution, every earlier operation counting as a change. The end-to-end suite runs the same
functions for real.
"""

from __future__ import annotations

import base64
import dataclasses
import fnmatch
import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gevent.event import AsyncResult
from pyinfra.context import ctx_host
from pyinfra.operations import apt, files, server, systemd

from instinct_fleet import deploys
from instinct_fleet.converge import evaluate, operations, preflight, state, steps
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.converge.probe import Probe
from instinct_fleet.converge.state import Endpoint, Stage
from instinct_fleet.model import paths
from instinct_fleet.model.inventory import HostData
from instinct_fleet.roll import measure
from instinct_fleet.roll.plan import FleetPlan, plan_inventory
from tests.unit.test_preflight import docker_section, mi300x_host

ROOT = Path(__file__).resolve().parents[2]
IMAGE_ID = "sha256:" + "a" * 64
STAGES = ("preflight", "tuning", "runtime", "weights", "cluster", "firewall", "exporter", "router", "services", "health")
DEPLOYS = {"services": "serving", "router": "routers"}  # a stage whose deploy function has another name


@dataclass
class SimHost:
    """The managed state of one host: what the deploy wrote, what runs, what answers."""

    files: dict[str, tuple[bytes, str, str, str]] = field(default_factory=dict)  # path -> content, mode, owner, group
    directories: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    enabled: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    user: tuple[str, str, str, tuple[str, ...]] | None = None  # name, home, shell, groups
    images: set[str] = field(default_factory=set)
    tables: set[str] = field(default_factory=set)  # loaded nftables tables
    healthy: set[int] = field(default_factory=set)
    numa_balancing: str = "1"
    cmdline: str = "BOOT_IMAGE=/vmlinuz-6.8.0-107-generic root=/dev/sda1 ro quiet iommu=pt"
    weights: dict[str, tuple[str, str]] = field(default_factory=dict)
    commands: set[str] = field(default_factory=lambda: {"curl"})
    # Generations (instinct_fleet/converge/generations.py): number -> the serving files it keeps; and the healthy one.
    generations: dict[int, dict[str, bytes]] = field(default_factory=dict)
    healthy_generation: int | None = None

    def serving_files(self) -> dict[str, bytes]:
        return {p: c for p, (c, *_rest) in self.files.items() if any(fnmatch.fnmatch(p, g) for g in paths.SERVING_FILES)}

    def _generations(self, restore: str | None) -> str:
        """As generations.probe_command answers (every generation here passed the gate)."""
        kept = self.generations.get(self.healthy_generation or 0, {})
        lines = [f"numbers: {' '.join(map(str, sorted(self.generations)))}", f"healthy: {self.healthy_generation or ''}"]
        lines += [f"{hashlib.sha256(c).hexdigest()}  .{p}" for p, c in kept.items()]
        if restore is not None:
            older = [n for n in self.generations if n < (self.healthy_generation or 0)]
            target = int(restore) if restore.isdigit() else max(older, default=None)
            if target in self.generations:
                lines.append(f"restore: {target}")
                for path, content in self.generations[target].items():
                    lines += [f"file: {path}", base64.b64encode(content).decode()]
        return "\n".join(lines)

    def read(self, probe: Probe, **sections: str) -> str:
        """The fact's output for ``probe``: only what it names (and the unit globs the fact always reads)."""
        read = [p for p in self.files if p in probe.paths or any(fnmatch.fnmatch(p, g) for g in paths.PROBED_GLOBS)]
        units = [
            p
            for p in self.files
            if any(fnmatch.fnmatch(p, g) for g in paths.UNIT_GLOBS) and b"Managed by instinct-fleet" in self.files[p][0]
        ]

        def named(unit: str) -> bool:
            return paths.service(unit) in probe.units or any(fnmatch.fnmatch(paths.service(unit), p) for p in paths.PROBED_PATTERNS)

        stat = [f"{m}|{o}|{g}|regular {'empty ' if not c else ''}file|{p}" for p in read for c, m, o, g in [self.files[p]]]
        stat += [f"{m}|{o}|{g}|directory|{p}" for p, (m, o, g) in self.directories.items() if p in probe.paths]
        user = ""
        if self.user is not None and self.user[0] == probe.user:
            name, home, shell, groups = self.user
            user = f"{name}:x:999:999::{home}:{shell}\n{name} {' '.join(groups)}"
        values = {
            "cmdline": self.cmdline,
            "files": "\n".join(f"{hashlib.sha256(self.files[p][0]).hexdigest()}  {p}" for p in read),
            "stat": "\n".join(stat),
            "units": "\n".join(units),
            "active": "\n".join(f"{paths.service(u)} loaded active running" for u in sorted(self.active) if named(u)),
            "enabled": "\n".join(f"{paths.service(u)} enabled enabled" for u in sorted(self.enabled) if named(u)),
            "user": user,
            "docker": docker_section({ref: IMAGE_ID if ref in self.images else "" for ref in probe.images}),
            "healthy": " ".join(str(port) for port, _, _ in probe.endpoints if port in self.healthy),
            "tables": "\n".join(t for t in probe.tables if t in self.tables),
            "sysctls": "\n".join(f"{key}|{self.numa_balancing}" for key in probe.sysctls if key == paths.NUMA_BALANCING),
            "weights": "\n".join(f"{s}|{self.weights.get(s, ('', ''))[0]}|{self.weights.get(s, ('', ''))[1]}" for s, _ in probe.weights),
            "commands": " ".join(sorted(self.commands)),
            "generations": self._generations(probe.restore),
            # The quarantine record, on one line as the fact's tr prints it (converge/gpuhealth.py reads it back).
            "quarantine": self.files[paths.QUARANTINE][0].decode().replace("\n", "") if paths.QUARANTINE in self.files else "",
            **sections,
        }
        return mi300x_host(**values)

    def replay(self, ops: list[Recorded], endpoints: tuple[Endpoint, ...]) -> None:
        """What the recorded operations do to this host, in order, as the real ones would; then the instances
        whose unit runs answer (``endpoints``: the plan's health checks)."""
        for op in ops:
            getattr(self, f"_{op.module}_{op.op}", lambda **_kw: None)(**op.kwargs)
        self.healthy = {e.port for e in endpoints if e.unit in self.active}

    def _files_put(self, src: Any, dest: str, mode: str | None = None, user: str = "root", group: str = "root", **_kw: Any) -> None:
        data = src.getvalue()
        self.files[dest] = (data.encode() if isinstance(data, str) else data, mode or "644", user, group)

    def _operations_secret_written(self, path: str, content: bytes, owner: str, group: str, **_kw: Any) -> None:
        self.files[path] = (content, "600", owner, group)

    def _files_file(self, path: str, present: bool = True, **_kw: Any) -> None:
        assert not present, "the deploy only removes files with files.file"
        self.files.pop(path, None)

    def _files_directory(self, path: str, mode: str | None, user: str, group: str, **_kw: Any) -> None:
        self.directories[path] = (mode or "1777", user, group)  # Ray sets 1777 on its session directory itself

    def _server_sysctl(self, key: str, value: object, **_kw: Any) -> None:
        assert key == paths.NUMA_BALANCING
        self.numa_balancing = str(value)

    def _server_user(self, user: str, home: str, shell: str, groups: list[str], **_kw: Any) -> None:
        self.user = (user, home, shell, tuple(sorted(groups)))

    def _server_reboot(self, **_kw: Any) -> None:
        self.cmdline += " " + " ".join(paths.KERNEL_ARGS)  # the GRUB drop-in's arguments, after update-grub

    def _loads(self, unit: str) -> None:
        if unit == paths.FIREWALL_UNIT and paths.FIREWALL_FILE in self.files:  # its ExecStart and ExecReload
            self.tables.add(paths.FIREWALL_TABLE)

    def _systemd_service(
        self,
        service: str,
        running: bool | None = True,
        restarted: bool = False,
        reloaded: bool = False,
        command: str | None = None,
        enabled: bool | None = None,
        **_kw: Any,
    ) -> None:
        unit = service.removesuffix(".service")
        if running is False:
            self.active.discard(unit)
            self.tables.discard(paths.FIREWALL_TABLE) if unit == paths.FIREWALL_UNIT else None
        if running or command == "restart" or (restarted and unit in self.active):
            self.active.add(unit)
            self._loads(unit)
        if reloaded and unit in self.active:
            self._loads(unit)
        if enabled is not None:
            (self.enabled.add if enabled else self.enabled.discard)(unit)

    def _operations_image_present(self, image: str, **_kw: Any) -> None:
        self.images.add(image)

    def _operations_weights_downloaded(self, revision: str, repo: str, **_kw: Any) -> None:
        self.weights[repo] = (f"{revision} 0123abc", self.weights.get(repo, ("", ""))[1])

    def _operations_weights_staged(self, source: str, **_kw: Any) -> None:
        self.weights[source] = (self.weights[source][0], self.weights[source][0])

    def _operations_generation_saved(self, number: int, healthy: bool, **_kw: Any) -> None:
        self.generations[number] = self.serving_files()
        if healthy:
            self.healthy_generation = number

    def _operations_generation_restored(self, number: int, **_kw: Any) -> None:
        for path in self.serving_files():
            self.files.pop(path)
        for path, data in self.generations[number].items():
            self.files[path] = (data, "600" if path.endswith(".env") else "644", "root", "root")

    def _apt_packages(self, **_kw: Any) -> None:
        self.commands |= {"nft", "cpupower", "python3"}  # what the tuning stage's packages install


def plan(
    data: dict[str, Any], sim: SimHost, peers: dict[str, dict[str, Any]] | None = None, restore: str | None = None, **sections: str
) -> HostPlan:
    """Host h1's plan from its host data and what ``sim`` answers to its probe; ``peers`` are more hosts
    (a cluster's other members), answering alike, each with its own address on eth0; ``restore``: the
    generation ``instinct-fleet rollback`` asks for."""
    hosts = [HostData("h1", ("gpu",), data), *(HostData(name, ("gpu",), peer) for name, peer in (peers or {}).items())]
    address = {h.name: f"2: eth0    inet 10.0.0.{i + 1}/24 brd 10.0.0.255 scope global eth0" for i, h in enumerate(hosts)}

    def read(specs: dict[str, Any]) -> dict[str, preflight.HostReport | None]:
        return {
            name: preflight.parse_report(
                sim.read(dataclasses.replace(evaluate.probe(spec), restore=restore), **{"interfaces": address[name], **sections})
            )
            for name, spec in specs.items()
        }

    return plan_inventory(hosts, {"h1"}, read, restore)["h1"]


class _Recorded:
    """What a recorded operation returns: one that ran counts as a change; one its ``_if`` skipped does not."""

    def __init__(self, ran: bool) -> None:
        self.ran = ran

    def did_change(self) -> bool:
        return self.ran


@dataclass(frozen=True)
class Recorded:
    """An operation that ran: its name, where it comes from, and its arguments (for :meth:`SimHost.replay`)."""

    name: str
    module: str
    op: str
    kwargs: dict[str, Any]


RECORDED = {
    files: ("put", "file", "directory"),
    server: ("sysctl", "shell", "reboot", "group", "user"),
    systemd: ("service", "daemon_reload"),
    apt: ("packages",),
    operations: (
        "image_present",
        "secret_written",
        "barrier",
        "healthy",
        "unit_verified",
        "fail",
        "hook",
        "weights_downloaded",
        "weights_staged",
        "generation_saved",
        "generation_restored",
        "router_pool_synced",
        "router_pools_left",
        "router_pools_joined",
    ),
    # The canary's benchmark and probe run on the canary host through the control machine (tests/unit/test_canary.py).
    measure: ("canary_measured",),
}


@contextmanager
def recording(monkeypatch: pytest.MonkeyPatch, sick: dict[str, int]) -> Iterator[list[Recorded]]:
    """Every pyinfra operation (and this tool's own) replaced by one that records its name; ``sick``: per
    unit, how many of its health gates fail (a gate that may hold the host, for a rollback, then does)."""
    names: list[Recorded] = []
    failed: list[str] = []

    def recorder(module: str, op: str) -> Any:
        def record(*_args: Any, name: str | None = None, _if: Any = None, **kwargs: Any) -> _Recorded:
            # pyinfra evaluates _if when it executes the operation: a gate that says no means no operation.
            if failed:  # pyinfra runs nothing more on a host that failed
                return _Recorded(False)
            conditions = _if if isinstance(_if, list) else [_if] if _if is not None else []
            ran = all(condition() for condition in conditions)
            if ran:
                names.append(Recorded(name or f"{module}.{op}", module, op, kwargs))
                failed.extend(["h1"] if op == "fail" else [])
                if op == "healthy" and sick.get(kwargs["unit"], 0) > 0:  # this gate fails, as the fact would say
                    sick[kwargs["unit"]] -= 1
                    if kwargs.get("hold") is not None:
                        kwargs["hold"]("h1", f"{kwargs['unit']}: not healthy")
            return _Recorded(ran)

        return record

    for module, ops in RECORDED.items():
        for op in ops:
            monkeypatch.setattr(module, op, recorder(module.__name__.rsplit(".", 1)[-1], op))
    yield names


@contextmanager
def staged(
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
    host_plan: HostPlan,
    interrupted: str | None = None,
    sick: dict[str, int] | None = None,
    called: bool = False,
) -> Iterator[tuple[Callable[[], object], list[Recorded]]]:
    """The deploy function of ``stage`` (:data:`DEPLOYS`) ready to run on this host (h1), with the list its operations
    are recorded into: the fleet plan is made first, as the run makes it before any stage (so a caller may time or
    trace the stage alone). ``interrupted``: a signal that arrived before the stage ran; ``sick``: failing health
    gates per unit (:func:`recording`); ``called``: through the function as a deploy.py calls it (only for a host it
    skips: pyinfra's own @deploy wrapper needs a real host), not its body."""
    fleet = FleetPlan.of({"h1": host_plan})
    fleet.journal.interrupted = interrupted
    done: AsyncResult = AsyncResult()
    done.set(fleet)
    state = SimpleNamespace(instinct_fleet_plan=done, failed_hosts=set())
    host = SimpleNamespace(name="h1", state=state, data=SimpleNamespace(), loop=lambda items: items)
    with monkeypatch.context() as patched, recording(patched, dict(sick or {})) as ops, ctx_host.use(host):
        function = getattr(deploys, DEPLOYS.get(stage, stage))
        yield (function if called else function._inner), ops  # _inner: the body, outside pyinfra's @deploy context


def run_stage(
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
    host_plan: HostPlan,
    interrupted: str | None = None,
    sick: dict[str, int] | None = None,
    called: bool = False,
) -> list[Recorded]:
    """The operations the deploy function of ``stage`` emits for this host (h1), in order (:func:`staged`)."""
    with staged(monkeypatch, stage, host_plan, interrupted, sick, called) as (body, ops):
        body()
    return ops


def emitted(
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
    host_plan: HostPlan,
    interrupted: str | None = None,
    sick: dict[str, int] | None = None,
) -> list[str]:
    """The names of the operations :func:`run_stage` records."""
    return [op.name for op in run_stage(monkeypatch, stage, host_plan, interrupted, sick)]


def drifted(host_plan: HostPlan) -> list[str]:
    """Every declared thing that differs on the host from the plan's desired state, as the preflight fact read it."""
    want, report = host_plan.desired, host_plan.report
    found = [f.path for f in want.files if state.file_drifts(f, report)]
    found += [d.path for d in want.directories if state.directory_drifts(d, report)]
    found += [u.name for u in want.units if state.unit_drifts(u, report)]
    found += [s.key for s in want.sysctls if state.sysctl_drifts(s, report)]
    found += [t.name for t in want.tables if state.table_drifts(t, report)]
    found += [i.ref for i in want.images if state.image_drifts(i, report)]
    found += [w.source for w in want.weights if state.weights_drift(w, report)]
    return found + ([want.user.name] if want.user is not None and state.user_drifts(want.user, report) else [])


def deploy(monkeypatch: pytest.MonkeyPatch, host_plan: HostPlan, sim: SimHost) -> list[Recorded]:
    """One deploy of h1: every stage of ``deploys.fleet`` in order, what they emit replayed on ``sim``; a host that
    fails preflight stops there, as the stages skip it."""
    ops: list[Recorded] = []
    for stage in STAGES if host_plan.ok else STAGES[:1]:
        ops += run_stage(monkeypatch, stage, host_plan)
    sim.replay(ops, host_plan.desired.endpoints)
    return ops


def declared(host_plan: HostPlan, stage: Stage) -> list[str]:
    """The operations that write what drifted of ``stage``'s declared entries, in the applier's order: the user's
    groups and the user, kernel settings, directories, files (written or removed), images and models; then a
    ``systemd-analyze verify`` of each unit file written and one reload of systemd when a file systemd reads
    changed. Read from the host plan's desired state, so that a new entry changes no list of expected operations."""
    want, report = host_plan.desired, host_plan.report
    names: list[str] = []
    if want.user is not None and want.user.stage == stage and state.user_drifts(want.user, report):
        names += [f"{g} group" for g in want.user.groups] + [f"Service user {want.user.name}"]
    names += [s.label for s in want.sysctls if s.stage == stage and state.sysctl_drifts(s, report)]
    names += [d.label for d in want.directories if d.stage == stage and state.directory_drifts(d, report)]
    files = [f for f in want.files if f.stage == stage and state.file_drifts(f, report)]
    names += [f.label for f in files]
    names += [i.label for i in want.images if i.stage == stage and state.image_drifts(i, report)]
    names += [f"Copy {w.model} into the Hugging Face cache" for w in want.weights if w.stage == stage and state.weights_drift(w, report)]
    units = [(unit, f) for f in files if f.content is not None and (unit := steps.unit_name(f.path)) is not None]
    names += [f"{unit} passes systemd-analyze verify" for unit, _ in units]
    if any(f.path.startswith(paths.SYSTEMD_DIR + "/") for f in files):
        names.append(f"Reload systemd ({steps.TITLES[stage]})")
    return names
