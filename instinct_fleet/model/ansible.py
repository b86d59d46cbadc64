"""Ansible inventories used as they are: YAML, INI and ``ansible-inventory --list`` JSON, with group_vars/ and host_vars/.

Why: most MI300X fleets are already described in an Ansible inventory, and a team should not rewrite 64 hosts and
their variables to try instinct-fleet. pyinfra's old ``@ansible`` connector read group membership only; this reads
what Ansible reads and merges it as Ansible merges it (``VariableManager.get_vars``, lowest first):

1. the inventory file's ``vars`` of every group of the host, ``all`` first, then the others in Ansible's order
   (depth below ``all``, then ``ansible_group_priority``, then name);
2. the ``group_vars/<group>`` files of the same groups in the same order, ``group_vars/all`` first (so any file
   beside the inventory outranks any ``vars`` inside it, as the precedence table of Ansible's docs says);
3. the host's own variables in the inventory file, then ``host_vars/<host>``.

A later layer replaces a key whole (Ansible's default ``hash_behaviour = replace``). Ansible's connection variables
become pyinfra's (:data:`CONNECTION`); instinct-fleet's own variables are taken as they are and validated like any
other input; any other key is kept as host data and listed in ``_ansible_vars`` so that validation leaves it alone.

Refused before any connection, with the file, the line and the key: in a variable instinct-fleet reads, a Jinja
expression (not evaluated here) or a vault-encrypted value (the team's other variables keep theirs, as
``ansible-inventory`` shows them); a group that is its own ancestor, a host name pyinfra cannot use, a file that is
not an inventory, and an executable (dynamic) inventory, with the command that turns it into JSON. A vars file
encrypted whole is skipped and named (:func:`vaulted_files`); INI's strings for yes-or-no variables are booleans.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from instinct_fleet.model.defaults import DEFAULTS  # validation's own table of variables

# Ansible's connection variables and the pyinfra host data each becomes (pyinfra's SSH connector).
CONNECTION = {
    "ansible_host": "ssh_hostname",
    "ansible_ssh_host": "ssh_hostname",
    "ansible_port": "ssh_port",
    "ansible_ssh_port": "ssh_port",
    "ansible_user": "ssh_user",
    "ansible_ssh_user": "ssh_user",
    "ansible_ssh_private_key_file": "ssh_key",
    "ansible_private_key_file": "ssh_key",
    "ansible_password": "ssh_password",
    "ansible_ssh_pass": "ssh_password",
    "ansible_become": "_sudo",
    "ansible_become_user": "_sudo_user",
    "ansible_become_password": "_sudo_password",
}
FOREIGN = "_ansible_vars"  # the host data key listing the Ansible variables that are neither pyinfra's nor ours
WHERE = "_ansible_where"  # the host data key saying where each value was set (file:line), for validation's messages
IMPLICIT = ("all", "ungrouped")
SUFFIXES = ("", ".yml", ".yaml", ".json")  # what Ansible's host_group_vars plugin reads in group_vars/ and host_vars/
_HOST = re.compile(r"^[A-Za-z0-9_.:\-\[\]]+$")
_RANGE = re.compile(r"\[([0-9a-zA-Z]+):([0-9a-zA-Z]+)(?::(\d+))?\]")
_JINJA = re.compile(r"\{\{|\{%|\{#")


class AnsibleInventoryError(ValueError):
    """An inventory this reader refuses: the message names the file, the line and the key."""


@dataclass(frozen=True)
class Where:
    """Where a value was set: the file and its line (1-based)."""

    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Group:
    """A group as the inventory file declares it: its own vars (each with where it was set), its parents, where it
    was first named and its ``ansible_group_priority``."""

    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    where: dict[str, Where] = field(default_factory=dict)
    parents: set[str] = field(default_factory=set)
    line: Where | None = None
    priority: int = 1


@dataclass
class Host:
    """A host as the inventory file declares it: its own vars and the groups that list it."""

    name: str
    vars: dict[str, Any] = field(default_factory=dict)
    where: dict[str, Where] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AnsibleHost:
    """One host as Ansible sees it: its groups (every ancestor, ``all`` included) and its merged variables."""

    name: str
    groups: tuple[str, ...]
    vars: dict[str, Any]
    where: dict[str, Where]  # where each variable's winning value was set

    def data(self) -> dict[str, Any]:
        """The host's pyinfra data: connection variables renamed, Ansible's others and a team's own listed as foreign."""
        data: dict[str, Any] = {}
        foreign = []
        where = {}
        for key, value in self.vars.items():
            name = CONNECTION.get(key, key)
            data[name] = _boolean(value) if name in BOOLEANS else value
            where[name] = str(self.where[key])
            if key not in CONNECTION and not _ours(key):
                foreign.append(key)
        if foreign:
            data[FOREIGN] = sorted(foreign)
        data[WHERE] = where
        return data


# instinct-fleet's yes-or-no variables. An INI inventory's values are strings (`metrics_exporter=false`, every value of
# a [group:vars] section); Ansible's modules read such a string as a boolean (module_utils/parsing/convert_bool.py).
BOOLEANS = {name for name, value in DEFAULTS.items() if isinstance(value, bool)}
_TRUE, _FALSE = ("y", "yes", "on", "1", "true", "t"), ("n", "no", "off", "0", "false", "f")


def _boolean(value: Any) -> Any:
    """A string Ansible's ``boolean()`` reads as one, as that boolean; any other value as it is (validation judges it)."""
    if isinstance(value, str) and value.lower() in (*_TRUE, *_FALSE):
        return value.lower() in _TRUE
    return value


def _ours(key: str) -> bool:
    return key in DEFAULTS or key.startswith(("ssh_", "_"))


class Inventory:
    """The groups and hosts of one inventory source, as Ansible's inventory plugins build them."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {name: Group(name) for name in IMPLICIT}
        self.groups["ungrouped"].parents.add("all")
        self.hosts: dict[str, Host] = {}

    def group(self, name: str, where: Where) -> Group:
        if not isinstance(name, str) or not name:
            raise AnsibleInventoryError(f"{where}: {name!r} is not a group name")
        if name not in self.groups:
            self.groups[name] = Group(name, line=where)
            if name != "all":
                self.groups[name].parents.add("all")
        return self.groups[name]

    def child(self, parent: str, child: str, where: Where) -> None:
        group = self.group(child, where)
        if child == parent:
            raise AnsibleInventoryError(f"{where}: group {child!r} is its own child")
        group.parents.add(parent)

    def host(self, name: str, group: str, where: Where) -> None:
        for expanded in expand(name, where):
            if not _HOST.match(expanded):
                raise AnsibleInventoryError(
                    f"{where}: {expanded!r} is not a host name pyinfra can use (letters, digits, '.', '-', '_', ':')"
                )
            host = self.hosts.setdefault(expanded, Host(expanded))
            if group not in host.groups:
                host.groups.append(group)

    def set_host_var(self, name: str, key: str, value: Any, where: Where) -> None:
        for expanded in expand(name, where):
            checked(key, value, where)
            self.hosts[expanded].vars[key] = value
            self.hosts[expanded].where[key] = where

    def set_group_var(self, group: str, key: str, value: Any, where: Where) -> None:
        checked(key, value, where)
        if key == "ansible_group_priority":  # Ansible's Group.set_variable keeps it as the priority, not a variable
            if not str(value).lstrip("-").isdigit():
                raise AnsibleInventoryError(f"{where}: ansible_group_priority: {value!r} is not a whole number")
            self.groups[group].priority = int(value)
            return
        self.groups[group].vars[key] = value
        self.groups[group].where[key] = where


def expand(pattern: str, where: Where) -> list[str]:
    """Ansible's host ranges: ``gpu-[01:64]`` (numbers, zero padding kept), ``node-[a:f]``, an optional stride."""
    found = _RANGE.search(pattern)
    if found is None:
        return [pattern]
    first, last, stride = found.group(1), found.group(2), int(found.group(3) or 1)
    head, tail = pattern[: found.start()], pattern[found.end() :]
    if first.isdigit() and last.isdigit():
        width = len(first) if first.startswith("0") else 0
        values = [str(n).zfill(width) for n in range(int(first), int(last) + 1, stride)]
    elif len(first) == len(last) == 1 and first.isalpha() and last.isalpha():
        letters = string.ascii_letters
        values = list(letters[letters.index(first) : letters.index(last) + 1 : stride])
    else:
        raise AnsibleInventoryError(f"{where}: {pattern!r} has a range Ansible cannot expand")
    if not values:
        raise AnsibleInventoryError(f"{where}: the range of {pattern!r} is empty")
    return [h for v in values for h in expand(head + v + tail, where)]


def checked(key: str, value: Any, where: Where) -> None:
    """A value this reader can take as it is: no Jinja (it is not evaluated here), no vault, in a variable instinct-fleet
    reads (its own, a connection's). Every other variable is the team's own and is left as it is, templates and vaulted
    values included: Ansible reads it, instinct-fleet never does."""
    if not isinstance(key, str) or not key:
        raise AnsibleInventoryError(f"{where}: {key!r} is not a variable name")
    if key not in CONNECTION and not _ours(key):
        return
    for text in _strings(value):
        if _JINJA.search(text):
            raise AnsibleInventoryError(
                f"{where}: {key}: {text!r} is a Jinja expression; instinct-fleet does not evaluate templates: write the value itself"
            )
        if text.lstrip().startswith("$ANSIBLE_VAULT"):
            raise AnsibleInventoryError(f"{where}: {key}: a vault-encrypted value; decrypt it into a file the project reads instead")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


# ---- YAML -------------------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader; ``!vault`` is refused by name (its tag is unknown to the safe loader)."""


def _vault(loader: _Loader, node: yaml.ScalarNode) -> dict[str, str]:
    """A ``!vault`` value as ``ansible-inventory --list`` gives it (its ciphertext under ``__ansible_vault``), which
    :func:`checked` refuses, naming its key, in a variable instinct-fleet reads."""
    return {"__ansible_vault": str(loader.construct_scalar(node))}


def _unsafe(loader: _Loader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))  # Ansible's "never template this": a plain string here


_Loader.add_constructor("!vault", _vault)
_Loader.add_constructor("!unsafe", _unsafe)


def _yaml(path: Path) -> yaml.Node | None:
    try:
        return yaml.compose(path.read_text(), Loader=_Loader)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise AnsibleInventoryError(f"{path}: not YAML: {exc}") from None


def _value(node: yaml.Node, path: Path) -> Any:
    loader = _Loader("")
    loader.name = str(path)
    return loader.construct_document(node)


def _mapping(node: yaml.Node | None, path: Path, what: str) -> list[tuple[str, yaml.Node, Where]]:
    """The (key, value node, where) of a YAML mapping; a null node is an empty mapping."""
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
        return []
    if not isinstance(node, yaml.MappingNode):
        raise AnsibleInventoryError(f"{path}:{node.start_mark.line + 1}: {what} must be a mapping")
    return [(str(_value(k, path)), v, Where(path, k.start_mark.line + 1)) for k, v in node.value]


def _yaml_inventory(path: Path, inv: Inventory) -> None:
    root = _yaml(path)
    if root is None:
        raise AnsibleInventoryError(f"{path}: empty: not an inventory")
    top = _mapping(root, path, "an Ansible YAML inventory (groups at its top level)")
    for name, node, where in top:
        _yaml_group(name, node, where, path, inv, ())


def _yaml_group(name: str, node: yaml.Node, where: Where, path: Path, inv: Inventory, above: tuple[str, ...]) -> None:
    if name in above:
        raise AnsibleInventoryError(f"{where}: group {name!r} is its own ancestor ({' > '.join((*above, name))})")
    inv.group(name, where)
    for key, value, at in _mapping(node, path, f"group {name!r}"):
        if key == "hosts":
            for host, hvars, hat in _mapping(value, path, f"{name}.hosts"):
                inv.host(host, name, hat)
                for var, vnode, vat in _mapping(hvars, path, f"host {host!r}"):
                    inv.set_host_var(host, var, _value(vnode, path), vat)
        elif key == "vars":
            for var, vnode, vat in _mapping(value, path, f"{name}.vars"):
                inv.set_group_var(name, var, _value(vnode, path), vat)
        elif key == "children":
            for child, cnode, cat in _mapping(value, path, f"{name}.children"):
                inv.child(name, child, cat)
                _yaml_group(child, cnode, cat, path, inv, (*above, name))
        else:
            raise AnsibleInventoryError(f"{at}: group {name!r} has {key!r}; an Ansible group holds only hosts, vars and children")


# ---- INI --------------------------------------------------------------------------------------------------------


def _ini_value(text: str) -> Any:
    """Ansible's INI values: a Python literal where one parses, else the text (ansible/plugins/inventory/ini.py)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def _ini_inventory(path: Path, inv: Inventory) -> None:
    group, kind = "ungrouped", "hosts"
    pending: list[tuple[str, str, Where]] = []  # children named before their group's section
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        where = Where(path, number)
        if not line or line.startswith(("#", ";")):
            continue
        section = re.fullmatch(r"\[([^\]:\s]+)(?::(\w+))?\]", line)
        if section:
            group, kind = section.group(1), section.group(2) or "hosts"
            if kind not in ("hosts", "vars", "children"):
                raise AnsibleInventoryError(f"{where}: section [{group}:{kind}]: Ansible knows :vars and :children")
            inv.group(group, where)
            continue
        if line.startswith("["):
            raise AnsibleInventoryError(f"{where}: {line!r} is not a section header")
        if kind == "vars":
            key, eq, value = line.partition("=")
            if not eq:
                raise AnsibleInventoryError(f"{where}: [{group}:vars] takes key=value lines")
            inv.set_group_var(group, key.strip(), _ini_value(value.strip()), where)
        elif kind == "children":
            pending.append((group, line, where))
        else:
            try:
                parts = shlex.split(line, comments=True)
            except ValueError as exc:
                raise AnsibleInventoryError(f"{where}: {exc}") from None
            inv.host(parts[0], group, where)
            for part in parts[1:]:
                key, eq, value = part.partition("=")
                if not eq:
                    raise AnsibleInventoryError(f"{where}: {part!r} after the host name is not key=value")
                inv.set_host_var(parts[0], key, _ini_value(value), where)
    for parent, child, where in pending:
        inv.child(parent, child, where)
    if group == "ungrouped" and not inv.hosts:
        raise AnsibleInventoryError(f"{path}: no hosts and no groups: not an Ansible inventory")


# ---- ansible-inventory --list JSON ------------------------------------------------------------------------------


def _json_inventory(path: Path, inv: Inventory) -> None:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise AnsibleInventoryError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    if not isinstance(data, dict) or ("all" not in data and "_meta" not in data):
        raise AnsibleInventoryError(f"{path}: not the JSON of `ansible-inventory --list` (no 'all' and no '_meta')")
    where = Where(path, 1)
    for name, body in data.items():
        if name == "_meta":
            continue
        inv.group(name, where)
        body = body if isinstance(body, dict) else {"hosts": body}
        for host in body.get("hosts", []):
            inv.host(host, name, where)
        for key, value in (body.get("vars") or {}).items():
            inv.set_group_var(name, key, value, where)
    for name, body in data.items():
        if name != "_meta" and isinstance(body, dict):
            for child in body.get("children", []):
                inv.child(name, child, where)
    for host, values in ((data.get("_meta") or {}).get("hostvars") or {}).items():
        if host not in inv.hosts:
            inv.host(host, "ungrouped", where)
        for key, value in values.items():
            inv.set_host_var(host, key, value, where)


# ---- group_vars/ and host_vars/ ---------------------------------------------------------------------------------


def _var_files(directory: Path, name: str) -> list[Path]:
    """The files Ansible's host_group_vars plugin reads for ``name``: ``name``, ``name.yml``, ``name.yaml``,
    ``name.json``, or every such file under a directory ``name/`` (sorted, recursively)."""
    found = []
    for suffix in SUFFIXES:
        path = directory / f"{name}{suffix}"
        if path.is_file():
            found.append(path)
        elif path.is_dir() and suffix == "":
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".yml", ".yaml", ".json", ""))
    return found


VAULT_HEADER = "$ANSIBLE_VAULT;"


def _vaulted(path: Path) -> bool:
    """A vars file encrypted whole (``ansible-vault encrypt group_vars/all/vault.yml``)."""
    with path.open("rb") as handle:
        return handle.read(len(VAULT_HEADER)) == VAULT_HEADER.encode()


def vaulted_files(source: str | os.PathLike[str]) -> list[Path]:
    """The group_vars and host_vars files beside the inventory that are encrypted whole: Ansible decrypts them with the
    team's vault password; instinct-fleet reads none of their variables, and says so (the CLI)."""
    root = Path(source).parent
    found = [p for d in ("group_vars", "host_vars") if (root / d).is_dir() for p in sorted((root / d).rglob("*")) if p.is_file()]
    return [p for p in found if _vaulted(p)]


def unread_group_vars(source: str | os.PathLike[str], hosts: dict[str, AnsibleHost]) -> list[tuple[Path, str]]:
    """The group_vars files beside the inventory of a group no host is in (an empty group, a misspelt name): Ansible
    reads them for nobody, silently; the CLI names each, as validation names a group_data file no host reads."""
    directory = Path(source).parent / "group_vars"
    if not directory.is_dir():
        return []
    populated = {g for host in hosts.values() for g in host.groups}
    found = []
    for entry in sorted(directory.iterdir()):
        group = entry.name if entry.is_dir() else entry.name.removesuffix(entry.suffix) if entry.suffix in SUFFIXES else entry.name
        if group not in populated and (entry.is_dir() or entry.suffix in SUFFIXES):
            found.append((entry, group))
    return found


def _vars_file(path: Path) -> list[tuple[str, Any, Where]]:
    if _vaulted(path):  # its variables are Ansible's alone: vaulted_files names the file
        return []
    root = _yaml(path)  # JSON is YAML
    return [(key, _value(node, path), where) for key, node, where in _mapping(root, path, "a vars file")]


# ---- the merge --------------------------------------------------------------------------------------------------


def _depths(inv: Inventory) -> dict[str, int]:
    """Each group's depth below ``all`` (the longest path, as Ansible's Group.depth), refusing a cycle."""
    depth: dict[str, int] = {}

    def walk(name: str, trail: tuple[str, ...]) -> int:
        if name in trail:
            raise AnsibleInventoryError(f"{inv.groups[name].line}: group {name!r} is its own ancestor ({' > '.join((*trail, name))})")
        if name not in depth:
            parents = inv.groups[name].parents
            depth[name] = 0 if name == "all" else 1 + max((walk(p, (*trail, name)) for p in parents), default=0)
        return depth[name]

    for name in inv.groups:
        walk(name, ())
    return depth


def _ancestors(inv: Inventory, names: list[str]) -> set[str]:
    found: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += inv.groups[name].parents
    return found


def read(source: str | os.PathLike[str]) -> dict[str, AnsibleHost]:
    """Every host of the inventory at ``source`` with its groups and merged variables, as ``ansible-inventory --list``
    gives them; :class:`AnsibleInventoryError` for what is refused."""
    path = Path(source)
    if not path.is_file():
        raise AnsibleInventoryError(f"{path}: no such inventory file")
    if os.access(path, os.X_OK) and path.read_bytes()[:2] == b"#!":
        raise AnsibleInventoryError(
            f"{path}: an executable (dynamic) inventory; instinct-fleet does not run it: save its output with "
            f"`ansible-inventory -i {path} --list > hosts.json` and use hosts.json"
        )
    inv = Inventory()
    text = path.read_text()
    if path.suffix == ".json":
        _json_inventory(path, inv)
    elif path.suffix in (".yml", ".yaml") or re.match(r"\s*(---|\w[\w.-]*:\s*$)", text):
        _yaml_inventory(path, inv)
    else:
        _ini_inventory(path, inv)
    for host in inv.hosts.values():  # a host only in 'all' is in 'ungrouped', as Ansible puts it
        if set(host.groups) <= {"all"}:
            inv.host(host.name, "ungrouped", Where(path, 1))
    depth = _depths(inv)
    group_files = {name: _var_files(path.parent / "group_vars", name) for name in inv.groups}
    out = {}
    for host in inv.hosts.values():
        mine = _ancestors(inv, host.groups) - {"all"}
        ordered = sorted(mine, key=lambda g: (depth[g], inv.groups[g].priority, g))
        layers = [(k, v, inv.groups[name].where[k]) for name in ("all", *ordered) for k, v in inv.groups[name].vars.items()]
        layers += [item for name in ("all", *ordered) for file in group_files[name] for item in _vars_file(file)]
        layers += [(k, v, host.where[k]) for k, v in host.vars.items()]
        layers += [item for file in _var_files(path.parent / "host_vars", host.name) for item in _vars_file(file)]
        merged: dict[str, Any] = {}
        where: dict[str, Where] = {}
        for key, value, at in layers:  # a later layer replaces a key whole
            checked(key, value, at)
            merged[key], where[key] = value, at
        out[host.name] = AnsibleHost(host.name, tuple(sorted(mine | {"all"})), merged, where)
    return out


def is_ansible(path: str) -> bool:
    """Whether an inventory path names an Ansible inventory (YAML, INI, JSON) rather than a pyinfra one (Python)."""
    given = Path(path)
    return given.is_file() and given.suffix != ".py"


def groups(source: str | os.PathLike[str], name: str | None = None) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The inventory as pyinfra's Python inventory holds it, one list of ``(host, data)`` per group (``all`` is
    pyinfra's own); ``name``: the inventory's file name beside ``source`` (a pyinfra inventory's ``__file__``). The
    two lines of a pyinfra inventory that read the Ansible one beside it::

        from instinct_fleet.model.ansible import groups
        globals().update(groups(__file__, "hosts.yml"))

    In a pyinfra run it installs the gate, as the example inventory does: every host is validated before pyinfra
    connects to any, wherever pyinfra is started from.
    """
    from instinct_fleet.model import gate

    gate.install()
    hosts = read(Path(source).parent / name if name else source)
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for host in hosts.values():
        for name in host.groups:
            if name != "all":
                found.setdefault(name, []).append((host.name, host.data()))
    return found
