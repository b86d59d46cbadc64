"""The accuracy probe: prompts whose answers a machine can check, asked of an instance before and after a change.

Why: on ROCm the failures that hurt most answer HTTP 200 with wrong text (a kernel change took GSM8K from 91.6%
to 14.9%, vllm#54924; AITER's fused all-reduce wrote degenerate digits mid-generation, ROCm/aiter#4855). Speed
figures do not see them; a probe whose answers are checked item by item does.

The built-in set (:func:`builtin`) is generated here, deterministically: BUILTIN_SIZE arithmetic items of four
shapes over two-digit operands, each with its exact integer result. The project wrote it (no third-party data; the
project's licence). A team's own golden prompts come from a JSONL file (``canary_probe``), one object per line:
``{"prompt": "...", "answer": "42"}`` (checked as :func:`final_number` below) or ``{"prompt": "...", "pattern":
"regex"}`` (right when the regex is found in the answer, Python's ``re.search``).

**Extraction rule** for an ``answer`` item: the last number in the answer's text (an optional sign, digits with
optional thousands commas and an optional decimal part) is read as a decimal and compared with the item's answer
as a decimal: ``42``, ``42.0`` and ``1,024`` match ``42``, ``42`` and ``1024``.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from instinct_fleet.model.spec import HostSpec

BUILTIN_SIZE = 250  # items of the built-in set; canary_probe_size asks the first of them
BUILTIN_SEED = 20261127  # the generator's seed: the set is the same on every machine and release
MAX_PROMPT_BYTES = 256 * 1024  # the prompts travel to the host in the probe's command (accuracy.command)
INSTRUCTION = "Reply with the final result as a number on the last line."
NUMBER = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-+]?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Item:
    """One prompt and how its answer is checked: ``answer`` (the final number) or ``pattern`` (a regex)."""

    prompt: str
    answer: str | None = None
    pattern: str | None = None

    def right(self, text: str) -> bool:
        """Whether ``text`` answers the item (the module's extraction rule, or the pattern found in it)."""
        if self.pattern is not None:
            return re.search(self.pattern, text) is not None
        found = final_number(text)
        return found is not None and self.answer is not None and found == _decimal(self.answer)


def final_number(text: str) -> Decimal | None:
    """The last number in ``text`` as a decimal (thousands commas removed); None when it has none."""
    numbers = NUMBER.findall(text)
    return _decimal(numbers[-1].replace(",", "")) if numbers else None


def _decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text.strip().replace(",", ""))
    except InvalidOperation:
        return None


@cache
def builtin() -> tuple[Item, ...]:
    """The shipped set: BUILTIN_SIZE items, the same for every call (a seeded generator, not a random one)."""
    draw = random.Random(BUILTIN_SEED)
    items = []
    for index in range(BUILTIN_SIZE):
        a, b, c, d = (draw.randint(11, 99) for _ in range(4))
        shape = index % 4
        if shape == 0:
            expression, value = f"{a} + {b} * {c}", a + b * c
        elif shape == 1:
            expression, value = f"({a} - {b}) * {c}", (a - b) * c
        elif shape == 2:
            expression, value = f"{a} * {b} - {c}", a * b - c
        else:
            expression, value = f"{a} * {b} + {c} * {d}", a * b + c * d
        items.append(Item(f"Compute {expression}. {INSTRUCTION}", answer=str(value)))
    return tuple(items)


def read(path: Path) -> tuple[tuple[Item, ...], str | None]:
    """A team's probe file: its items, or None's place taken by what is wrong with it (the first mistake, with its line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return (), f"cannot read {path}: {exc}"
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            return (), f"{path} line {number} is not JSON ({exc}): one object per line"
        item, wrong = _item(record)
        if wrong is not None:
            return (), f"{path} line {number}: {wrong}"
        assert item is not None
        items.append(item)
    if not items:
        return (), f"{path} has no items: one JSON object per line with a prompt and an answer or a pattern"
    size = sum(len(i.prompt.encode()) for i in items)
    if size > MAX_PROMPT_BYTES:
        return (), f"{path} holds {size} bytes of prompts, more than the probe carries ({MAX_PROMPT_BYTES}): keep fewer or shorter items"
    return tuple(items), None


def _item(record: object) -> tuple[Item | None, str | None]:
    if not isinstance(record, dict):
        return None, "not a JSON object"
    prompt, answer, pattern = record.get("prompt"), record.get("answer"), record.get("pattern")
    if not isinstance(prompt, str) or not prompt.strip():
        return None, 'no "prompt" (a non-empty string)'
    if (answer is None) == (pattern is None):
        return None, 'give exactly one of "answer" (the final number) and "pattern" (a regex the answer must contain)'
    if pattern is not None:
        if not isinstance(pattern, str) or not pattern:
            return None, '"pattern" must be a non-empty string'
        try:
            re.compile(pattern)
        except re.error as exc:
            return None, f'"pattern" {pattern!r} is not a regular expression: {exc}'
        return Item(prompt, pattern=pattern), None
    if isinstance(answer, bool) or not isinstance(answer, str | int | float) or _decimal(str(answer)) is None:
        return None, f'"answer" {answer!r} is not a number (use "pattern" for an answer that is not one)'
    return Item(prompt, answer=str(answer)), None


def items(source: Path | None, size: int) -> tuple[tuple[Item, ...], str | None]:
    """The first ``size`` items of ``source`` (a team's file) or of the built-in set, and what is wrong with the file."""
    found, wrong = read(source) if source is not None else (builtin(), None)
    return found[:size], wrong


def of(spec: HostSpec) -> tuple[tuple[Item, ...], str, str | None]:
    """The probe the host's canary and ``bench --accuracy`` ask: its items (``canary_probe_size`` of ``canary_probe``,
    a path of the project), where they come from, and what is wrong with the file (validation refuses it)."""
    v = spec.vars
    found, wrong = items(spec.local(v.canary_probe) if v.canary_probe else None, v.canary_probe_size)
    return found, v.canary_probe or "built-in", wrong
