"""Recipes: the built-in ones in ``instinct_fleet/model/recipes/``, one per seed launch command, and a project's own.

A recipe is data, not code, so that each env var and flag carries its value, a
one-line reason and (through the recipe) the seed it came from.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

ArgValue = str | int | float | bool
SHIPPED = "instinct-fleet"  # the owner of the package's own recipes


@dataclass(frozen=True)
class Setting:
    """A value with the reason it is there, for ``--explain``."""

    value: ArgValue
    why: str


@dataclass(frozen=True)
class Translation:
    """A seed setting that the pinned vLLM spells differently (or no longer has)."""

    seed: str
    now: str
    why: str


@dataclass(frozen=True)
class Recipe:
    name: str
    model: str
    summary: str
    source: str
    port: int
    nodes: int
    env: dict[str, Setting]
    args: dict[str, Setting]
    notes: tuple[str, ...]
    translated: tuple[Translation, ...]
    owner: str = SHIPPED  # whose it is: the package's, or the project file that holds it


class RecipeError(Exception):
    """A recipe file that does not follow the schema; the message names the file, the key and what is wrong."""


class _Setting(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    value: StrictStr | StrictBool | StrictInt | StrictFloat
    why: StrictStr = Field(min_length=1)


class _Translation(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    seed: StrictStr
    now: StrictStr
    why: StrictStr


class _RecipeFile(BaseModel):
    """The schema of a recipe file, the shipped ones' and a project's alike (docs/recipes.md)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: StrictStr = Field(min_length=1)
    summary: StrictStr = Field(min_length=1)
    source: StrictStr = ""  # where the settings come from: a seed and its section for the shipped ones
    port: StrictInt = Field(ge=1, le=65535)
    nodes: StrictInt = Field(default=1, ge=1)
    notes: list[StrictStr] = []
    translated: list[_Translation] = []
    env: dict[StrictStr, _Setting] = {}
    args: dict[StrictStr, _Setting] = {}


def parse(name: str, text: str, owner: str, where: str) -> Recipe:
    """One recipe from its TOML text; RecipeError (with ``where``, the key and the line for TOML's own errors) otherwise."""
    try:
        data = _RecipeFile.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{where}: not TOML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}" for e in exc.errors())
        raise RecipeError(f"{where}: {problems}") from None
    return Recipe(
        name=name,
        model=data.model,
        summary=data.summary,
        source=data.source or where,
        port=data.port,
        nodes=data.nodes,
        env={k: Setting(v.value, v.why) for k, v in data.env.items()},
        args={k: Setting(v.value, v.why) for k, v in data.args.items()},
        notes=tuple(data.notes),
        translated=tuple(Translation(t.seed, t.now, t.why) for t in data.translated),
        owner=owner,
    )


@cache
def all_recipes() -> dict[str, Recipe]:
    """Every built-in recipe, by name (the file name without ``.toml``)."""
    found: dict[str, Recipe] = {}
    for entry in sorted(resources.files("instinct_fleet.model").joinpath("recipes").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            name = entry.name[: -len(".toml")]
            found[name] = parse(name, entry.read_text(), SHIPPED, f"instinct_fleet/model/recipes/{entry.name}")
    return found


def project_recipes(directory: Path) -> dict[str, Recipe]:
    """A project's own recipes: ``recipes/*.toml`` beside its deploy.py, each checked against the same schema. A name
    that is also a shipped recipe's is refused: which of the two a host gets would not be plain from its data."""
    found: dict[str, Recipe] = {}
    if not directory.is_dir():
        return found
    shipped = all_recipes()
    for path in sorted(directory.glob("*.toml")):
        name, where = path.stem, f"{directory.name}/{path.name}"
        if name in shipped:
            raise RecipeError(f"{where}: {name!r} is the name of a shipped recipe (instinct-fleet recipes); give yours another name")
        found[name] = parse(name, path.read_text(), where, where)
    return found
