"""Every launch command of the seeds, on every supported vLLM version: rendered exactly, translated with a reason, or refused.

The table is tests/unit/seed_commands.toml. A row's verdict is what validation and
rendering do with the command today; a change to a recipe, a rule or a knowledge
table that changes a verdict changes this table too.
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

from .conftest import check, check_cluster
from .test_seed_recipes import argv_pairs, flag_pairs

ROOT = Path(__file__).resolve().parents[2]
TABLE = tomllib.loads((Path(__file__).parent / "seed_commands.toml").read_text())["command"]
VERSIONS = knowledge.supported_versions()
SEEDS = Path(str(resources.files("instinct_fleet.model").joinpath("knowledge", "seeds")))  # the seeds as the package ships them


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
    commands = [parse_launch_command(c, version) for c in row["commands"]]
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
        data["vllm_instances"] = [instance(c, f"i{n}", row.get("model"), version) for n, c in enumerate(commands)]
        spec, findings = check(data)
    errors = sorted({f.rule for f in findings if f.severity == "error"})
    if errors:
        return "refused: " + ", ".join(errors)
    gone = [m for c, svc in zip(commands, spec.services, strict=True) for m in missing(c, svc, table)]
    if row.get("model") is None:
        gone += [f"model {c.model}" for c, svc in zip(commands, spec.services, strict=True) if c.model != svc.model]
    if not gone:
        return "exact"
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


@pytest.mark.parametrize("row", TABLE, ids=[f"{r['seed']}:{r['line']}" for r in TABLE])
def test_seed_command_verdicts(row: dict[str, Any]) -> None:
    got = {version: verdict(row, version) for version in VERSIONS}
    assert got == row["verdict"]


@pytest.mark.parametrize("row", TABLE, ids=[f"{r['seed']}:{r['line']}" for r in TABLE])
def test_row_cites_its_seed_line(row: dict[str, Any]) -> None:
    """The cited line is a `vllm serve` command of that seed, with the command's model (or a placeholder the row fills)."""
    (path,) = SEEDS.glob(f"{row['seed']}_*.txt")
    lines = path.read_text().splitlines()
    near = " ".join(lines[max(0, row["line"] - 3) : row["line"] + 4])
    first = parse_launch_command(row["commands"][0], VERSIONS[-1])
    assert "vllm serve" in near
    model = row.get("written_as") or first.model or ""
    assert model in near or row.get("model") or model.split("/")[-1] in near, (row["seed"], row["line"], model)


def test_every_seed_serve_command_is_in_the_table() -> None:
    """Each seed's `vllm serve` lines are covered by a row near them, but for the prose mentions counted below."""
    for seed in ("000", "001", "002", "004"):
        (path,) = SEEDS.glob(f"{seed}_*.txt")
        text = path.read_text()
        serve_lines = {n + 1 for n, line in enumerate(text.splitlines()) if "vllm serve" in line and "2>&1" not in line}
        rows = {r["line"] for r in TABLE if r["seed"] == seed}
        listed = sum(1 for n in serve_lines if any(abs(n - r) <= 3 for r in rows))
        assert listed >= len(serve_lines) - PROSE_MENTIONS[seed], (seed, sorted(serve_lines), sorted(rows))


# `vllm serve` lines that are prose, not commands: 000 line 8 ("...vllm serve call so..."),
# 002's mentions in running text (lines 231, 302-318 are `vllm bench`), 004's duplicate of line 273 (303).
PROSE_MENTIONS = {"000": 1, "001": 0, "002": 2, "004": 1}


def test_readme_gives_the_tables_counts() -> None:
    text = (ROOT / "README.md").read_text()
    for version in VERSIONS:
        verdicts = [row["verdict"][version].split(":")[0] for row in TABLE]
        counts = [verdicts.count(kind) for kind in ("exact", "translated", "refused")]
        assert f"| {version} | {counts[0]} | {counts[1]} | {counts[2]} |" in text, (version, counts)
    assert f"lists the {len(TABLE)} `vllm serve` commands" in text
