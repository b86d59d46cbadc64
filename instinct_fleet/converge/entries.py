"""The shapes of the declaration's entries (instinct_fleet/converge/managed.py) and the rendered content they are made
from: a file or directory, a unit, a kernel setting, the service user, staged weights, an nftables table, an image.

An entry says what it is, where, with which mode and owner, which stage converges it, what runs after it changed
(its actions), and how its content is made from a host's :class:`Rendered` plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from instinct_fleet.converge import content, firewall
from instinct_fleet.converge.hostfacts import HostFacts
from instinct_fleet.converge.state import (
    Action,
    Stage,
    Unit,
    User,
    Weights,
)
from instinct_fleet.model import paths


class _Skip:
    """Content of an entry this host does not manage in its current state (neither written nor removed)."""


SKIP = _Skip()
Made = bytes | None | _Skip  # bytes: the file's content; None: must be absent; SKIP: not managed here


@dataclass(frozen=True)
class Off:
    """The ``make`` of a file whose feature is off on this host, from its spec alone: nothing is written, and the file
    an earlier deploy left at ``left`` (None: none can be left) is removed. ``plan --explain`` lists only what is on."""

    why: str
    left: str | None = None

    def __call__(self, r: Rendered) -> Made:
        return None if self.left is not None and self.left in r.facts.report.stats else SKIP


class Rendered:
    """A host's rendered content, each piece made once per evaluation of the table."""

    def __init__(self, facts: HostFacts, declared: tuple[Entry, ...]) -> None:
        self.facts = facts
        self.declared = declared

    @cached_property
    def units(self) -> dict[str, tuple[str, str]]:
        """Per serving unit, its unit and env file: rendered, or a generation's (``instinct-fleet rollback``)."""
        kept = self.facts.restoring
        if kept is None:
            made = content.serving_units(self.facts)
        else:
            units = self.facts.spec.serving_units
            made = {u: (kept[paths.unit_path(u)].decode(), kept[paths.unit_env_path(u)].decode()) for u in units}
        # A quarantined unit keeps the files it has: it is stopped, and not rolled (converge/gpuhealth.py).
        return {u: files for u, files in made.items() if not self.facts.quarantined(u)}

    @cached_property
    def firewall(self) -> str | None:
        return firewall.firewall(self.facts)


@dataclass(frozen=True)
class FileEntry:
    """One managed file (``directory`` False) or directory; ``make`` gives its content from the rendered plan."""

    path: str
    stage: Stage
    label: str
    make: Callable[[Rendered], Made]
    mode: str | None = "644"
    owner: str = "root"
    group: str = "root"
    then: tuple[Action, ...] = ()
    directory: bool = False
    secret: bool = False  # its content is a secret: mode 0600, written so no other user reads it, never in argv or a diff

    def __post_init__(self) -> None:
        if self.secret and self.mode != "600":
            raise ValueError(f"{self.path}: a secret is declared with mode 600 (operations.secret_written writes it so)")


@dataclass(frozen=True)
class UnitEntry:
    """One managed unit; ``want`` gives its wanted state from the rendered plan (None: not managed here)."""

    name: str
    stage: Stage
    want: Callable[[Rendered], Unit | None]
    off: str | None = None  # why the unit is off on this host, from its spec: stopped and disabled where a deploy left it


@dataclass(frozen=True)
class SysctlEntry:
    """A kernel setting's live value; ``want`` gives it (None: not managed here)."""

    key: str
    stage: Stage
    label: str
    want: Callable[[Rendered], str | None]


@dataclass(frozen=True)
class UserEntry:
    """The service user and its groups."""

    user: User


@dataclass(frozen=True)
class WeightsEntry:
    """A model staged from ``weights_source`` into the host's HF cache."""

    weights: Weights


@dataclass(frozen=True)
class TableEntry:
    """An nftables table that must be loaded while ``want`` says so; ``then`` loads it."""

    name: str
    stage: Stage
    label: str
    want: Callable[[Rendered], bool]
    then: tuple[Action, ...] = ()


@dataclass(frozen=True)
class ImageEntry:
    """A pinned image the host must hold; ``then`` runs after a pull."""

    ref: str
    stage: Stage
    label: str
    then: tuple[Action, ...] = ()


Entry = FileEntry | UnitEntry | SysctlEntry | UserEntry | WeightsEntry | TableEntry | ImageEntry
