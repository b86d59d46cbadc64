#!/usr/bin/env python3
"""Rewrite the README's table of validation rules from instinct_fleet/model/rules.py, the one rules table.

Why: the README lists every rule id with its severity and reason; written by hand, it
drifted from the table the CLI and the tests read. Run from the repository root.
"""

from __future__ import annotations

import re
from pathlib import Path

from instinct_fleet.model.rules import RULES

README = Path(__file__).resolve().parent.parent / "README.md"
ROW = re.compile(r"^\| `[a-z0-9-]+` \| (?:error|warning) \| .* \|$")


def main() -> int:
    lines = README.read_text().splitlines()
    rows = [i for i, line in enumerate(lines) if ROW.match(line)]
    table = [f"| `{r.id}` | {r.severity} | {r.reason} |" for r in RULES.values()]
    lines[rows[0] : rows[-1] + 1] = table
    README.write_text("\n".join(lines) + "\n")
    print(f"{README}: {len(table)} rules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
