"""What a pinned vLLM release accepts: env var names and ``vllm serve`` flags.

The per-version tables under ``knowledge/`` are generated from vLLM's own source
by ``scripts/extract_vllm_knowledge.py``; ``replaced.toml`` is curated and says
what replaced a setting that a newer vLLM (or V1) no longer knows, so an error can
say what to write instead.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

FlagKind = Literal["bool", "switch", "value", "optional_value"]


@dataclass(frozen=True)
class Flag:
    """One ``vllm serve`` flag. ``bool`` flags also accept ``--no-<name>``.

    ``upper_case`` choices are Enum members that vLLM looks up with
    ``value.upper()``; ``json_fields`` are the keys of a JSON config flag (its
    config forbids any other) with the choices of each; ``default`` is the
    version's default where it is a constant.
    """

    name: str
    kind: FlagKind
    choices: tuple[str, ...] = ()
    upper_case: bool = False
    json_fields: dict[str, Flag] | None = None
    default: str | int | float | bool | None = None

    def accepts(self, value: str) -> bool:
        """Whether ``value`` is one of the choices, the way vLLM compares it."""
        return (value.upper() if self.upper_case else value) in self.choices


@dataclass(frozen=True)
class Replacement:
    """Why a name is gone and what to use instead."""

    replacement: str
    why: str
    source: str


@dataclass(frozen=True)
class VllmKnowledge:
    version: str
    source: str
    env_vars: frozenset[str]
    env_unread: frozenset[str]  # defined in envs.py, but no running code reads them
    flags: dict[str, Flag]
    aliases: dict[str, str]

    def canonical_flag(self, name: str) -> str | None:
        """Return the long flag name (without dashes) for ``name``, or None if unknown.

        ``name`` may carry leading dashes, underscores (vLLM's parser turns them
        into dashes), be a short alias such as ``tp`` or a unique prefix.
        """
        bare = name.lstrip("-").replace("_", "-")
        if f"--{bare}" in self.flags:
            return bare
        for alias in (f"-{bare}", f"--{bare}"):
            if alias in self.aliases:
                return self.aliases[alias].lstrip("-")
        # argparse accepts a unique prefix of a long option (001 writes --tensor-parallel)
        prefixed = [f for f in self.flags if f.startswith(f"--{bare}")]
        return prefixed[0].lstrip("-") if len(prefixed) == 1 else None

    def removed(self, name: str, table: dict[str, Replacement]) -> tuple[str, Replacement] | None:
        """The entry of ``table`` that ``name`` (or a prefix spelling of it) refers to."""
        bare = name.lstrip("-").replace("_", "-")
        hits = [k for k in table if k == bare or k.startswith(bare)]
        return (hits[0], table[hits[0]]) if len(hits) == 1 else None

    def flag(self, name: str) -> Flag:
        return self.flags[f"--{name}"]

    def suggest_flag(self, name: str) -> list[str]:
        bare = name.lstrip("-").replace("_", "-")
        pool = [f.lstrip("-") for f in self.flags]
        prefixed = [f for f in pool if f.startswith(bare)]
        close = difflib.get_close_matches(bare, pool, n=3, cutoff=0.75)
        return list(dict.fromkeys(prefixed[:3] + close))[:3]

    def suggest_env(self, name: str) -> list[str]:
        return difflib.get_close_matches(name, sorted(self.env_vars), n=3, cutoff=0.75)


def supported_versions() -> list[str]:
    """Versions with a generated table, oldest first."""
    files = resources.files("instinct_fleet").joinpath("knowledge").iterdir()
    versions = [f.name[len("vllm-") : -len(".json")] for f in files if f.name.startswith("vllm-")]
    return sorted(versions, key=lambda v: tuple(int(p) for p in v.split(".")))


@cache
def load(version: str) -> VllmKnowledge:
    """Load the table for ``version``; raise KeyError if there is none."""
    if version not in supported_versions():
        raise KeyError(version)
    path = resources.files("instinct_fleet").joinpath("knowledge", f"vllm-{version}.json")
    data = json.loads(path.read_text())
    flags = {
        name: Flag(
            name=name.lstrip("-"),
            kind=info["kind"],
            choices=tuple(info.get("choices", ())),
            upper_case=info.get("choices_case") == "upper",
            json_fields=(
                {k: Flag(k, "value", tuple(v.get("choices", ())), v.get("choices_case") == "upper") for k, v in info["json_fields"].items()}
                if "json_fields" in info
                else None
            ),
            default=info.get("default"),
        )
        for name, info in data["flags"].items()
    }
    return VllmKnowledge(
        version=data["version"],
        source=data["source"],
        env_vars=frozenset(data["env_vars"]),
        env_unread=frozenset(data["env_unread"]),
        flags=flags,
        aliases=dict(data["aliases"]),
    )


@cache
def replacements() -> tuple[dict[str, Replacement], dict[str, Replacement]]:
    """Curated tables of removed flags and env vars: (flags, env)."""
    path = resources.files("instinct_fleet").joinpath("knowledge", "replaced.toml")
    data = tomllib.loads(path.read_text())
    flags = {k: Replacement(**v) for k, v in data.get("flags", {}).items()}
    env = {k: Replacement(**v) for k, v in data.get("env", {}).items()}
    return flags, env
