"""Every launch command of the seeds, on every supported vLLM version: rendered exactly, translated with a reason, or refused.

The table is tests/unit/seed_commands.toml, one row per command of the seeds (or per
line that gives two), each compared with the seed's own text (tests/unit/seed_text.py).
A row's verdict is what validation and rendering do with the command today; a change to a
recipe, a rule or a knowledge table that changes a verdict changes this table too.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from instinct_fleet.model import knowledge
from instinct_fleet.model.recipes import all_recipes
from instinct_fleet.model.render import render_args
from instinct_fleet.model.spec import ServiceSpec, canonical_arg, parallel_size
from tests.unit.launch import LaunchCommand, parse_launch_command
from tests.unit.seed_text import Occurrence, normalise, occurrences

from .conftest import check, check_cluster
from .test_seed_recipes import argv_pairs, flag_pairs

ROOT = Path(__file__).resolve().parents[2]
TABLE = tomllib.loads((Path(__file__).parent / "seed_commands.toml").read_text())["command"]
VERSIONS = knowledge.supported_versions()
SEEDS = Path(str(resources.files("instinct_fleet.model").joinpath("knowledge", "seeds")))  # the seeds as the package ships them
OCCURRENCES = [o for path in sorted(SEEDS.glob("*.txt")) for o in occurrences(path)]
COMMANDS = [o for o in OCCURRENCES if not o.prose]
ROWS = {f"{row['seed']}:{row['line']}": row for row in TABLE}
FULL = [row for row in TABLE if "twin" not in row]  # the rows with a verdict of their own


def commands(row: dict[str, Any]) -> list[str]:
    """The commands a row stands for: its own, or its twin's (the same text elsewhere in the seeds)."""
    return ROWS[row["twin"]]["commands"] if "twin" in row else row["commands"]


def translations(row: dict[str, Any]) -> list[dict[str, str]]:
    """What a row changes in the seed's text, each with its reason; a twin's are its twin's."""
    return ROWS[row["twin"]].get("translations", []) if "twin" in row else row.get("translations", [])


def covered(row: dict[str, Any]) -> list[Occurrence]:
    """The seed's commands a row covers: the one at its line, and as many following ones as it holds commands."""
    start = next(n for n, o in enumerate(COMMANDS) if (o.seed, o.line, o.index) == (row["seed"], row["line"], 0))
    return COMMANDS[start : start + len(commands(row))]


def pinned(version: str) -> dict[str, Any]:
    return {"vllm_version": version, "vllm_image": f"vllm/vllm-openai-rocm:v{version}"}


def missing(parsed: LaunchCommand, svc: ServiceSpec, table: knowledge.VllmKnowledge) -> list[str]:
    """The seed's env vars and flags that the rendered instance does not carry as written."""
    gone = [f"{k}={v}" for k, v in parsed.env.items() if k != "CUDA_VISIBLE_DEVICES" and svc.env.get(k) != v]
    got = flag_pairs(render_args(svc))
    got["--port"] = str(svc.port)
    return gone + [f"{k} {v or ''}".strip() for k, v in argv_pairs(parsed, table).items() if got.get(k, "MISSING") != v]


def instance(parsed: LaunchCommand, name: str, model: str | None, version: str) -> dict[str, Any]:
    """A command written as a vllm_instances entry: CUDA_VISIBLE_DEVICES and --port are the instance's own keys."""
    table = knowledge.load(version)
    env = {k: v for k, v in parsed.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    args = {canonical_arg(k, table) if table.canonical_flag(k) else k: v for k, v in parsed.args.items()}
    port = args.pop("port", None)
    size = 1
    for flag in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"):
        size *= parallel_size(args, flag)
    visible = parsed.env.get("CUDA_VISIBLE_DEVICES")
    gpus = [int(g) for g in visible.split(",")] if visible else list(range(size))
    entry: dict[str, Any] = {"name": name, "gpus": gpus, "env": env, "args": args, "model": model or parsed.model}
    if port is not None:
        entry["port"] = int(str(port))
    return entry


def verdict(row: dict[str, Any], version: str) -> str:
    table = knowledge.load(version)
    launches = [parse_launch_command(c, version) for c in row["commands"]]
    if "recipe" in row:
        recipe = all_recipes()[row["recipe"]]
        data = {**pinned(version), "vllm_recipe": row["recipe"]}
        if recipe.nodes > 1:
            planned = check_cluster({**data, "vllm_nodes": recipe.nodes}, recipe.nodes)
            spec, findings = planned[0][0], [f for _, fs in planned for f in fs]
        else:
            spec, findings = check(data)
    else:
        data = {**pinned(version), "vllm_recipe": None, "vllm_instances": []}
        data["vllm_instances"] = [instance(c, f"i{n}", row.get("model"), version) for n, c in enumerate(launches)]
        spec, findings = check(data)
    errors = sorted({f.rule for f in findings if f.severity == "error"})
    if errors:
        return "refused: " + ", ".join(errors)
    gone = [m for c, svc in zip(launches, spec.services, strict=True) for m in missing(c, svc, table)]
    if row.get("model") is None:
        gone += [f"model {c.model}" for c, svc in zip(launches, spec.services, strict=True) if c.model != svc.model]
    if not gone:
        return "translated" if row.get("translations") else "exact"
    if "recipe" in row:
        translated = all_recipes()[row["recipe"]].translated
        seeds = " ".join(t.seed for t in translated)
        undocumented = [m for m in gone if _named(m) not in seeds.replace("_", "-")]
        if not undocumented:
            return "translated"
        return "undocumented: " + ", ".join(undocumented)
    return "differs: " + ", ".join(gone)


def _named(difference: str) -> str:
    """What a recipe's translation names for a difference: the variable, the flag, or the model's own name."""
    if difference.startswith("model "):
        return difference.split(" ", 1)[1].split("/")[-1].replace("_", "-")
    return difference.split("=")[0].split(" ")[0].lstrip("-").replace("_", "-")


@pytest.mark.parametrize("row", FULL, ids=[f"{r['seed']}:{r['line']}" for r in FULL])
def test_seed_command_verdicts(row: dict[str, Any]) -> None:
    got = {version: verdict(row, version) for version in VERSIONS}
    assert got == row["verdict"]


@pytest.mark.parametrize("row", TABLE, ids=[f"{r['seed']}:{r['line']}" for r in TABLE])
def test_row_is_the_seeds_own_text(row: dict[str, Any]) -> None:
    """The seed's text at the row's line, with the row's recorded translations applied, is the row's command,
    character for character after a shell's normalisation: a mis-copied flag, env var or model fails."""
    seed = [o.text for o in covered(row)]
    for translation in translations(row):
        assert translation["why"].strip() and translation["seed"] in " ".join(seed), translation
        seed = [text.replace(translation["seed"], translation["ours"]) for text in seed]
    assert seed == [normalise(c) for c in commands(row)]


def test_every_seed_command_is_one_rows() -> None:
    """All five seeds, every `vllm serve` that is a command: each belongs to exactly one row, a twin points at
    a row with a verdict of its own, and what is left is running text that names no model."""
    owners = [(o.seed, o.line, o.index) for row in TABLE for o in covered(row)]
    assert sorted(owners) == sorted((o.seed, o.line, o.index) for o in COMMANDS)
    assert all(ROWS[row["twin"]].get("twin") is None for row in TABLE if "twin" in row)
    assert {o.seed for o in COMMANDS} == {"000", "001", "002", "003", "004"} and len(COMMANDS) == 75
    assert [(o.seed, o.line) for o in OCCURRENCES if o.prose] == [("000", 8), ("000", 45), ("002", 231), ("003", 534)]


def test_the_seed_docs_give_the_tables_counts() -> None:
    text = (ROOT / "docs" / "seeds.md").read_text()
    for version in VERSIONS:
        verdicts = [row["verdict"][version].split(":")[0] for row in FULL]
        counts = [verdicts.count(kind) for kind in ("exact", "translated", "refused")]
        assert f"| {version} | {counts[0]} | {counts[1]} | {counts[2]} |" in text, (version, counts)
    twins = len(TABLE) - len(FULL)
    assert f"all {len(COMMANDS)} `vllm serve` commands of the five seeds in {len(TABLE)} rows" in text
    assert f"{len(FULL)} with a verdict of their own and {twins} that repeat" in text
