"""Built-in recipes: data files in ``instinct_fleet/model/recipes/``, one per seed launch command.

A recipe is data, not code, so that each env var and flag carries its value, a
one-line reason and (through the recipe) the seed it came from.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

ArgValue = str | int | float | bool


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


def _settings(table: dict[str, Any]) -> dict[str, Setting]:
    return {k: Setting(value=v["value"], why=v["why"]) for k, v in table.items()}


@cache
def all_recipes() -> dict[str, Recipe]:
    """Every built-in recipe, by name (the file name without ``.toml``)."""
    found: dict[str, Recipe] = {}
    for entry in sorted(resources.files("instinct_fleet.model").joinpath("recipes").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".toml"):
            continue
        data = tomllib.loads(entry.read_text())
        name = entry.name[: -len(".toml")]
        found[name] = Recipe(
            name=name,
            model=data["model"],
            summary=data["summary"],
            source=data["source"],
            port=data["port"],
            nodes=data.get("nodes", 1),
            env=_settings(data.get("env", {})),
            args=_settings(data.get("args", {})),
            notes=tuple(data.get("notes", ())),
            translated=tuple(Translation(**t) for t in data.get("translated", ())),
        )
    return found
