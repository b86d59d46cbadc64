"""What a project can name: the recipes and the vLLM tables, the package's and the project's own.

The package ships recipes and the tables of the vLLM versions it is tested with. A project may
add its own beside its deploy.py: ``recipes/*.toml`` (the shipped schema) and
``vllm-facts/vllm-<version>.json`` (written by ``instinct-fleet vllm-facts``). One
:class:`Catalog` per run holds both, and every spec carries the table it was validated against,
so rendering and checks read the same facts. A project's file never replaces a shipped one: the
shipped versions stay the tested ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from instinct_fleet.model import knowledge
from instinct_fleet.model.recipes import Recipe, RecipeError, all_recipes, project_recipes

RECIPES_DIR = "recipes"
FACTS_DIR = "vllm-facts"


class CatalogError(Exception):
    """A project's recipe or table that cannot be read; the message names the file and what is wrong."""


def facts_file(project: Path, version: str) -> Path:
    return project / FACTS_DIR / f"vllm-{version}.json"


@dataclass(frozen=True)
class Catalog:
    """The recipes and tables one project sees (``project`` None: the package's alone)."""

    project: Path | None = None
    recipes: dict[str, Recipe] = field(default_factory=all_recipes)
    facts: dict[str, Path] = field(default_factory=dict)  # the project's own tables, by version

    @classmethod
    def of(cls, project: Path | None) -> Catalog:
        """The project's catalog; CatalogError for a recipe or table of its own that is not one."""
        if project is None:
            return cls()
        try:
            own = project_recipes(project / RECIPES_DIR)
        except RecipeError as exc:
            raise CatalogError(str(exc)) from None
        facts = {}
        shipped = set(knowledge.supported_versions())
        for path in sorted((project / FACTS_DIR).glob("vllm-*.json")):
            version = path.name[len("vllm-") : -len(".json")]
            where = f"{FACTS_DIR}/{path.name}"
            if version in shipped:
                raise CatalogError(f"{where}: vLLM {version} is shipped with instinct-fleet and tested; remove the project's copy")
            try:
                table = knowledge.load_file(path.resolve())
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CatalogError(f"{where}: not a table instinct-fleet vllm-facts wrote ({type(exc).__name__}: {exc})") from None
            if table.version != version:
                raise CatalogError(f"{where}: holds the table of vLLM {table.version}, not {version}")
            facts[version] = path.resolve()
        return cls(project, {**all_recipes(), **own}, facts)

    def table(self, version: str) -> knowledge.VllmKnowledge | None:
        """The table of ``version``: shipped, else the project's own; None when there is neither."""
        if version in self.facts:
            return knowledge.load_file(self.facts[version])
        return knowledge.find(version)

    def versions(self) -> list[str]:
        """Every version with a table, oldest first."""
        return sorted({*knowledge.supported_versions(), *self.facts}, key=_version_key)

    def table_source(self, version: str) -> str:
        """Where the table of ``version`` comes from, as ``plan`` says it."""
        if version in self.facts:
            return f"the project's {FACTS_DIR}/vllm-{version}.json (instinct-fleet vllm-facts; not tested by instinct-fleet)"
        return "shipped with instinct-fleet" if knowledge.find(version) is not None else "none"


def _version_key(version: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in version.replace("rc", ".rc.").replace("post", ".post.").split("."))


def write_facts(project: Path, data: dict[str, object]) -> Path:
    """Store an extracted table in the project, after reading it back as validation will."""
    knowledge.from_json(json.loads(json.dumps(data)))
    path = facts_file(project, str(data["version"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path
