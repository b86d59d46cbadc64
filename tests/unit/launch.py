"""Parse a shell launch command (``VAR=1 vllm serve MODEL --flag ...``) into spec data.

Why: users arrive with commands from blog posts and run_cluster.sh scripts. This
turns one into the ``vllm_env``/``vllm_args``/``vllm_model`` the spec takes, so
every seed command can be expressed, and the tests can hold each recipe against
the seed it came from.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from instinct_fleet.model import knowledge
from instinct_fleet.model.recipes import ArgValue

ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


@dataclass
class LaunchCommand:
    env: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    args: dict[str, ArgValue] = field(default_factory=dict)


def _bool_word(value: str) -> bool | None:
    return {"true": True, "false": False}.get(value.lower())


def parse_launch_command(command: str, version: str) -> LaunchCommand:
    """Parse ``export`` lines, env prefixes and ``vllm serve`` flags.

    Flag names stay as written (abbreviations and removed flags included) so
    validation can point at them; ``--flag=False`` becomes ``False``.
    """
    table = knowledge.load(version)
    tokens = shlex.split(command.replace("\\\n", " "), comments=True)
    parsed = LaunchCommand()
    i = 0
    while i < len(tokens) and tokens[i] != "vllm":
        if tokens[i] != "export" and (m := ASSIGN.match(tokens[i])):
            parsed.env[m.group(1)] = m.group(2)
        i += 1
    if tokens[i : i + 2] != ["vllm", "serve"]:
        raise ValueError("no 'vllm serve' in the command")
    i += 2
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("-"):
            if parsed.model is not None:
                raise ValueError(f"unexpected positional argument {token!r}")
            parsed.model = token
            i += 1
            continue
        name, sep, inline = token.lstrip("-").partition("=")
        canonical = table.canonical_flag(name)
        kind = table.flag(canonical).kind if canonical else None
        if sep:
            word = _bool_word(inline)
            parsed.args[name] = word if word is not None and kind in ("bool", "switch", None) else inline
            i += 1
        elif name.startswith("no-") and canonical is None and table.canonical_flag(name[3:]):
            parsed.args[name[3:]] = False
            i += 1
        elif kind in ("bool", "switch") or i + 1 >= len(tokens) or tokens[i + 1].startswith("-"):
            parsed.args[name] = True
            i += 1
        else:
            parsed.args[name] = tokens[i + 1]
            i += 2
    return parsed
