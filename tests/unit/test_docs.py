"""The docs: a short README, the pages of docs/ and their generated reference tables (variables, rules, vLLM's
start-up checks and keyless routes) held to the code; group_data/all.py matches defaults.py."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from instinct_fleet.model import knowledge
from instinct_fleet.model.defaults import DEFAULTS, VARIABLES
from instinct_fleet.model.knowledge import without_lines
from instinct_fleet.model.rules import RULES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The user's pages: the README and the guides and reference of docs/ (development.md and seeds.md are the contributors').
USER_PAGES = [
    ROOT / "README.md",
    *(p for p in sorted(DOCS.rglob("*.md")) if p.name not in ("development.md", "seeds.md") and "report-example" not in p.parts),
]


def sync_script() -> Any:
    """scripts/sync_variable_docs.py, the writer of every generated table and page."""
    spec = importlib.util.spec_from_file_location("sync_variable_docs", ROOT / "scripts" / "sync_variable_docs.py")
    assert spec is not None and spec.loader is not None
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    return sync


def test_the_variables_page_matches_defaults() -> None:
    text = (DOCS / "reference" / "variables.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \| `(.*?)` \| (.*) \|$", text, re.M)
    table = {name: (json.loads(default), doc) for name, default, doc in rows}
    assert table == {v.name: (json.loads(json.dumps(v.default)), without_lines(v.doc)) for v in VARIABLES}


def test_the_rules_page_lists_every_rule() -> None:
    text = (DOCS / "reference" / "rules.md").read_text()
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


def test_the_readme_is_short_and_links_every_page_and_the_site_navigates_them_all() -> None:
    """A README of at most 200 lines (what it is, install, the quick start, a first hour, links); every page of docs/
    is linked from it or from docs/index.md and is in mkdocs.yml's navigation, and every relative link resolves."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    top = re.findall(r"^## (.+)$", readme, re.M)
    assert top == ["Install", "Quick start: a simulated fleet on one machine", "Your first hour", "Documentation", "Development"]
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    nav = set(re.findall(r":\s*([\w./-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert nav == pages, (pages - nav, nav - pages)
    index = (DOCS / "index.md").read_text()
    linked = set(re.findall(r"\]\(docs/([\w./-]+\.md)\)", readme)) | set(re.findall(r"\]\(([\w./-]+\.md)\)", index))
    assert pages - {"index.md", "report-example/report.md"} <= linked, pages - linked
    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for target in re.findall(r"\]\((?!https?:|mailto:|#)([^)\s#]+)(?:#[\w-]+)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which does not exist"


def test_every_docs_anchor_names_a_heading_of_its_page() -> None:
    """A link to page.md#anchor lands on a heading of that page (GitHub's and mkdocs' slugs)."""

    def slugs(path: Path) -> set[str]:
        text = re.sub(r"(?ms)^```.*?^```", "", path.read_text())
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}

    for page in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for target, anchor in re.findall(r"\]\((?!https?:)([^)\s#]*)#([\w-]+)\)", page.read_text()):
            where = page if not target else page.parent / target
            assert anchor in slugs(where), f"{page.relative_to(ROOT)}: {target}#{anchor} names no heading"


def test_the_user_guide_cites_seeds_without_line_numbers() -> None:
    """The README and the guide are for users: a seed is named, its lines are in the code and docs/seeds.md, where tests
    check them."""
    from instinct_fleet.model.knowledge import CITATION

    for page in USER_PAGES:
        assert [m.group(0) for m in CITATION.finditer(page.read_text())] == [], page
    assert CITATION.search((ROOT / "docs" / "seeds.md").read_text()), "docs/seeds.md keeps the citations with their lines"


def test_the_readme_says_what_its_own_words_mean_before_using_them() -> None:
    """'recipe', 'serving unit' and 'the seeds' are defined the first time the README uses them."""
    text = (ROOT / "README.md").read_text()
    for word in ("recipe", "serving unit", "the seeds"):
        first = text.lower().index(word)
        defined = text.index(f"**{word}**")
        assert defined - first < 900, f"{word!r} is used at {first} but defined only at {defined}"


def test_the_start_up_table_is_counted_from_the_shipped_tables() -> None:
    """The docs' table of vLLM's start-up checks per version is what scripts/sync_variable_docs.py counts in the
    knowledge tables, row for row: a table extracted again, or a version added, fails here until it is synced."""
    sync = sync_script()
    table = sync.startup_table()
    assert table in (DOCS / "reference" / "vllm-versions.md").read_text()
    assert (
        "| checks between settings, each anchored to the line that raises it, with the conditions that lead there |" in table
        and table.count("\n") == 10
    )


def test_the_router_page_lists_the_routes_each_shipped_vllm_serves_without_the_key() -> None:
    """What the docs say is open on a keyed port is what each shipped table read from that version's source."""
    sync = sync_script()
    table = sync.keyless_table()
    assert table in (DOCS / "router.md").read_text()
    for version in knowledge.supported_versions():
        row = next(line for line in table.splitlines() if line.startswith(f"| {version} |"))
        assert "`/tokenize`" in row and "`/health`" in row and "`/v1/completions`" not in row, row


def test_every_page_the_package_names_exists_and_holds_what_it_names() -> None:
    """What the package tells a user to read (a rule's why, an alert's description, a variable's meaning): a page of
    docs/ that exists, and the section it names, which that page holds; no text still points at the README's sections."""
    texts = [p for p in (ROOT / "instinct_fleet").rglob("*") if p.suffix in (".py", ".j2", ".toml") and "seeds" not in p.parts]
    named = 0
    for path in texts:
        text = path.read_text()
        assert not re.search(r"\(README, ", text), f"{path.relative_to(ROOT)} points at a README section"
        for page, section in re.findall(r"\b(docs/[\w/.-]+\.md)(?:, ([A-Z][\w ]+?))?[)\s:.;]", text):
            assert (ROOT / page).is_file(), f"{path.relative_to(ROOT)} names {page}, which does not exist"
            if section:
                assert section in (ROOT / page).read_text(), f"{path.relative_to(ROOT)}: {page} holds no {section!r}"
            named += 1
    assert named > 10


def test_the_development_page_lists_each_end_to_end_module_in_its_share() -> None:
    """docs/development.md's table of shares is what each module's FLEET_SHARE says."""
    text = (DOCS / "development.md").read_text()
    listed = {
        module: int(share)
        for share, row in re.findall(r"^\| (\d) \| (.+) \|$", text, re.M)
        for module in re.findall(r"`(test_\w+\.py)`", row)
    }
    actual = {}
    for path in sorted((ROOT / "tests" / "e2e").glob("test_*.py")):
        found = re.search(r"^FLEET_SHARE = (\d+)", path.read_text(), re.M)
        actual[path.name] = int(found.group(1)) if found else 0
    assert listed == actual


def test_the_command_line_options_page_is_the_parser_s() -> None:
    """docs/reference/cli-options.md is byte for byte what scripts/sync_variable_docs.py writes from the parser."""
    sync = sync_script()
    page = sync.cli_page()
    assert (DOCS / "reference" / "cli-options.md").read_text() == page
    assert "## instinct-fleet vllm-facts" in page and "| `--show` |" in page and "| `--grafana-path PATH` |" in page
