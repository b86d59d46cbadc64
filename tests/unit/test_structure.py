"""The package's shape: no import circle, every host path written once, in paths.py (templates included), and a
host plan made whole.

The import graph counts every import, including those under TYPE_CHECKING and
inside functions: an edge that only type checkers see still ties two modules'
data together. Host path literals are found in the syntax tree (docstrings and
messages may name a path; code that uses one reads it from paths.py).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from instinct_fleet.model import paths

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "instinct_fleet"


def dotted(path: Path) -> str:
    """A module's name below the package: ``model.spec``, ``cli``."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


MODULES = {
    dotted(p): p
    for p in sorted(PACKAGE.rglob("*.py"))
    if p.name != "__init__.py" and not ({"templates", "project"} & set(p.relative_to(PACKAGE).parts))
}
# The folders, lowest first: a module imports only from its own folder and the folders below it.
LAYERS = (
    "model",
    "converge",
    "live",
    "roll",
    "commands",
    "verify",
    "",
)  # "": the deploy functions and the command line, at the package's root
HOST_PATH = re.compile(r"^/(etc|run|var|dev|usr|root|opt|srv)(/[\w.@*+-]*)+$")


def imports(path: Path) -> set[str]:
    """The package's modules this one imports (dotted below the package), however it spells the import."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and (node.module + ".").startswith("instinct_fleet."):
            base = node.module.removeprefix("instinct_fleet").lstrip(".")
            for alias in node.names:
                name = f"{base}.{alias.name}".lstrip(".")
                found.add(name if name in MODULES else base)
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("instinct_fleet.") for a in node.names if a.name.startswith("instinct_fleet.")}
    return found - {dotted(path), ""}


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0] if "." in module else "")


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the path that closes it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_import_graph_has_no_circle() -> None:
    graph = {name: imports(path) for name, path in MODULES.items()}
    assert [m for deps in graph.values() for m in deps if m not in MODULES] == [], "an import names no module of the package"
    assert cycle(graph) is None, f"import circle: {' -> '.join(cycle(graph) or [])}"


def test_every_module_sits_in_a_layer_and_no_arrow_runs_back_up() -> None:
    """model (what a host should be) < converge (how it gets there) < live (asking live engines) < roll (the deploy's roll)
    < commands (standalone commands on a live fleet) < verify (testinfra)
    < what a user calls: the deploy functions and the command line."""
    assert sorted(m for m in MODULES if "." not in m) == ["__main__", "cli", "deploys", "scaffold"]
    upward = [(m, dep) for m, path in MODULES.items() for dep in imports(path) if layer(dep) > layer(m)]
    assert upward == []


def test_the_import_reader_sees_every_spelling() -> None:
    module = PACKAGE / "converge" / "apply.py"
    assert {"converge.state", "converge.operations", "model.paths"} <= imports(module)


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def literals(path: Path) -> list[tuple[int, str]]:
    """String constants that are a host path, outside docstrings and messages (a path inside a sentence is prose)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            value = node.value.split(":")[0]  # a mount's host side
            if HOST_PATH.match(value) and value != "/dev/null":
                found.append((node.lineno, node.value))
    return found


@pytest.mark.parametrize(
    "path",
    [p for p in sorted([*MODULES.values(), ROOT / "deploy.py"]) if p.name not in ("paths.py", "defaults.py")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_host_paths_live_only_in_paths_py(path: Path) -> None:
    """defaults.py may hold a variable's default path: the user's value replaces it, and the README lists both."""
    assert literals(path) == []


def test_the_literal_finder_sees_a_path(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        '"""Docs may name /etc/x.conf."""\nX = "/etc/instinct-fleet/y.env"\nY = f"{X}:/tmp/ray"\nZ = "see /run/a/b"\nW = f"/run/{X}"\n'
    )
    assert literals(source) == [(2, "/etc/instinct-fleet/y.env"), (5, "/run/")]


TEMPLATES = PACKAGE / "templates"
# /dev/null is the kernel's, not a path the plan could move.
HOST_PATH_IN_TEXT = re.compile(r"(?<![\w{/])/(?!dev/null\b)(?:etc|run|var|dev|usr|root|opt|srv)(?:/[\w.@*+-]+)+")


def template_literals(text: str) -> list[str]:
    """Host paths and this tool's nftables table written out in a template, instead of handed in by the plan."""
    return HOST_PATH_IN_TEXT.findall(text) + ([paths.FIREWALL_TABLE] if paths.FIREWALL_TABLE in text else [])


@pytest.mark.parametrize("path", sorted(TEMPLATES.iterdir()), ids=lambda p: p.name)
def test_templates_take_every_host_path_and_table_name_from_the_plan(path: Path) -> None:
    """A path a template writes out is a second copy of paths.py: pointing paths.py elsewhere would leave it behind."""
    assert template_literals(path.read_text()) == []


def test_the_template_check_sees_a_literal_path_and_table() -> None:
    text = (
        "ExecStart=/usr/sbin/nft -f /etc/instinct-fleet/firewall.nft\nExecStop={{ nft }} delete table inet instinct_fleet\n# {{ env_path }}"
    )
    assert template_literals(text) == ["/usr/sbin/nft", "/etc/instinct-fleet/firewall.nft", paths.FIREWALL_TABLE]


def test_a_host_plan_is_made_whole_and_never_changed() -> None:
    """HostPlan and what it carries are frozen: every field is given when the plan is made (plan.plan_inventory)."""
    from instinct_fleet.converge import hostfacts, hostplan, state

    for cls in (hostplan.HostPlan, hostfacts.HostFacts, hostfacts.ClusterView, state.Desired):
        params = getattr(cls, "__dataclass_params__", None)
        assert params is not None and params.frozen, f"{cls.__name__} is not a frozen dataclass"
        assert all(f.init for f in dataclasses.fields(cls)), f"{cls.__name__} has a field made after construction"
