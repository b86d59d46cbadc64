"""A benchmark's own section of benchmarks/RESULTS.md, between its two markers: replaced in place, or added at the end."""

from __future__ import annotations

from pathlib import Path


def replace(results: Path, begin: str, end: str, body: str, heading: str) -> None:
    """Put ``body`` (which starts with ``begin`` and ends with ``end``) where the markers are, or under ``heading`` at the end."""
    text = results.read_text()
    if begin in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + body + tail
    else:
        text = text.rstrip() + f"\n\n## {heading}\n\n" + body + "\n"
    results.write_text(text)
