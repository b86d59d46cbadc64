"""The shapes of a host's managed state, how each converges, and how the preflight fact's reading of a host is compared with them.

:mod:`instinct_fleet.converge.managed` declares each entry once and evaluates it for a
host; this module holds only the data and the comparisons, so that the host
plan, the roll, the applier (:mod:`instinct_fleet.converge.apply`) and the verify module
all read one answer.

An entry that drifted is written by the applier, then its *actions* run, each
once however many entries ask for it: :class:`Restart`, :class:`Reload`,
:class:`Run`, :class:`Reboot`, or :class:`Roll` (the roll restarts the unit in
its batch, behind the health gate). A unit file needs no action of its own:
the applier checks it with ``systemd-analyze verify`` and reloads systemd.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from instinct_fleet.converge.preflight import HostReport

# Which stage of instinct_fleet.deploys converges an entry (one deploy function each; "docker" and "pull" run in the
# runtime stage, or in a serving host's roll batch, "roll" in the roll).
Stage = Literal["tuning", "runtime", "docker", "pull", "weights", "cluster", "firewall", "exporter", "router", "services", "roll"]


@dataclass(frozen=True)
class Restart:
    """Restart ``unit`` once after a change (a unit that is not running is started by its own entry)."""

    unit: str


@dataclass(frozen=True)
class Reload:
    """Reload ``unit`` after a change, if it runs (a stopped one reads the change when its own entry starts it)."""

    unit: str


@dataclass(frozen=True)
class Run:
    """Run ``command`` on the host after a change; ``label`` is the operation's name."""

    label: str
    command: str


@dataclass(frozen=True)
class Reboot:
    """Reboot the host after a change, and wait for it to come back."""

    label: str


@dataclass(frozen=True)
class Roll:
    """Leave the restart of ``unit`` to the roll: in the host's batch, behind the health gate."""

    unit: str


Action = Restart | Reload | Run | Reboot | Roll


def unit_of(actions: tuple[Action, ...]) -> str | None:
    """The unit a change of an entry takes down or reloads, if any."""
    return next((a.unit for a in actions if isinstance(a, Restart | Reload | Roll)), None)


@dataclass(frozen=True)
class File:
    """A file with this content (None: the file must be absent), mode and owner.

    ``actions`` run after it changed; ``label`` is the name its operation shows.
    """

    path: str
    content: bytes | None
    stage: Stage
    label: str
    mode: str = "644"
    owner: str = "root"
    group: str = "root"
    actions: tuple[Action, ...] = ()
    secret: bool = False  # a secret (a token, credentials): written by operations.secret_written, never on a command line

    @property
    def restarts(self) -> str | None:
        """What a change of it takes down or reloads: a serving unit, ``docker``, the exporter, or None."""
        return unit_of(self.actions)

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
    """A unit's wanted state; ``running`` None: whatever its conditions make it (the CPU idle unit in a VM).

    ``why`` says why a unit must be stopped (it names the operation that stops it).
    """

    name: str  # without .service
    stage: Stage
    enabled: bool = True
    running: bool | None = True
    why: str = ""


@dataclass(frozen=True)
class Sysctl:
    """A kernel setting's live value (its file, read at boot, is a :class:`File` entry)."""

    key: str
    value: str
    stage: Stage
    label: str


@dataclass(frozen=True)
class Table:
    """An nftables table that must be loaded; ``actions`` (a reload of the unit that loads it) run when it is not."""

    name: str
    stage: Stage
    label: str
    actions: tuple[Action, ...] = ()


@dataclass(frozen=True)
class Image:
    """A container image the host must hold; ``actions`` run after it was pulled."""

    ref: str
    stage: Stage
    label: str
    actions: tuple[Action, ...] = ()


@dataclass(frozen=True)
class Endpoint:
    """A vLLM instance that must answer /health and list ``served`` in /v1/models."""

    unit: str
    port: int
    served: str
    generates: bool = True  # False for a pooling model: the gate stops at /v1/models


@dataclass(frozen=True)
class User:
    """A system user in ``groups``, each created as a system group when missing."""

    name: str
    groups: tuple[str, ...]
    home: str
    shell: str
    stage: Stage = "tuning"


@dataclass(frozen=True)
class Weights:
    """A model copied from ``weights_source`` (``source``) into the host's HF cache (``local``) before its first start,
    owned by ``owner``. Its download into the source is fleet-wide (one host, then a barrier: instinct_fleet.deploys.weights); the
    copy is the applier's, in the weights stage."""

    model: str
    revision: str
    source: str
    local: str
    owner: str = "root"
    stage: Stage = "weights"


@dataclass(frozen=True)
class Desired:
    """Everything one host should have; ``serving`` lists its serving units in start order (ray-* first).

    ``user`` is None for a host the run does not touch (it failed preflight).
    """

    files: tuple[File, ...]
    directories: tuple[Directory, ...]
    units: tuple[Unit, ...]
    user: User | None = None
    sysctls: tuple[Sysctl, ...] = ()
    tables: tuple[Table, ...] = ()
    images: tuple[Image, ...] = ()
    serving: tuple[str, ...] = ()
    endpoints: tuple[Endpoint, ...] = field(default_factory=tuple)
    weights: tuple[Weights, ...] = field(default_factory=tuple)

    @property
    def groups(self) -> tuple[str, ...]:
        return self.user.groups if self.user is not None else ()

    @property
    def sysctl(self) -> dict[str, str]:
        return {s.key: s.value for s in self.sysctls}

    @property
    def firewall(self) -> bool:
        return bool(self.tables)

    def _image(self, stage: Stage) -> str | None:
        return next((i.ref for i in self.images if i.stage == stage), None)

    @property
    def image(self) -> str | None:
        """The serving image (pulled in the runtime stage, one seed host first)."""
        return self._image("pull")

    @property
    def exporter_image(self) -> str | None:
        return self._image("exporter")

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


def user_drifts(user: User, report: HostReport) -> bool:
    have = report.user
    groups_missing = any(g not in report.group_ids for g in user.groups)
    return groups_missing or have is None or have[0] != user.home or have[1] != user.shell or not set(user.groups) <= set(have[2])


def source_has(want: Weights, report: HostReport) -> bool:
    """Whether ``weights_source`` held a complete download of this model's revision at preflight."""
    complete = report.weights.get(want.source, ("", ""))[0]
    return complete.split(" ")[0] == want.revision


def weights_drift(want: Weights, report: HostReport) -> bool:
    """Whether the host's HF cache lacks the copy of exactly what the source holds."""
    complete, staged = report.weights.get(want.source, ("", ""))
    return not (bool(staged) and staged == complete and source_has(want, report))


def sysctl_drifts(want: Sysctl, report: HostReport) -> bool:
    return report.sysctls.get(want.key) != want.value


def table_drifts(want: Table, report: HostReport) -> bool:
    return want.name not in report.tables


def image_drifts(want: Image, report: HostReport) -> bool:
    return report.image_ids.get(want.ref) is None


@dataclass(frozen=True)
class Selection:
    """The entries of one stage (the roll: of some serving units) out of a host's desired state."""

    stage: Stage
    files: tuple[File, ...]
    directories: tuple[Directory, ...]
    units: tuple[Unit, ...]
    sysctls: tuple[Sysctl, ...]
    tables: tuple[Table, ...]
    images: tuple[Image, ...]
    weights: tuple[Weights, ...]
    user: User | None


def select(want: Desired, stage: Stage, units: Collection[str] | None = None) -> Selection:
    """A stage's entries; ``units``: only the files and units of these serving units (the roll's batch)."""

    def mine(f: File) -> bool:
        return units is None or f.restarts in units

    return Selection(
        stage,
        tuple(f for f in want.files if f.stage == stage and mine(f)),
        tuple(d for d in want.directories if d.stage == stage and units is None),
        tuple(u for u in want.units if u.stage == stage and (units is None or u.name in units)),
        tuple(s for s in want.sysctls if s.stage == stage),
        tuple(t for t in want.tables if t.stage == stage),
        tuple(i for i in want.images if i.stage == stage),
        tuple(w for w in want.weights if w.stage == stage),
        want.user if want.user is not None and want.user.stage == stage and units is None else None,
    )
