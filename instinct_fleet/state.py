"""The shapes of a host's managed state, and how the preflight fact's reading of a host is compared with them.

:mod:`instinct_fleet.managed` declares each entry once and evaluates it for a
host; this module holds only the data and the comparisons, so that the host
plan, the roll, the deploy's stages and the verify module all read one answer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from instinct_fleet.preflight import HostReport

# Which stage of deploy.py converges an entry (one task file each).
Stage = Literal["tuning", "runtime", "docker", "cluster", "firewall", "exporter", "services", "roll"]


@dataclass(frozen=True)
class File:
    """A file with this content (None: the file must be absent), mode and owner.

    ``restarts`` names what a change of it takes down: a serving unit, ``docker``,
    the exporter, or None. ``label`` is the name its operation shows.
    """

    path: str
    content: bytes | None
    stage: Stage
    label: str
    mode: str = "644"
    owner: str = "root"
    group: str = "root"
    restarts: str | None = None

    @cached_property
    def sha256(self) -> str | None:
        return None if self.content is None else hashlib.sha256(self.content).hexdigest()

    @property
    def text(self) -> str:
        assert self.content is not None, f"{self.path} is declared absent"
        return self.content.decode()


@dataclass(frozen=True)
class Directory:
    """A directory; ``mode`` None leaves the mode to whoever uses it (Ray sets 1777 on its own)."""

    path: str
    mode: str | None
    stage: Stage
    label: str
    owner: str = "root"
    group: str = "root"


@dataclass(frozen=True)
class Unit:
    """A unit's wanted state; ``running`` None: whatever its conditions make it (the CPU idle unit in a VM)."""

    name: str  # without .service
    enabled: bool = True
    running: bool | None = True


@dataclass(frozen=True)
class Endpoint:
    """A vLLM instance that must answer /health and list ``served`` in /v1/models."""

    unit: str
    port: int
    served: str
    generates: bool = True  # False for a pooling model: the gate stops at /v1/models


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]
    home: str
    shell: str


@dataclass(frozen=True)
class Weights:
    """A model copied from ``weights_source`` (``source``) into the host's HF cache (``local``) before its first start."""

    model: str
    revision: str
    source: str
    local: str


@dataclass(frozen=True)
class Desired:
    """Everything one host should have; ``serving`` lists its serving units in start order (ray-* first)."""

    files: tuple[File, ...]
    directories: tuple[Directory, ...]
    units: tuple[Unit, ...]
    groups: tuple[str, ...]
    user: User
    sysctl: dict[str, str]
    image: str | None
    firewall: bool
    serving: tuple[str, ...] = ()
    endpoints: tuple[Endpoint, ...] = field(default_factory=tuple)
    weights: tuple[Weights, ...] = field(default_factory=tuple)
    exporter_image: str | None = None

    def file(self, path: str) -> File:
        return next(f for f in self.files if f.path == path)

    def stage(self, stage: Stage) -> tuple[File, ...]:
        return tuple(f for f in self.files if f.stage == stage)

    def unit_files(self, unit: str) -> dict[str, str]:
        """A serving unit's unit file and env file, as the deploy writes them."""
        return {f.path: f.text for f in self.files if f.restarts == unit and f.content is not None}


def content_differs(want: File, report: HostReport) -> bool:
    """Whether the host's file is not ``want``'s content (what restarts a unit; mode and owner do not)."""
    have = report.file_hashes.get(want.path)
    return have is not None if want.content is None else have != want.sha256


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
    running = want.running is not None and (want.name in report.active_units) != want.running
    return (want.name in report.enabled_units) != want.enabled or running


def user_drifts(want: Desired, report: HostReport) -> bool:
    user, have = want.user, report.user
    groups_missing = any(g not in report.group_ids for g in want.groups)
    return groups_missing or have is None or have[0] != user.home or have[1] != user.shell or not set(user.groups) <= set(have[2])
