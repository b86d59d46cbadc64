"""Variables are documented in one place: README and group_data/all.py match defaults.py."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

from instinct_fleet.model import knowledge
from instinct_fleet.model.defaults import DEFAULTS, VARIABLES
from instinct_fleet.model.knowledge import without_lines
from instinct_fleet.model.rules import RULES

ROOT = Path(__file__).resolve().parents[2]


def test_readme_variables_table_matches_defaults() -> None:
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \| `(.*?)` \| (.*) \|$", text, re.M)
    table = {name: (json.loads(default), doc) for name, default, doc in rows}
    assert table == {v.name: (json.loads(json.dumps(v.default)), without_lines(v.doc)) for v in VARIABLES}


def test_readme_lists_every_rule() -> None:
    text = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \| (?:error|warning) \|", text, re.M))
    assert listed == set(RULES)
    # Written by scripts/sync_variable_docs.py: each row is the rules table's own severity and reason, its seeds cited
    # without their lines (the user guide's form).
    rows = re.findall(r"^\| `[a-z0-9-]+` \| (?:error|warning) \| .* \|$", text, re.M)
    assert rows == [f"| `{r.id}` | {r.severity} | {without_lines(r.reason)} |" for r in RULES.values()]


def test_group_data_all_shows_every_default_with_a_comment() -> None:
    source = (ROOT / "group_data" / "all.py").read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    seen = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            seen[name] = ast.literal_eval(node.value)
            assert lines[node.lineno - 2].startswith("#"), f"{name} has no comment above it"
    assert seen == DEFAULTS


def test_the_pyinfra_floor_in_the_makefile_is_the_floor_pyproject_admits() -> None:
    floor = re.search(r"^PYINFRA_FLOOR = (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert floor is not None
    assert f'"pyinfra>={floor.group(1)},<4"' in (ROOT / "pyproject.toml").read_text()


def test_the_readme_contents_list_every_section_in_order() -> None:
    """Install, quick start, your own fleet, operating, reference, development: the order a user reads in (issue 31)."""
    text = (ROOT / "README.md").read_text()
    contents = text.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^ *- \[(.+?)\]\(#([\w-]+)\)$", contents, re.M)
    headings = re.findall(r"^#{2,3} (.+)$", text.split("\n## Install\n", 1)[1], re.M)
    assert [title for title, _ in listed] == ["Install", *headings]
    top = re.findall(r"^## (.+)$", text, re.M)
    assert top == [
        "Contents",
        "Install",
        "Quick start: a simulated fleet on one machine",
        "Your own fleet",
        "Operating a fleet",
        "Reference",
        "Development",
    ]


def test_the_user_guide_cites_seeds_without_line_numbers() -> None:
    """The README is for users: a seed is named, its lines are in the code and docs/seeds.md, where tests check them."""
    from instinct_fleet.model.knowledge import CITATION

    text = (ROOT / "README.md").read_text()
    assert [m.group(0) for m in CITATION.finditer(text)] == []
    assert CITATION.search((ROOT / "docs" / "seeds.md").read_text()), "docs/seeds.md keeps the citations with their lines"


def test_the_readme_says_what_its_own_words_mean_before_using_them() -> None:
    """'recipe', 'serving unit' and 'the seeds' are defined the first time the README uses them."""
    text = (ROOT / "README.md").read_text()
    for word in ("recipe", "serving unit", "the seeds"):
        first = text.lower().index(word)
        defined = text.index(f"**{word}**")
        assert defined - first < 900, f"{word!r} is used at {first} but defined only at {defined}"


def test_readme_start_up_table_is_counted_from_the_shipped_tables() -> None:
    """The README's table of vLLM's start-up checks per version is what scripts/sync_variable_docs.py counts in the
    knowledge tables, row for row: a table extracted again, or a version added, fails here until it is synced."""
    spec = importlib.util.spec_from_file_location("sync_variable_docs", ROOT / "scripts" / "sync_variable_docs.py")
    assert spec is not None and spec.loader is not None
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    table = sync.startup_table()
    assert table in (ROOT / "README.md").read_text()
    assert (
        "| checks between settings, each anchored to the line that raises it, with the conditions that lead there |" in table
        and table.count("\n") == 10
    )


def test_readme_lists_the_routes_each_shipped_vllm_serves_without_the_key() -> None:
    """What the README says is open on a keyed port is what each shipped table read from that version's source."""
    spec = importlib.util.spec_from_file_location("sync_variable_docs", ROOT / "scripts" / "sync_variable_docs.py")
    assert spec is not None and spec.loader is not None
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    table = sync.keyless_table()
    assert table in (ROOT / "README.md").read_text()
    for version in knowledge.supported_versions():
        row = next(line for line in table.splitlines() if line.startswith(f"| {version} |"))
        assert "`/tokenize`" in row and "`/health`" in row and "`/v1/completions`" not in row, row
