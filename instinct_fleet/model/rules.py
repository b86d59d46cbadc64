"""The validation rules: id, severity and the reason or source behind each.

Rules live in one table so the CLI, the docs (docs/reference/rules.md) and the tests all name the same
ids. Errors stop a run before any connection; warnings are printed and the run
goes on.

A rule about vLLM tells apart two outcomes: vLLM **refuses to start** (an error: the
instance would crash-loop), and vLLM **starts, but not as you meant** (it warns and
ignores a variable, or emulates a format slowly). The second kind (``starts=True``)
is a warning by default, and ``validation_levels`` raises it to an error per host or
group: validated means "it starts", in both directions.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from instinct_fleet.model.hostrules import GPU_RULES, HOST_RULES, STARTUP_RULES
from instinct_fleet.model.ruletable import INPUT_RULES, Rule, Severity


@dataclass(frozen=True)
class Finding:
    """One rule tripped, on one host (None for ``render``), for one key; ``origin`` says where the inventory set the value."""

    rule: str
    severity: Severity
    host: str | None
    key: str
    message: str
    origin: str | None = None  # "vllm_args, set in group_data/gpu.py line 2": the variable and the file that wrote it
    also: tuple[str, ...] = ()  # other variables the rule compares the key with: their files are named too

    def __str__(self) -> str:
        return self.line([self.host] if self.host else [])

    def line(self, hosts: Sequence[str]) -> str:
        """The finding as one line for every host in ``hosts`` (none: ``render``, or data that no host reads)."""
        where = f"{host_ranges(hosts)}: " if hosts else ""
        origin = f" ({self.origin})" if self.origin else ""
        return f"{self.severity}: {where}{self.key}: {self.message}{origin} [{self.rule}]"

    @property
    def mistake(self) -> tuple[str, str, str, str, str | None]:
        """What makes two hosts' findings one mistake: the same rule, key, message and origin."""
        return (self.severity, self.rule, self.key, self.message, self.origin)

    @property
    def brief(self) -> str:
        """The finding without severity and host, for a line that already names the host.

        A key under ``preflight`` names a probe of the host, not a variable, so it is left out.
        """
        key = "" if self.key.startswith("preflight") else f"{self.key}: "
        return f"{key}{self.message} [{self.rule}]"


RULES: dict[str, Rule] = {r.id: r for r in (*INPUT_RULES, *STARTUP_RULES, *HOST_RULES, *GPU_RULES)}
# The rules for what vLLM starts with, though not as meant: warnings that validation_levels may raise.
STARTS_RULES: tuple[str, ...] = tuple(r.id for r in RULES.values() if r.starts)


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def host_ranges(hosts: Iterable[str]) -> str:
    """Host names as a reader scans them: numbered runs folded (``mi300x-01..40``), the rest listed, in natural order."""
    runs: list[tuple[str, int, int, int] | str] = []  # (prefix, padded width or 0, first, last) or a name as it is
    keyed = sorted(set(hosts), key=lambda h: ([(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", h)], h))
    for name in keyed:
        match = _NUMBERED.match(name)
        last = runs[-1] if runs else None
        if match:
            prefix, digits = match.group(1), match.group(2)
            padded = len(digits) > 1 and digits.startswith("0")
            fits = len(digits) == last[1] if isinstance(last, tuple) and last[1] else not padded
            if isinstance(last, tuple) and last[0] == prefix and fits and int(digits) == last[3] + 1:
                runs[-1] = (prefix, last[1], last[2], int(digits))
                continue
            runs.append((prefix, len(digits) if padded else 0, int(digits), int(digits)))
        else:
            runs.append(name)
    parts = []
    for run in runs:
        if isinstance(run, str):
            parts.append(run)
            continue
        prefix, width, first, last_number = run
        names = [f"{prefix}{n:0{width}d}" if width else f"{prefix}{n}" for n in (first, last_number)]
        parts.append(names[0] if first == last_number else f"{names[0]}..{names[1][len(prefix) :]}")
    return ", ".join(parts)


def distinct(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per mistake on a host: a second finding of the same rule on the same key (two checks of one bound)
    is dropped, and so is a warning on a key that already has an error (a value that is wrong needs no advice)."""
    found = list(dict.fromkeys(findings))
    wrong = {(f.host, f.key) for f in found if f.severity == "error"}
    seen: set[tuple[str | None, str, str]] = set()
    kept = []
    for f in found:
        if (f.host, f.key, f.rule) in seen or (f.severity == "warning" and (f.host, f.key) in wrong):
            continue
        seen.add((f.host, f.key, f.rule))
        kept.append(f)
    return kept


def grouped(findings: Iterable[Finding]) -> list[str]:
    """The findings as lines, one per mistake: the same rule, key, message and origin on many hosts is one line naming
    them all; errors first, each group in the order its first finding came."""
    hosts: dict[tuple[str, str, str, str, str | None], list[str]] = {}
    first: dict[tuple[str, str, str, str, str | None], Finding] = {}
    for f in distinct(findings):
        first.setdefault(f.mistake, f)
        hosts.setdefault(f.mistake, [])
        if f.host:
            hosts[f.mistake].append(f.host)
    order = sorted(first, key=lambda m: m[0] != "error")
    return [first[m].line(hosts[m]) for m in order]


def refused(findings: Iterable[Finding], consequence: str, warnings: bool = False) -> bool:
    """Print the errors (and the warnings, if asked) to stderr, one line per mistake, with a count and what follows from
    them; True when there is an error.

    The one printer for every command that validates before it acts: deploy, targets,
    status, bench and plain pyinfra's gate.
    """
    shown = distinct(f for f in findings if warnings or f.severity == "error")
    for line in grouped(shown):
        print(line, file=sys.stderr)
    if any(f.severity == "error" for f in shown):
        print(f"{tally(shown, 'error')}: {consequence}", file=sys.stderr, flush=True)
        return True
    return False


def tally(findings: Sequence[Finding], severity: Severity) -> str:
    """``3 error(s) on 40 host(s)``: mistakes (lines) of one severity, and the hosts they touch."""
    chosen = [f for f in findings if f.severity == severity]
    mistakes = len({f.mistake for f in chosen})
    hosts = {f.host for f in chosen if f.host}
    return f"{mistakes} {severity}(s)" + (f" on {len(hosts)} host(s)" if hosts else "")


def finding(rule: str, host: str | None, key: str, message: str) -> Finding:
    return Finding(rule=rule, severity=RULES[rule].severity, host=host, key=key, message=message)
