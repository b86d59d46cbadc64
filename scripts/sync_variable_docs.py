"""Rewrite the README's Variables and Validation rules tables and group_data/all.py from the code.

tests/unit/test_docs.py fails when they drift apart; run this after adding or changing a
variable or a rule: ``python scripts/sync_variable_docs.py``. The README is the user guide, so
its tables cite a seed without its line (knowledge.without_lines); the code keeps the lines.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from instinct_fleet.model.defaults import VARIABLES
from instinct_fleet.model.knowledge import without_lines
from instinct_fleet.model.rules import RULES
from instinct_fleet.scaffold import group_data_all

ROOT = Path(__file__).resolve().parents[1]


def readme_table() -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | `{json.dumps(v.default)}` | {without_lines(v.doc)} |" for v in VARIABLES]
    return "\n".join(rows)


def rules_table() -> str:
    rows = ["| rule | severity | why |", "| --- | --- | --- |"]
    rows += [f"| `{r.id}` | {r.severity} | {without_lines(r.reason)} |" for r in RULES.values()]
    return "\n".join(rows)


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    pattern = re.compile(r"^\| variable \| default \| meaning \|\n(?:^\|.*\|\n)+", re.M)
    if not pattern.search(text):
        raise SystemExit("README.md has no Variables table to replace")
    text = pattern.sub(lambda _: readme_table() + "\n", text, count=1)
    rules = re.compile(r"^\| rule \| severity \| why \|\n(?:^\|.*\|\n)+", re.M)
    if not rules.search(text):
        raise SystemExit("README.md has no rules table to replace")
    readme.write_text(rules.sub(lambda _: rules_table() + "\n", text, count=1))
    all_py = ROOT / "group_data" / "all.py"
    all_py.write_text(group_data_all(commented=False))
    # The project's one formatter owns the layout of Python files, generated or not.
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(all_py)], check=True)


if __name__ == "__main__":
    main()
