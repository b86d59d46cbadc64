"""The accuracy probe asked of a live instance, and the paired verdict on its answers before and after a change.

How it asks (bench.probe_command): from the instance's own image on its host (as ``bench`` runs ``vllm bench serve``), a stdlib client
sends every item of the probe (instinct_fleet/model/probe.py) to ``/v1/chat/completions`` at once, CONCURRENCY at a
time, greedy: temperature 0, seed 0, ``max_tokens`` bounded (``canary_probe_max_tokens``), with the first tokens'
logprobs so that the replies can be compared token by token. The prompts travel in the command (compressed), so
nothing is installed or left on the host.

How it judges: the same items before and after, so the verdict is paired. vLLM's own CI compares a GSM8K accuracy
with an expected value within 8% relative (tests/evals/gsm8k in its repository); a paired test needs no expected
value per model and sees smaller losses. A loss counts when both hold:

- the accuracy fell by more than ``canary_probe_floor`` points;
- an exact one-sided McNemar test on the discordant items (right before and wrong after, against the reverse) is
  below ``canary_probe_alpha`` split over the canary's instances (Bonferroni): under no change each discordant
  item is as likely to go either way, and the canary as a whole raises a false alarm at most that often.

Beyond the floor but not significant is *inconclusive* (``canary_inconclusive`` decides, as for speed). The
greedy agreement (items whose first AGREEMENT_TOKENS tokens equal the baseline's) is reported beside it: a
harmless change of kernels moves a few greedy paths, a corrupting one moves most.

What it costs on an MI300X is its decode: the items in waves of CONCURRENCY, each reply at most
``canary_probe_max_tokens`` tokens long. gpt-oss-120b ran at a median TPOT of 15.85 ms at concurrency 8 (001:94);
TPOT grows with the batch, so a wave of 512-token replies takes 8 s or more, and the default probe (7 waves)
about a minute a side at most (benchmarks/correctness.py computes it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from instinct_fleet.live import remote
from instinct_fleet.model.probe import Item

CONCURRENCY = 32  # probe requests in flight at once
AGREEMENT_TOKENS = 32  # the greedy agreement compares this many first tokens of each reply
REQUEST_SECONDS = 300  # the most one probe request may take
MARK = "@@instinct-fleet-probe-answers"
Outcome = Literal["passed", "regressed", "inconclusive"]

# The client, run by the image's python3: argv url, served model, max_tokens, concurrency; stdin the prompts
# (base64 of zlib of a JSON list); OPENAI_API_KEY the bearer token when the instance needs one.
CLIENT = f"""
import base64, json, os, sys, urllib.error, urllib.request, zlib
from concurrent.futures import ThreadPoolExecutor
url, model, max_tokens, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
prompts = json.loads(zlib.decompress(base64.b64decode(sys.stdin.read())))
key = os.environ.get("OPENAI_API_KEY")
headers = {{"Content-Type": "application/json", **({{"Authorization": "Bearer " + key}} if key else {{}})}}
def ask(prompt):
    body = {{"model": model, "messages": [{{"role": "user", "content": prompt}}], "temperature": 0, "seed": 0,
            "max_tokens": max_tokens, "logprobs": True}}
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout={REQUEST_SECONDS}) as response:
            choice = json.load(response)["choices"][0]
    except urllib.error.HTTPError as exc:
        return {{"error": "HTTP %d: %s" % (exc.code, exc.read()[:200].decode(errors="replace"))}}
    except (OSError, ValueError, KeyError, IndexError) as exc:
        return {{"error": "%s: %s" % (type(exc).__name__, exc)}}
    tokens = [t.get("token", "") for t in ((choice.get("logprobs") or {{}}).get("content") or [])[:{AGREEMENT_TOKENS}]]
    return {{"text": (choice.get("message") or {{}}).get("content") or "", "tokens": tokens}}
with ThreadPoolExecutor(concurrency) as pool:
    answers = list(pool.map(ask, prompts))
print("{MARK}")
print(json.dumps(answers))
"""


@dataclass(frozen=True)
class Answer:
    """One reply: its text and first tokens, or why there was none."""

    text: str = ""
    tokens: tuple[str, ...] = ()
    error: str | None = None


def time_limit(items: int) -> int:
    """The most one instance's probe may take: its waves of CONCURRENCY requests, each at most REQUEST_SECONDS."""
    return math.ceil(items / CONCURRENCY) * REQUEST_SECONDS + 120  # and the container's start


def answers_of(stdout: str) -> list[Answer] | None:
    """The client's answers, one per item asked; None when its output holds none (it failed before answering)."""
    raw = remote.json_after(stdout, MARK)
    if not isinstance(raw, list) or not all(isinstance(a, dict) for a in raw):
        return None
    return [Answer(str(a.get("text", "")), tuple(str(t) for t in a.get("tokens") or ()), a.get("error")) for a in raw]


def failed(answers: Sequence[Answer]) -> str | None:
    """Why the answers score nothing (requests that got no reply), or None."""
    errors = [a.error for a in answers if a.error is not None]
    if not errors:
        return None
    return f"{len(errors)} of {len(answers)} probe requests failed (the first: {errors[0]})"


def mcnemar_greater(lost: int, gained: int) -> float:
    """Exact one-sided McNemar p: the chance of ``lost`` or more of the ``lost + gained`` discordant items going
    wrong when each goes either way with probability 1/2 (1.0 with no discordant item)."""
    n = lost + gained
    if n == 0:
        return 1.0
    return float(sum(math.comb(n, k) for k in range(lost, n + 1)) / 2**n)


@dataclass(frozen=True)
class Verdict:
    """The probe's verdict on one instance: the items right on each side, the discordant pairs, and the test."""

    instance: str
    items: int
    right_before: int
    right_after: int
    lost: int  # right before, wrong after
    gained: int  # wrong before, right after
    agreed: int  # items whose first AGREEMENT_TOKENS tokens equal the baseline's
    floor: float
    alpha: float

    @property
    def before(self) -> float:
        return self.right_before / self.items * 100

    @property
    def after(self) -> float:
        return self.right_after / self.items * 100

    @property
    def p(self) -> float:
        return mcnemar_greater(self.lost, self.gained)

    @property
    def outcome(self) -> Outcome:
        if self.before - self.after <= self.floor:
            return "passed"
        return "regressed" if self.p < self.alpha else "inconclusive"

    def evidence(self) -> str:
        return (
            f"probe accuracy {self.before:.1f}% -> {self.after:.1f}% ({self.after - self.before:+.1f} points): "
            f"{self.lost} items right before and wrong after, {self.gained} the reverse, McNemar p={self.p:.3g} "
            f"(alpha {self.alpha:g}, floor {self.floor:g} points); greedy agreement {self.agreed} of {self.items} items "
            f"on the first {AGREEMENT_TOKENS} tokens"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "outcome": self.outcome,
            "items": self.items,
            "accuracy": [round(self.before, 2), round(self.after, 2)],
            "lost": self.lost,
            "gained": self.gained,
            "p": self.p,
            "agreement": self.agreed / self.items if self.items else 0.0,
            "evidence": self.evidence(),
        }


def scored(items: Sequence[Item], answers: Sequence[Answer]) -> list[bool]:
    return [item.right(answer.text) for item, answer in zip(items, answers, strict=True)]


def compare(instance: str, items: Sequence[Item], before: Sequence[Answer], after: Sequence[Answer], floor: float, alpha: float) -> Verdict:
    """The paired verdict on the same items asked before and after the change."""
    was, now = scored(items, before), scored(items, after)
    return Verdict(
        instance=instance,
        items=len(items),
        right_before=sum(was),
        right_after=sum(now),
        lost=sum(1 for w, n in zip(was, now, strict=True) if w and not n),
        gained=sum(1 for w, n in zip(was, now, strict=True) if n and not w),
        agreed=sum(1 for b, a in zip(before, after, strict=True) if b.tokens and b.tokens == a.tokens),  # no tokens: no evidence
        floor=floor,
        alpha=alpha,
    )


PROBE_FILE = "probe.json"  # one instance's probe answers, under <results>/<host>/<instance>/ as bench stores its runs


def record(items: Sequence[Item], answers: Sequence[Answer], source: str, max_tokens: int) -> dict[str, Any]:
    """What a probe of one instance stores: the items asked, each answer and whether it was right."""
    right = scored(items, answers)
    return {
        "probe": {"source": source, "items": len(items), "right": sum(right), "max_tokens": max_tokens},
        "answers": [
            {"prompt": i.prompt, "answer": i.answer, "pattern": i.pattern, "text": a.text, "error": a.error, "right": r}
            for i, a, r in zip(items, answers, right, strict=True)
        ],
    }


def save(folder: Path, data: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PROBE_FILE
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load(results: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """Every stored probe under ``results``, as (host, instance, record); ValueError names a file that is not one."""
    found = []
    for path in sorted(results.rglob(PROBE_FILE)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path} is not a probe file: {exc}") from None
        head = data.get("probe") if isinstance(data, dict) else None
        parts = path.relative_to(results).parts
        if not isinstance(head, dict) or not isinstance(head.get("items"), int) or not isinstance(head.get("right"), int) or len(parts) < 3:
            raise ValueError(
                f"{path} is not a probe file: expected <host>/<instance>/{PROBE_FILE} with its probe's items and right answers"
            )
        found.append((parts[-3], parts[-2], data))
    return found


def rows(found: list[tuple[str, str, dict[str, Any]]]) -> list[list[str]]:
    """The report's accuracy table: one row per stored probe."""
    table = [["host", "instance", "items", "right", "accuracy", "failed requests", "probe"]]
    for host, instance, data in found:
        head = data["probe"]
        failed = sum(1 for a in data.get("answers", []) if isinstance(a, dict) and a.get("error"))
        share = head["right"] / head["items"] * 100 if head["items"] else 0.0
        table.append([host, instance, str(head["items"]), str(head["right"]), f"{share:.1f}%", str(failed), str(head.get("source", ""))])
    return table
