"""Every launch command of the seeds, on every supported vLLM version: rendered exactly, translated with a reason, or refused.

The table is tests/unit/seed_commands.toml, one row per command of the seeds (or per
line that gives two), each compared with the seed's own text (tests/unit/seed_text.py).
A row's verdict is what validation and rendering do with the command today; a change to a
recipe, a rule or a knowledge table that changes a verdict changes this table too.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from instinct_fleet.model import knowledge
from instinct_fleet.model.recipes import Recipe, all_recipes
from instinct_fleet.model.render import render_args
from instinct_fleet.model.rules import RULES
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


OWN = ("--port",)  # an instance's own key, as CUDA_VISIBLE_DEVICES is (its gpus): not the command's settings


def differences(parsed: LaunchCommand, svc: ServiceSpec, table: knowledge.VllmKnowledge) -> tuple[list[str], list[str]]:
    """(the seed's env vars and flags that the rendered instance does not carry as written, the rendered ones the
    seed does not write): each ``NAME=value`` or ``--flag value``, the instance's own keys left out."""
    seed_env = {k: v for k, v in parsed.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    seed_args = {k: v for k, v in argv_pairs(parsed, table).items() if k not in OWN}
    got = {k: v for k, v in flag_pairs(render_args(svc)).items() if k not in OWN}
    missing = [f"{k}={v}" for k, v in seed_env.items() if svc.env.get(k) != v]
    missing += [f"{k} {v or ''}".strip() for k, v in seed_args.items() if got.get(k, "MISSING") != v]
    added = [f"{k}={v}" for k, v in svc.env.items() if seed_env.get(k) != v]
    added += [f"{k} {v or ''}".strip() for k, v in got.items() if seed_args.get(k, "MISSING") != v]
    return missing, added


def names(text: str) -> set[str]:
    """The settings a translation's text names, as whole names: ``NAME`` of ``NAME=value``, ``flag`` of ``--flag``
    (dashes and underscores alike), and a model's own name; never a part of one (``dtype`` is not ``kv-cache-dtype``)."""
    found = set()
    for token in text.split():
        if token.startswith("--"):
            found.add(token[2:].split("=")[0].replace("_", "-"))
        elif "=" in token and token.split("=")[0].isupper():
            found.add(token.split("=")[0])
        elif "/" in token or token[:1].isalpha():
            found.add(token.split("/")[-1].replace("_", "-"))
    return found


def instance(parsed: LaunchCommand, name: str, model: str | None, version: str, nodes: int = 1) -> dict[str, Any]:
    """A command written as a vllm_instances entry: CUDA_VISIBLE_DEVICES and --port are the instance's own keys; an
    instance over ``nodes`` hosts takes its share of the GPUs on each."""
    table = knowledge.load(version)
    env = {k: v for k, v in parsed.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    args = {canonical_arg(k, table) if table.canonical_flag(k) else k: v for k, v in parsed.args.items()}
    port = args.pop("port", None)
    size = 1
    for flag in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"):
        size *= parallel_size(args, flag)
    visible = parsed.env.get("CUDA_VISIBLE_DEVICES")
    gpus = [int(g) for g in visible.split(",")] if visible else list(range(size // nodes))
    entry: dict[str, Any] = {"name": name, "gpus": gpus, "env": env, "args": args, "model": model or parsed.model}
    if port is not None:
        entry["port"] = int(str(port))
    return entry


def planned(row: dict[str, Any], data: dict[str, Any]) -> tuple[list[str], str, list[ServiceSpec]]:
    """Validate ``data`` on as many hosts as the row's recipe spans: (the error rules, ``; warns: RULE, ...`` for the
    rules of what vLLM starts with though not as meant, the head's services)."""
    nodes = all_recipes()[row["recipe"]].nodes if "recipe" in row else 1
    if nodes > 1:
        plans = check_cluster({**data, "vllm_nodes": nodes}, nodes)
        spec, findings = plans[0][0], [f for _, fs in plans for f in fs]
    else:
        spec, findings = check(data)
    warns = sorted({f.rule for f in findings if f.severity == "warning" and RULES[f.rule].starts})
    return sorted({f.rule for f in findings if f.severity == "error"}), "; warns: " + ", ".join(warns) if warns else "", list(spec.services)


def as_instances(row: dict[str, Any], version: str) -> dict[str, Any]:
    """The row's commands as written, each a ``vllm_instances`` entry on ``version``."""
    launches = [parse_launch_command(c, version) for c in row["commands"]]
    nodes = all_recipes()[row["recipe"]].nodes if "recipe" in row else 1
    entries = [instance(c, f"i{n}", row.get("model"), version, nodes) for n, c in enumerate(launches)]
    return {**pinned(version), "vllm_recipe": None, "vllm_instances": entries}


def seed_verdict(row: dict[str, Any], version: str) -> str:
    """The seed's own command as written (its placeholders filled by the row), validated alone as ``vllm_instances``
    entries on ``version``, on as many hosts as its recipe spans: ``accepted``, or ``refused: RULE, ...`` (rule ids)."""
    errors, warns, _ = planned(row, as_instances(row, version))
    return "refused: " + ", ".join(errors) if errors else "accepted" + warns


def verdict(row: dict[str, Any], version: str) -> str:
    """How instinct-fleet writes the command (its recipe, or the command as instance entries) on ``version``:

    - ``exact``: every env var and flag equal to the seed's, token for token, and nothing added;
    - ``extended``: the seed's all there as written, plus settings of the recipe that the seed does not write (each
      with the recipe's reason);
    - ``translated``: a seed setting changed or dropped, each named by a translation (the row's or the recipe's)
      with its reason; anything added is a recipe setting or a translation's result;
    - ``undocumented: ...``: a difference nothing names; ``refused: RULE, ...``: validation refuses it (rule ids).
    """
    table = knowledge.load(version)
    launches = [parse_launch_command(c, version) for c in row["commands"]]
    recipe = all_recipes()[row["recipe"]] if "recipe" in row else None
    data = {**pinned(version), "vllm_recipe": row["recipe"]} if recipe else as_instances(row, version)
    errors, warns, services = planned(row, data)
    if errors:
        return "refused: " + ", ".join(errors)
    return _rendered(row, recipe, launches, services, table) + warns


def _rendered(
    row: dict[str, Any], recipe: Recipe | None, launches: list[LaunchCommand], services: list[ServiceSpec], table: knowledge.VllmKnowledge
) -> str:
    """:func:`verdict` of a rendering that validates."""
    missing: list[str] = []
    added: list[str] = []
    for parsed, svc in zip(launches, services, strict=True):
        gone, extra = differences(parsed, svc, table)
        missing += gone + ([f"model {parsed.model}"] if row.get("model") is None and parsed.model != svc.model else [])
        added += extra
    if not missing and not added and not row.get("translations"):
        return "exact"
    translated = [(t["seed"], t["ours"]) for t in row.get("translations", [])]
    translated += [(t.seed, t.now) for t in recipe.translated] if recipe else []
    changed = {n for seed, _ in translated for n in names(seed)}
    results = {n for _, ours in translated for n in names(ours)}
    own = {f"{no}{k.replace('_', '-')}" for k in recipe.args for no in ("", "no-")} | set(recipe.env) if recipe else set()
    undocumented = [m for m in missing if setting(m) not in changed]
    undocumented += [f"+{a}" for a in added if setting(a) not in own | results]
    if undocumented:
        return "undocumented: " + ", ".join(undocumented)
    return "translated" if missing or row.get("translations") else "extended"


def setting(difference: str) -> str:
    """The name a difference is about, as :func:`names` gives it: the variable, the flag (without dashes, dashes and
    underscores alike) or the model's own name."""
    if difference.startswith("model "):
        return difference.split(" ", 1)[1].split("/")[-1].replace("_", "-")
    if difference.startswith("--"):
        return difference.split(" ")[0][2:].replace("_", "-")
    return difference.split("=")[0]


@pytest.mark.parametrize("row", FULL, ids=[f"{r['seed']}:{r['line']}" for r in FULL])
def test_seed_command_verdicts(row: dict[str, Any]) -> None:
    """Both verdicts of every row on every version: the seed's command alone, and as instinct-fleet writes it."""
    got = {version: {"seed": seed_verdict(row, version), "rendered": verdict(row, version)} for version in VERSIONS}
    assert got == {version: {"seed": row["seed_verdict"][version], "rendered": row["verdict"][version]} for version in VERSIONS}


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
    """docs/seeds.md's two tables are the table's counts, each verdict by its own kind."""
    text = (ROOT / "docs" / "seeds.md").read_text()
    for version in VERSIONS:
        seeds = [re.split("[:;]", row["seed_verdict"][version])[0] for row in FULL]
        assert f"| {version} | {seeds.count('accepted')} | {seeds.count('refused')} |" in text, version
        rendered = [re.split("[:;]", row["verdict"][version])[0] for row in FULL]
        counts = " | ".join(str(rendered.count(kind)) for kind in ("exact", "extended", "translated", "refused"))
        assert f"| {version} | {counts} |" in text, (version, counts)
        assert len(seeds) == len(rendered) == sum(rendered.count(k) for k in ("exact", "extended", "translated", "refused"))
    # What the text says of the rows where the two verdicts part.
    assert (ROWS["004:273"]["seed_verdict"]["0.22.0"], ROWS["004:273"]["verdict"]["0.22.0"]) == (
        "refused: flag-removed",
        "translated",
    )
    assert (ROWS["001:33"]["seed_verdict"]["0.11.0"], ROWS["001:33"]["verdict"]["0.11.0"]) == ("accepted", "refused: flag-unknown")
    assert "001:33's own command starts on 0.11.0, but its recipe" in text and "(004:273 on\n0.22.0" in text
    twins = len(TABLE) - len(FULL)
    assert f"all {len(COMMANDS)} `vllm serve` commands of the five seeds in {len(TABLE)} rows" in text
    assert f"{len(FULL)} with a verdict of their own and {twins} that repeat" in text
