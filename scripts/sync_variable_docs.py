"""Rewrite the README's Variables and rules tables and group_data/all.py from the code.

tests/unit/test_docs.py fails when the three drift apart; run this after adding
or changing a variable: ``python scripts/sync_variable_docs.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from instinct_fleet.model.defaults import VARIABLES
from instinct_fleet.model.rules import RULES

ROOT = Path(__file__).resolve().parents[1]
HEADER = '''"""Fleet-wide defaults: every instinct-fleet variable, at its default.

pyinfra reads this file for every host; group files (group_data/<group>.py) and
host data in the inventory override it. The README table lists the same
variables; instinct_fleet/model/defaults.py is where their defaults are defined.
"""
'''


def readme_table() -> str:
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{v.name}` | `{json.dumps(v.default)}` | {v.doc} |" for v in VARIABLES]
    return "\n".join(rows)


def rules_table() -> str:
    rows = ["| rule | severity | why |", "| --- | --- | --- |"]
    rows += [f"| `{r.id}` | {r.severity} | {r.reason} |" for r in RULES.values()]
    return "\n".join(rows)


def group_data_all() -> str:
    blocks = []
    for v in VARIABLES:
        comment = "\n".join(textwrap.wrap(v.doc, width=96, initial_indent="# ", subsequent_indent="# "))
        blocks.append(f"{comment}\n{v.name} = {v.default!r}")
    return HEADER + "\n" + "\n\n".join(blocks) + "\n"


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
    all_py.write_text(group_data_all())
    # The project's one formatter owns the layout of Python files, generated or not.
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(all_py)], check=True)


if __name__ == "__main__":
    main()
