"""Every statement the project credits to a seed carries the seed, the line, and a quote found at that line.

A citation is written ``SEED:LINE`` (``002:470``) in the package's text, the README and the
docs; ``instinct_fleet/model/knowledge/citations.toml`` holds the quote for each cited line.
A seed named without a line on the same text line is a statement no one can check, and fails.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path

from instinct_fleet.model import knowledge

ROOT = Path(__file__).resolve().parents[2]
QUOTES: dict[str, str] = tomllib.loads(resources.files("instinct_fleet.model").joinpath("knowledge", "citations.toml").read_text())["quote"]
CITATION = re.compile(r"(?<![\w.:/-])(00[0-4]):(\d+)\b")
# A seed's number standing alone: not part of a name (seed-001-gpt-oss), a number (0.001), a quoted
# literal ("000", an HTTP code or a seed key in code) or a citation.
NAMED = re.compile(r"""(?<![\w.:/"'-])(00[0-4])(?![\w.:/"'-])""")
SEED_INDEX_ROW = re.compile(r"^\| 00[0-4] \|")  # the README's table of the seeds: names them, credits nothing


def texts() -> list[Path]:
    """What the project says: the package's code, tables and templates, the README and the docs."""
    package = [p for p in (ROOT / "instinct_fleet").rglob("*") if p.is_file() and p.suffix in (".py", ".toml", ".j2", ".md")]
    return [p for p in package if "seeds" not in p.parts] + [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_quote_is_at_its_line() -> None:
    for key, quote in QUOTES.items():
        seed, line = key.split(":")
        lines = knowledge.seed_text(seed).splitlines()
        assert 1 <= int(line) <= len(lines), key
        assert _flat(quote) and _flat(quote) in _flat(lines[int(line) - 1]), (key, quote, lines[int(line) - 1][:200])


def test_every_citation_has_a_quote_and_every_quote_a_citation() -> None:
    cited = {f"{m.group(1)}:{m.group(2)}": path for path in texts() for m in CITATION.finditer(path.read_text())}
    assert sorted(set(cited) - set(QUOTES)) == [], {key: str(cited[key]) for key in set(cited) - set(QUOTES)}
    assert sorted(set(QUOTES) - set(cited)) == []


# A user page's credit: a link to docs/seeds.md's credits, relative to the page (the README's, a guide's, a reference's).
README_CREDIT = re.compile(r"\[seeds? (00[0-4])\]\((?:docs/|\.\./)?seeds\.md#credits-of-the-user-guide\)")
USER = re.compile(r"^(?!development\.md$|seeds\.md$)")


def _readme_rows() -> set[str]:
    """The docs' generated rows (variables and rules): each is its source's text, which carries the lines, with the
    lines left out (tests/unit/test_docs.py holds the two equal)."""
    from instinct_fleet.model.defaults import VARIABLES
    from instinct_fleet.model.rules import RULES

    return {knowledge.without_lines(v.doc) for v in VARIABLES} | {knowledge.without_lines(r.reason) for r in RULES.values()}


def test_no_seed_is_credited_without_a_line() -> None:
    """A seed's number alone on a text line needs a citation of that seed on the same line. The README, the user guide,
    names seeds without lines: in a generated row whose source cites the lines, or in a link to docs/seeds.md's credits,
    which cite each seed the README credits with its line."""
    credits = (ROOT / "docs" / "seeds.md").read_text().split("## Credits of the user guide", 1)[1]
    credited = {m.group(1) for m in CITATION.finditer(credits)}
    rows = _readme_rows()
    bare = []
    for path in texts():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if path.name == "README.md" or (path.is_relative_to(ROOT / "docs") and USER.match(path.name)):
                linked = {m.group(1) for m in README_CREDIT.finditer(line)}
                assert linked <= credited, (number, linked - credited)
                cells = line.split(" | ")
                if linked or (len(cells) > 2 and cells[-1].removesuffix(" |") in rows):
                    line = README_CREDIT.sub("", line) if linked else ""
            cited = {m.group(1) for m in CITATION.finditer(line)}
            named = {m.group(1) for m in NAMED.finditer(CITATION.sub("", line))}
            if named - cited and not SEED_INDEX_ROW.match(line):
                bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert bare == []


def test_the_checks_catch_what_they_are_for() -> None:
    """The patterns themselves: a citation is read as one, a bare seed is caught, names and literals are not."""
    assert [m.groups() for m in CITATION.finditer("(000:73; 002:325 allows)")] == [("000", "73"), ("002", "325")]
    assert [m.group(1) for m in NAMED.finditer("as 002 says")] == ["002"]
    assert NAMED.findall('seed-001-gpt-oss, alpha 0.001, code "000", 10:00:12') == []
