"""Where the inventory set each value: the file and line a finding points the user to.

pyinfra merges a host's data from three layers and keeps no record of which one gave a
value: the host's own data in the inventory, then its groups' data (the inventory's group
tuples and ``group_data/<group>.py``, the last group listed winning), then ``all`` (the
inventory's ``all`` and ``group_data/all.py``). :class:`Sources` walks the same layers in the
same order, with the files pyinfra reads them from, so "set in group_data/gpu.py line 2" is
the place to edit. A value no layer holds is a default and has no origin.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

_SHIM_HEAD = "from instinct_fleet.model.ansible import groups\n\nglobals().update(groups("
_SHIM_TAIL = "))\n"


def ansible_shim(source: Path) -> str:
    """The text of a pyinfra inventory that reads the Ansible inventory at ``source`` (absolute), which a command
    given an Ansible inventory runs on (instinct_fleet/model/ansible.py reads it)."""
    return f"{_SHIM_HEAD}{str(source)!r}{_SHIM_TAIL}"


def named(inventory: str | os.PathLike[str]) -> str:
    """The inventory as its user named it: a command given an Ansible inventory runs on the pyinfra inventory that
    ``ansible_shim`` wrote for it in a scratch directory, and its messages name the Ansible file instead."""
    try:
        text = Path(inventory).read_text()
    except (OSError, UnicodeDecodeError):
        return str(inventory)
    if text.startswith(_SHIM_HEAD) and text.endswith(_SHIM_TAIL):
        source = ast.literal_eval(text[len(_SHIM_HEAD) : -len(_SHIM_TAIL)])
        if isinstance(source, str):
            return source
    return str(inventory)


def _tree(path: Path) -> ast.Module | None:
    """A Python file of the project, parsed; None when it cannot be read (pyinfra's own loader says why)."""
    try:
        return ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _assignments(path: Path) -> dict[str, int]:
    """The line of each top-level name a Python file assigns (the last assignment, which is the value pyinfra keeps)."""
    tree = _tree(path)
    if tree is None:
        return {}
    lines: dict[str, int] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Name):
                lines[target.id] = node.lineno
    return lines


def _strings(path: Path) -> dict[str, int]:
    """The line of the first occurrence of each string literal in a Python file: where the inventory names a host."""
    tree = _tree(path)
    if tree is None:
        return {}
    lines: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            lines[node.value] = min(lines.get(node.value, node.lineno), node.lineno)
    return lines


@dataclass(frozen=True)
class Sources:
    """The files a pyinfra inventory's data comes from: the inventory itself (None when pyinfra did not say, as in the
    gate) and the group_data directories in the order pyinfra reads them (a later one overrides an earlier one)."""

    project: Path
    inventory: Path | None
    group_dirs: tuple[Path, ...]
    # Each file read, resolved and named once: every host's every value asks for its origin (3400 times in an 8-host run).
    _lines: dict[Path, dict[str, int]] = field(default_factory=dict, compare=False, repr=False)
    _literals: dict[Path, dict[str, int]] = field(default_factory=dict, compare=False, repr=False)
    _shown: dict[Path, str] = field(default_factory=dict, compare=False, repr=False)
    _group_files: dict[str, tuple[Path, ...]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, project: Path, inventory: Path | None) -> Sources:
        """As pyinfra's make_inventory_from_files: ``project/group_data``, then the inventory's own ``group_data``."""
        dirs = [project / "group_data"]
        if inventory is not None and inventory.absolute().parent.resolve() != project.resolve():
            dirs.append(inventory.absolute().parent / "group_data")
        return cls(project, inventory, tuple(dirs))

    @classmethod
    def of_run(cls, state: Any) -> Sources:
        """Inside a pyinfra run: the directory it runs in; pyinfra keeps no record of the inventory file's path."""
        return cls.of(Path(state.cwd or os.getcwd()), None)

    def shown(self, path: Path) -> str:
        """A path as the user reads it: relative to the project when inside it."""
        if path not in self._shown:
            try:
                self._shown[path] = str(path.resolve().relative_to(self.project.resolve()))
            except ValueError:
                self._shown[path] = str(path)
        return self._shown[path]

    def _line(self, path: Path, name: str) -> int | None:
        if path not in self._lines:
            self._lines[path] = _assignments(path)
        return self._lines[path].get(name)

    def group_file(self, group: str, key: str) -> str | None:
        """``group_data/<group>.py line N`` when a group_data file of that group sets ``key`` (the last one read wins)."""
        if group not in self._group_files:
            self._group_files[group] = tuple(path for d in reversed(self.group_dirs) if (path := d / f"{group}.py").is_file())
        for path in self._group_files[group]:
            line = self._line(path, key)
            if line is not None:
                return f"{self.shown(path)} line {line}"
        return None

    @cached_property
    def inventory_text(self) -> str:
        return self.shown(Path(named(self.inventory))) if self.inventory is not None else "the inventory"

    def in_inventory(self, name: str | None = None) -> str:
        """The inventory, at the line that names ``name`` (a host or a group) when it can be found."""
        line = None
        if self.inventory is not None and name is not None:
            if self.inventory not in self._literals:
                self._literals[self.inventory] = _strings(self.inventory)
            line = self._line(self.inventory, name) or self._literals[self.inventory].get(name)
        return f"{self.inventory_text} line {line}" if line else self.inventory_text


def sibling_groups(sources: Sources) -> set[str]:
    """The groups the project's other inventories name (their top-level names, and each file's own name, which pyinfra
    makes a group), read without running them: a group_data file one of them uses is not a mistake of this one."""
    if sources.inventory is None:
        return set()
    found: set[str] = set()
    for path in sources.inventory.absolute().parent.glob("*.py"):
        if path.resolve() != sources.inventory.resolve():
            found |= {path.stem, *_assignments(path)}
    return found


def _layers(inventory: Any, name: str, groups: tuple[str, ...], sources: Sources) -> list[tuple[Mapping[str, Any], Callable[[str], str]]]:
    """A host's data layers as pyinfra merges them, most specific first: its own data, its groups (the later one first),
    ``all``; each with where it sets a key."""
    layers: list[tuple[Mapping[str, Any], Callable[[str], str]]] = [
        (inventory.get_host_data(name), lambda key: f"host data in {sources.in_inventory(name)}")
    ]

    def in_group(group: str) -> Callable[[str], str]:
        return lambda key: sources.group_file(group, key) or f"group {group} in {sources.in_inventory(group)}"

    for group in [*reversed([g for g in groups if g != "all"]), "all"]:
        layers.append((inventory.get_data() if group == "all" else inventory.get_group_data(group), in_group(group)))
    return layers


def origins(inventory: Any, name: str, groups: tuple[str, ...], data: Mapping[str, Any], sources: Sources) -> dict[str, str]:
    """For each key of a host's merged data, where it was set, walking pyinfra's layers as pyinfra merges them."""
    ansible = inventory.get_host_data(name).get("_ansible_where") or {}  # an Ansible inventory's (model/ansible.py): file:line per key
    layers = _layers(inventory, name, groups, sources)
    found = {}
    for key in data:
        if key in ansible:
            path, line = ansible[key].rsplit(":", 1)
            found[key] = f"{sources.shown(Path(path))} line {line}"
            continue
        where = next((where for layer, where in layers if key in layer), None)
        if where is not None:
            found[key] = where(key)
    return found


def shadowed(
    inventory: Any, name: str, groups: tuple[str, ...], data: Mapping[str, Any], sources: Sources
) -> dict[str, tuple[tuple[str, dict[str, Any]], ...]]:
    """For each mapping variable of a host, the broader layers whose keys the value in force drops: pyinfra (like
    Ansible's default ``hash_behaviour``) takes a mapping whole from the most specific layer that sets it, so a group's
    ``vllm_args`` silently discards every flag ``all.py`` set. Each entry: where the dropped keys were set, and they with
    their values."""
    layers = _layers(inventory, name, groups, sources)
    found = {}
    for key, value in data.items():
        if not isinstance(value, Mapping):
            continue
        setting = [(where, layer[key]) for layer, where in layers if key in layer]
        dropped = tuple(
            (where(key), lost)
            for where, broader in setting[1:]
            if isinstance(broader, Mapping) and (lost := {str(k): v for k, v in broader.items() if k not in value})
        )
        if dropped:
            found[key] = dropped
    return found
