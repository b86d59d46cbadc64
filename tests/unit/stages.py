"""Test harness for the stage decisions: (spec, fact) in, the operations a stage emits out.

pyinfra tests its operations on JSON fixtures of arguments and facts; this does
the same for this tool's stages. A :class:`SimHost` holds a host's managed state
and answers the preflight fact's probe as the fact's shell would, reading only
the paths and units the probe names (so a gap between the declaration and the
probe shows as drift here too). :func:`emitted` runs a real ``tasks/*.py`` file
with the pyinfra operations it calls replaced by a recorder, and returns the
name of every operation that would run, in order: each ``_if`` is evaluated as
pyinfra does at execution, every earlier operation counting as a change. The end-to-end suite runs the same
files for real.
"""

from __future__ import annotations

import base64
import dataclasses
import fnmatch
import hashlib
import runpy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gevent.event import AsyncResult
from pyinfra.context import ctx_host
from pyinfra.operations import apt, files, server, systemd

from instinct_fleet import managed, operations, paths, preflight
from instinct_fleet.hostplan import HostPlan
from instinct_fleet.inventory import HostData
from instinct_fleet.roll import plan_roll
from instinct_fleet.run import FleetPlan, plan_inventory
from instinct_fleet.state import Desired
from tests.unit.test_preflight import mi300x_host

ROOT = Path(__file__).resolve().parents[2]
IMAGE_ID = "sha256:" + "a" * 64


@dataclass
class SimHost:
    """The managed state of one host: what the deploy wrote, what runs, what answers."""

    files: dict[str, tuple[bytes, str, str, str]] = field(default_factory=dict)  # path -> content, mode, owner, group
    directories: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    enabled: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    user: tuple[str, str, str, tuple[str, ...]] | None = None  # name, home, shell, groups
    image: bool = False
    exporter_image: bool = False
    firewall_loaded: bool = False
    healthy: set[int] = field(default_factory=set)
    numa_balancing: str = "1"
    cmdline: str = "BOOT_IMAGE=/vmlinuz-6.8.0-107-generic root=/dev/sda1 ro quiet iommu=pt"
    weights: dict[str, tuple[str, str]] = field(default_factory=dict)
    commands: set[str] = field(default_factory=lambda: {"curl"})
    # Generations (instinct_fleet/generations.py): number -> the serving files it keeps; and the healthy one.
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

    def read(self, probe: preflight.Probe, **sections: str) -> str:
        """The fact's output for ``probe``: only what it names (and the unit globs the fact always reads)."""
        read = [p for p in self.files if p in probe.paths or any(fnmatch.fnmatch(p, g) for g in paths.RESTART_FILES)]
        units = [
            p
            for p in self.files
            if any(fnmatch.fnmatch(p, g) for g in paths.UNIT_GLOBS) and b"Managed by instinct-fleet" in self.files[p][0]
        ]

        def named(unit: str) -> bool:
            return paths.service(unit) in probe.units or any(fnmatch.fnmatch(paths.service(unit), p) for p in paths.UNIT_PATTERNS)

        stat = [f"{m}|{o}|{g}|regular {'empty ' if not c else ''}file|{p}" for p in read for c, m, o, g in [self.files[p]]]
        stat += [f"{m}|{o}|{g}|directory|{p}" for p, (m, o, g) in self.directories.items() if p in probe.paths]
        user = ""
        if self.user is not None and self.user[0] == probe.user:
            name, home, shell, groups = self.user
            user = f"{name}:x:999:999::{home}:{shell}\n{name} {' '.join(groups)}"
        values = {
            "numa_balancing": self.numa_balancing,
            "cmdline": self.cmdline,
            "files": "\n".join(f"{hashlib.sha256(self.files[p][0]).hexdigest()}  {p}" for p in read),
            "stat": "\n".join(stat),
            "units": "\n".join(units),
            "active": "\n".join(f"{paths.service(u)} loaded active running" for u in sorted(self.active) if named(u)),
            "enabled": "\n".join(f"{paths.service(u)} enabled enabled" for u in sorted(self.enabled) if named(u)),
            "user": user,
            "image": IMAGE_ID if self.image and probe.image else "",
            "healthy": " ".join(str(port) for port, _, _ in probe.endpoints if port in self.healthy),
            "nft": "loaded" if self.firewall_loaded else "",
            "weights": "\n".join(f"{s}|{self.weights.get(s, ('', ''))[0]}|{self.weights.get(s, ('', ''))[1]}" for s, _ in probe.weights),
            "exporter_image": IMAGE_ID if self.exporter_image and probe.exporter_image else "",
            "commands": " ".join(sorted(self.commands)),
            "generations": self._generations(probe.restore),
            **sections,
        }
        return mi300x_host(**values)

    def converge(self, want: Desired) -> None:
        """What a deploy that succeeded leaves: the desired state, everything running and answering."""
        for f in want.files:
            if f.content is None:
                self.files.pop(f.path, None)
            else:
                self.files[f.path] = (f.content, f.mode, f.owner, f.group)
        for d in want.directories:
            self.directories[d.path] = (d.mode or "1777", d.owner, d.group)
        for u in want.units:
            (self.enabled.add if u.enabled else self.enabled.discard)(u.name)
            if u.running is not None:
                (self.active.add if u.running else self.active.discard)(u.name)
        self.user = (want.user.name, want.user.home, want.user.shell, want.user.groups)
        self.image = want.image is not None
        self.exporter_image = want.exporter_image is not None
        self.firewall_loaded = want.firewall
        self.healthy = {e.port for e in want.endpoints}
        self.numa_balancing = want.sysctl.get("kernel.numa_balancing", self.numa_balancing)
        self.cmdline += " " + " ".join(paths.KERNEL_ARGS)
        for w in want.weights:
            self.weights[w.source] = (f"{w.revision} 0123abc", f"{w.revision} 0123abc")
        # The roll kept the files that passed the gate as the newest generation, marked healthy.
        running = self.serving_files()
        if running and self.generations.get(self.healthy_generation or 0) != running:
            self.healthy_generation = max(self.generations, default=0) + 1
            self.generations[self.healthy_generation] = running
        self.commands |= {"nft", "cpupower"}  # what the runtime stage's packages install


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
                sim.read(dataclasses.replace(managed.probe(spec), restore=restore), **{"interfaces": address[name], **sections})
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


RECORDED = {
    files: ("put", "file", "directory"),
    server: ("sysctl", "shell", "reboot", "group", "user"),
    systemd: ("service", "daemon_reload"),
    apt: ("packages",),
    operations: (
        "image_present",
        "barrier",
        "healthy",
        "unit_verified",
        "fail",
        "hook",
        "weights_downloaded",
        "weights_staged",
        "generation_saved",
        "generation_restored",
    ),
}


@contextmanager
def recording(monkeypatch: pytest.MonkeyPatch, sick: dict[str, int]) -> Iterator[list[str]]:
    """Every pyinfra operation (and this tool's own) replaced by one that records its name; ``sick``: per
    unit, how many of its health gates fail (a gate that may hold the host, for a rollback, then does)."""
    names: list[str] = []
    failed: list[str] = []

    def recorder(module: str, op: str) -> Any:
        def record(*_args: Any, name: str | None = None, _if: Any = None, **kwargs: Any) -> _Recorded:
            # pyinfra evaluates _if when it executes the operation: a gate that says no means no operation.
            if failed:  # pyinfra runs nothing more on a host that failed
                return _Recorded(False)
            conditions = _if if isinstance(_if, list) else [_if] if _if is not None else []
            ran = all(condition() for condition in conditions)
            if ran:
                names.append(name or f"{module}.{op}")
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


def emitted(
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
    host_plan: HostPlan,
    interrupted: str | None = None,
    sick: dict[str, int] | None = None,
) -> list[str]:
    """The names of the operations ``tasks/<stage>.py`` emits for this host (h1), in order; ``interrupted``:
    a signal that arrived before the stage ran; ``sick``: failing health gates per unit (:func:`recording`)."""
    fleet = FleetPlan({"h1": host_plan}, plan_roll({"h1": host_plan}))
    fleet.roll.interrupted = interrupted
    done: AsyncResult = AsyncResult()
    done.set(fleet)
    state = SimpleNamespace(instinct_fleet_plan=done, failed_hosts=set())
    host = SimpleNamespace(name="h1", state=state, data=SimpleNamespace(), loop=lambda items: items)
    with recording(monkeypatch, dict(sick or {})) as names, ctx_host.use(host):
        runpy.run_path(str(ROOT / "tasks" / f"{stage}.py"))
    return names
