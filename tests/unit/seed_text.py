"""Every ``vllm serve`` in a seed's own text, as the seed writes it.

Why: the seed table (seed_commands.toml) must hold each command as the seed gives it, so a
row copied wrongly fails. The only normalisation is the one a shell makes: line
continuations joined, runs of whitespace made one space. A command starts at the
``NAME=value`` prefixes right before ``vllm serve`` and ends at the end of its logical
line, or earlier where the seed's text stops being the command: a shell comment
(`` # ``), a redirection or pipe (``2>&1``, `` | ``), or a closing backtick of prose.
The ``export NAME=value`` lines of its block above it (up to the previous command or
the block's start) are part of what the shell runs: a name the command reads as
``$NAME`` is expanded, every other one becomes a ``NAME=value`` prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SERVE = "vllm serve"
# One env assignment as a shell prefix: NAME=value, NAME="value" or NAME='value'.
_PREFIX = re.compile(r"""(?:[A-Za-z_][A-Za-z0-9_]*=(?:"[^"]*"|'[^']*'|[^\s"'`]+)\s+)+$""")
_EXPORT = re.compile(r"""\bexport\s+([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|'[^']*'|[^\s"'`]+)""")
_END = re.compile(r"\s#\s|\s2>&1|\s\|\s|`")
# The word after `vllm serve` in running text ("the vllm serve call", "vllm serve flags"), not a model.
_PROSE = re.compile(r"^(?:[a-z]+\b(?![-/.])|$)")


@dataclass(frozen=True)
class Occurrence:
    """One ``vllm serve`` of a seed: its 1-based line, its place on that line, and its command text."""

    seed: str
    line: int
    index: int
    text: str

    @property
    def prose(self) -> bool:
        """Running text that names the command without giving one: no model follows ``vllm serve``."""
        return bool(_PROSE.match(self.text.split(SERVE, 1)[1].strip()))


def normalise(text: str) -> str:
    """A shell's reading of the text: continuations joined, whitespace collapsed."""
    return " ".join(re.sub(r"\\(\s|$)", " ", text).split())


def occurrences(path: Path) -> list[Occurrence]:
    """Every ``vllm serve`` of one seed file, in the order of the text."""
    seed = path.name.split("_", 1)[0]
    lines = path.read_text().splitlines()
    found = []
    for number, line in enumerate(lines, start=1):
        starts = [m.start() for m in re.finditer(re.escape(SERVE), line)]
        for index, start in enumerate(starts):
            head = line[:start]
            above = number - 1  # 1-based number of the line above; lines[above - 1] is its text
            while above >= 1 and lines[above - 1].rstrip().endswith("\\"):  # env prefixes continued onto this line
                head = lines[above - 1].rstrip()[:-1] + " " + head
                above -= 1
            prefix = _PREFIX.search(head)
            rest = line[start:]
            following = number
            while rest.rstrip().endswith("\\") and following < len(lines):
                rest = rest.rstrip()[:-1] + " " + lines[following]
                following += 1
            end = _END.search(rest, len(SERVE))
            command = (head[prefix.start() :] if prefix else "") + (rest[: end.start()] if end else rest)
            exported = _EXPORT.findall(head if index == 0 else "") + (_exports(lines, above) if index == 0 else [])
            found.append(Occurrence(seed, number, index, normalise(_with_exports(command, exported))))
    return found


def _exports(lines: list[str], above: int) -> list[tuple[str, str]]:
    """The ``export`` lines of the block above line ``above + 1``: up to a line that is neither an export,
    a comment nor blank (the previous command, or the text before the block)."""
    found: list[tuple[str, str]] = []
    while above >= 1:
        text = lines[above - 1].strip()
        if not (text == "" or text.startswith("#") or text.startswith("export ")):
            break
        found = _EXPORT.findall(text) + found
        above -= 1
    return found


def _with_exports(command: str, exported: list[tuple[str, str]]) -> str:
    """The command as the shell runs it after the exports: ``$NAME`` expanded, other names as prefixes."""
    prefixes = []
    for name, value in exported:
        if f"${name}" in command:
            command = re.sub(rf"\${name}\b", value.strip("\"'"), command)
        else:
            prefixes.append(f"{name}={value}")
    return " ".join([*prefixes, command])
