"""The fleet board's main panels, drawn from Prometheus's HTTP API with matplotlib: what a team without Grafana sees.

The panels are the fleet board's own (commands/boards.py), chosen by title, so the picture and the board never differ
in what they query: each target is asked of ``/api/v1/query_range`` over the window, its Grafana variables given the
values that select everything (Grafana's ``$__rate_interval`` is at least four scrape steps; here four steps of the
picture, and at least a minute). The PNG carries what it plots (its ``Description`` text chunk, JSON), so that a
reader, and the tests, can hold the picture to the query results.
"""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MAIN = ("Request rate", "Success rate", "Time to first token", "Time per output token", "KV cache use", "Instances up")
WIDTH_PX, HEIGHT_PX = 1500, 1200


class PictureError(Exception):
    """Prometheus cannot be asked, or refused a query: the message says which and why."""


@dataclass(frozen=True)
class Line:
    legend: str
    points: list[tuple[float, float]]  # (unix time, value)


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    lines: list[Line]


def _legend(form: str, labels: dict[str, str]) -> str:
    for key, value in labels.items():
        form = form.replace("{{" + key + "}}", value)
    return form


def _promql(expr: str, step: float) -> str:
    rate = f"{max(60, int(4 * step))}s"
    return expr.replace("$__rate_interval", rate).replace("$model", ".*").replace("$host", ".*").replace("$instance", ".*")


def fetch(board: dict[str, Any], url: str, start: float, end: float, step: float) -> list[Panel]:
    """The board's main panels over [start, end], one point every ``step`` seconds, as Prometheus answers them."""
    by_title = {p["title"]: p for p in board["panels"]}
    panels = []
    for title in MAIN:
        panel = by_title[title]
        lines = []
        for target in panel["targets"]:
            query = urllib.parse.urlencode({"query": _promql(target["expr"], step), "start": start, "end": end, "step": step})
            try:
                with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query_range?{query}", timeout=30) as reply:
                    answer = json.load(reply)
            except urllib.error.HTTPError as exc:
                raise PictureError(
                    f"Prometheus at {url} refused the query of {title!r}: {exc.read().decode(errors='replace')[:300]}"
                ) from exc
            except (OSError, ValueError) as exc:
                raise PictureError(f"Prometheus at {url} cannot be asked ({exc}): give its address with --prometheus") from exc
            for result in answer["data"]["result"]:
                points = [(float(t), float(v)) for t, v in result["values"]]
                lines.append(Line(_legend(target["legendFormat"], result["metric"]), points))
        panels.append(Panel(title, panel["fieldConfig"]["defaults"]["unit"], sorted(lines, key=lambda line: line.legend)))
    return panels


def draw(panels: list[Panel], path: Path, title: str, end: float) -> None:
    """The panels on one PNG, two to a row, each with its unit and a legend, against minutes before ``end``; the data
    in its Description chunk."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a control machine
    import matplotlib.pyplot as plt

    rows = (len(panels) + 1) // 2
    figure, axes = plt.subplots(rows, 2, figsize=(WIDTH_PX / 100, HEIGHT_PX / 100), dpi=100, squeeze=False)
    stamp = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%d %H:%M UTC")
    for ax, panel in zip(axes.flat, panels, strict=False):
        for line in panel.lines:
            ax.plot([(t - end) / 60 for t, _ in line.points], [v for _, v in line.points], label=line.legend)
        ax.set_title(panel.title)
        ax.set_ylabel(panel.unit)
        ax.set_xlabel(f"minutes before {stamp}")
        if panel.lines:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, metadata={"Description": json.dumps([asdict(p) for p in panels])})
    plt.close(figure)


def read_back(path: Path) -> list[Panel]:
    """What a picture :func:`draw` wrote plots, from its PNG's Description text chunk."""
    data = path.read_bytes()
    at = 8  # the PNG signature
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        at += 12 + length
        key, _, text = body.partition(b"\0")
        if kind == b"tEXt" and key == b"Description":
            return _panels(json.loads(text.decode("latin-1")))
        if kind == b"zTXt" and key == b"Description":
            return _panels(json.loads(zlib.decompress(text[1:]).decode("latin-1")))
        if kind == b"iTXt" and key == b"Description":
            rest = text[2:].split(b"\0", 2)[2]
            return _panels(json.loads((zlib.decompress(rest) if text[0] else rest).decode()))
    raise PictureError(f"{path} holds no instinct-fleet panels")


def _panels(raw: list[dict[str, Any]]) -> list[Panel]:
    return [
        Panel(p["title"], p["unit"], [Line(line["legend"], [(float(t), float(v)) for t, v in line["points"]]) for line in p["lines"]])
        for p in raw
    ]
