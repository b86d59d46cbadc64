"""Rewrite the docs' tables of variables, validation rules, vLLM start-up checks and keyless routes and group_data/all.py from the code.

tests/unit/test_docs.py fails when they drift apart; run this after adding or changing a
variable or a rule: ``python scripts/sync_variable_docs.py``. The README is the user guide, so
its tables cite a seed without its line (knowledge.without_lines); the code keeps the lines.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from instinct_fleet.model import knowledge
from instinct_fleet.model.defaults import VARIABLES
from instinct_fleet.model.knowledge import Flag, without_lines
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


def _walk(flags: dict[str, Flag]) -> Iterator[Flag]:
    """Every flag and, within a JSON config flag, every key, nested ones too."""
    for flag in flags.values():
        yield flag
        if flag.json_fields:
            yield from _walk(flag.json_fields)


def startup_table() -> str:
    """What each shipped table holds of vLLM's start-up refusals, counted from the tables themselves."""
    versions = knowledge.supported_versions()
    tables = [knowledge.load(v) for v in versions]

    def row(kind: str, source: str, cell: Callable[[knowledge.VllmKnowledge], str]) -> str:
        return f"| {kind} | {source} | " + " | ".join(cell(t) for t in tables) + " |"

    def json_cell(t: knowledge.VllmKnowledge) -> str:
        configs = [f for f in t.flags.values() if f.json_fields is not None]
        return f"{len(configs)} flags, {sum(1 for f in configs for _ in _walk(f.json_fields or {}))} keys"

    def executor_cell(t: knowledge.VllmKnowledge) -> str:
        classes = {name for choice in t.executors.values() for key, name in choice.items() if key in ("class", "on", "off")}
        split = sum(1 for choice in t.executors.values() if "env" in choice)
        return f"{len(classes)} ({split} / {len(t.async_executors)})"

    def metrics(t: knowledge.VllmKnowledge) -> str:
        return " / ".join(str(sum(1 for k in t.metrics.values() if k == kind)) for kind in ("gauge", "counter", "histogram"))

    checked_in = sorted(
        {c.split(":")[0].removeprefix("vllm/").removeprefix("config/") for t in tables for c in map(str, t.startup_checks.values())}
    )
    lines = ["| kind | read from | " + " | ".join(versions) + " |", "| --- | --- | " + "--- | " * len(versions)]
    lines[-1] = lines[-1].rstrip()
    lines += [
        row(
            "quantization methods (known / deprecated / run on ROCm)",
            "`quantization/__init__.py`, `platforms/rocm.py`",
            lambda t: f"{len(t.quantization.methods)} / {len(t.quantization.deprecated)} / {len(t.quantization.rocm)}",
        ),
        row(
            "JSON config flags, keys checked (nested)", "the config dataclasses behind each flag (`@config` forbids extra keys)", json_cell
        ),
        row(
            "pydantic bounds (flags and JSON keys)",
            "`Field(gt=, ge=, lt=, le=)`",
            lambda t: str(sum(1 for f in _walk(t.flags) if f.bounds)),
        ),
        row(
            "keys a config computes itself (refused)",
            "`Field(init=False)`",
            lambda t: str(sum(1 for f in _walk(t.flags) if not f.settable)),
        ),
        row(
            "enum-typed flags with choices",
            "`Literal` aliases (nested ones resolved) and `Enum`s",
            lambda t: str(sum(1 for f in t.flags.values() if f.choices)),
        ),
        row(
            "ROCm attention backends (KV dtypes, block sizes, MLA, sparse, sinks)",
            "`_get_backend_priorities`, the registry and each backend class",
            lambda t: str(len(t.backends)) if t.backends else f"none: {t.version} chooses in code",
        ),
        row(
            "checks between settings, each anchored to the line that raises it, with the conditions that lead there",
            ", ".join(f"`{name.rsplit('/', 1)[-1] if name.startswith('v1/') else name}`" for name in checked_in),
            lambda t: str(len(t.startup_checks)),
        ),
        row(
            "executor classes (backends that a variable splits / classes that run `--async-scheduling`)",
            "`Executor.get_class` in `v1/executor/abstract.py`, each class's `supports_async_scheduling`",
            executor_cell,
        ),
        row(
            "Prometheus metrics (gauges / counters / histograms), which `status` reads by name",
            "`v1/metrics/*.py`: each `_gauge_cls`, `_counter_cls`, `_histogram_cls`",
            metrics,
        ),
    ]
    return "\n".join(lines)


def keyless_table() -> str:
    """Per shipped vLLM version: the prefixes its key guards and every route it serves without the key, read from its
    source (vllmsource/routes.py)."""
    lines = ["| vLLM | the key guards | answers without the key (whoever reaches the port) |", "| --- | --- | --- |"]
    for version in knowledge.supported_versions():
        t = knowledge.load(version)
        lines.append(f"| {version} | {', '.join(f'`{p}`' for p in t.guarded_prefixes)} | {', '.join(f'`{r}`' for r in t.keyless_routes)} |")
    return "\n".join(lines)


def cli_page() -> str:
    """docs/reference/cli-options.md: every subcommand of the parser, its usage and each option with its help, as
    ``instinct-fleet SUBCOMMAND --help`` gives them (at a fixed width, so that the page does not follow the terminal)."""
    import argparse

    from instinct_fleet.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    lines = [
        "# Command line options",
        "",
        "Written from the command line's own parser by `scripts/sync_variable_docs.py`; `tests/unit/test_docs.py` holds it",
        "to the parser. What each command does, with examples: [Command line](cli.md).",
    ]
    for name, command in sub.choices.items():
        command.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
        lines += ["", f"## instinct-fleet {name}", "", str(helps.get(name) or "").rstrip(".") + ".", "", "```text"]
        lines += [command.format_usage().rstrip(), "```", "", "| argument | what it is |", "| --- | --- |"]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = ", ".join(action.option_strings) or action.metavar or action.dest
            # As a reader types it: a metavar with a shell operator (METRIC<=VALUE) quoted.
            metavar = (
                "" if not action.option_strings or action.nargs == 0 else f" {shlex.quote(str(action.metavar or action.dest.upper()))}"
            )
            said = (action.help or "").replace("|", "\\|").replace("\n", " ")
            if action.default not in (None, False, [], argparse.SUPPRESS) and action.option_strings:
                said += f" (default: `{action.default}`)"
            lines.append(f"| `{names}{metavar}` | {said} |")
    return "\n".join(lines) + "\n"


# Each generated table, the page of docs/ that holds it and the header line that finds it there.
TABLES = (
    ("reference/variables.md", r"^\| variable \| default \| meaning \|\n(?:^\|.*\|\n)+", "variables"),
    ("reference/rules.md", r"^\| rule \| severity \| why \|\n(?:^\|.*\|\n)+", "rules"),
    ("reference/vllm-versions.md", r"^\| kind \| read from \|.*\|\n(?:^\|.*\|\n)+", "start-up checks"),
    ("router.md", r"^\| vLLM \| the key guards \|.*\|\n(?:^\|.*\|\n)+", "routes vLLM serves without the key"),
)


def main() -> None:
    made = {
        "variables": readme_table,
        "rules": rules_table,
        "start-up checks": startup_table,
        "routes vLLM serves without the key": keyless_table,
    }
    for page, header, what in TABLES:
        path = ROOT / "docs" / page
        text = path.read_text()
        found = re.search(header, text, re.M)
        if found is None:
            raise SystemExit(f"docs/{page} has no table of the {what} to replace")
        path.write_text(text[: found.start()] + made[what]() + "\n" + text[found.end() :])
    (ROOT / "docs" / "reference" / "cli-options.md").write_text(cli_page())
    all_py = ROOT / "group_data" / "all.py"
    all_py.write_text(group_data_all(commented=False))
    # The project's one formatter owns the layout of Python files, generated or not.
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(all_py)], check=True)


if __name__ == "__main__":
    main()
