"""Benchmark reports: ``vllm bench serve`` result files in, a markdown report, PNG plots and a terminal table out.

A results directory holds one JSON file per run, as vLLM writes it with
``--save-result``, under ``<host>/<instance>/`` (``instinct-fleet bench`` lays
them out so; any tree with that shape works). The field names are vLLM's own
(``vllm/benchmarks/serve.py``): ``output_throughput``, ``median_ttft_ms``,
``p99_tpot_ms`` and so on; ``label`` names the profile a run used.

Why a report and not the raw files: a fleet's question is whether every
instance performs as the guide says and as its peers do. The report therefore
compares each run with the seed's published figures (as a ratio), but only a run of
the seed's workload: the same model, GPU model and count, concurrency, dataset, input and
output lengths and prompt count, read from the ``config.json`` that ``bench`` writes
beside it. Otherwise it says which field differs. It flags an instance more than 10% below the median of the instances
that ran the same model, profile and concurrency. Repeats of a run (``-runN``, as ``bench`` and the canary write
them) count as one measurement, by their median, with their spread shown; an outlier is confirmed only by
repeats, since a difference between two single runs may be noise.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from instinct_fleet.live import accuracy, noise

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "p99")
OUTLIER_BELOW = 0.10  # an instance this far under its peers' median output throughput is flagged


@dataclass(frozen=True)
class Reference:
    """What a seed publishes for one profile, and the workload it measured: only a run of that workload compares.

    Why every field: a published figure is a measurement of one model on one GPU model and count, at one
    concurrency, over one dataset of prompts of given lengths. Change any of them and the figure measures
    something else, so a ratio to it would say nothing.
    """

    source: str
    model: str
    gpu_model: str
    gpus: int
    concurrency: int
    dataset: str
    input_len: int
    output_len: int
    num_prompts: int
    figures: dict[str, float]  # vLLM's result field names


REFERENCES: dict[str, Reference] = {
    "seed-001-gpt-oss": Reference(
        source="001:73-103: gpt-oss-120b on one MI300X (001:4) at TP 1 (001:27), random data (001:71) 4096/1024, 80 prompts, concurrency 8",
        model="openai/gpt-oss-120b",
        gpu_model="MI300X",
        gpus=1,
        concurrency=8,
        dataset="random",
        input_len=4096,
        output_len=1024,
        num_prompts=80,
        figures={
            "request_throughput": 0.47,
            "output_throughput": 479.07,
            "total_token_throughput": 2394.07,
            "mean_ttft_ms": 864.75,
            "median_ttft_ms": 833.79,
            "p99_ttft_ms": 2091.68,
            "mean_tpot_ms": 15.87,
            "median_tpot_ms": 15.85,
            "p99_tpot_ms": 16.96,
            "mean_itl_ms": 15.87,
            "median_itl_ms": 15.22,
            "p99_itl_ms": 17.26,
            "mean_e2el_ms": 17097.11,
            "median_e2el_ms": 16968.59,
            "p99_e2el_ms": 17943.96,
        },
    ),
}


def failed_requests(data: dict[str, Any]) -> str | None:
    """Why a result does not measure its configuration: some of its requests failed (None when none did).

    vLLM computes every figure from the requests that succeeded, so a run that lost some
    is not slower, it is wrong: each failed request frees its place in the batch and the
    rest decode faster, with a lower TPOT than the configuration gives when it serves them
    all. Counted from vLLM's ``failed`` (vllm/benchmarks/serve.py), or from the non-empty
    ``errors`` of a vLLM that writes no ``failed``. The first two distinct errors are named by
    their last line: vLLM records an HTTP error's reason, and a raised one's whole traceback.
    """
    errors = [str(e) for e in data.get("errors") or [] if e]
    failed = data.get("failed")
    count = failed if isinstance(failed, int) and not isinstance(failed, bool) else len(errors)
    if count <= 0:
        return None
    completed = data.get("completed")
    total = f" of {count + completed}" if isinstance(completed, int) and not isinstance(completed, bool) else ""
    named = list(dict.fromkeys(e.strip().splitlines()[-1][:200] for e in errors if e.strip()))[:2]
    return f"{count}{total} requests failed" + (f" ({'; '.join(named)})" if named else "")


class ReportError(Exception):
    """The results directory cannot be reported on; the message says why."""


@dataclass(frozen=True)
class Run:
    """One benchmark run of one instance."""

    host: str
    instance: str
    path: Path
    data: dict[str, Any]
    config: dict[str, Any]  # bench's config.json beside the result ({} where there is none)

    @property
    def profile(self) -> str:
        return str(self.data.get("label") or "unlabelled")

    @property
    def concurrency(self) -> int:
        value = self.data.get("max_concurrency")
        return int(value) if isinstance(value, (int, float)) else 0

    @property
    def model(self) -> str:
        return str(self.data.get("model_id", "?"))

    @property
    def failed(self) -> str | None:
        """Why its figures measure no configuration: requests that failed (None when none did)."""
        return failed_requests(self.data)

    def unlike(self, reference: Reference) -> str | None:
        """Why this run cannot be compared with ``reference`` (None when it can): failed requests, or the first
        field of the workload that differs, as ``bench`` recorded it in the run's ``config.json``."""
        if self.failed:
            return self.failed
        if not self.config:
            return "no comparable reference: no config.json beside it says what it ran"
        settings = self.config.get("profile_settings")
        settings = settings if isinstance(settings, dict) else {}
        gpus = self.config.get("gpus")
        ran: list[tuple[str, object, object]] = [
            ("model", self.config.get("model"), reference.model),
            ("GPU model", self.config.get("gpu_model"), reference.gpu_model),
            ("GPU count", len(gpus) if isinstance(gpus, list) else None, reference.gpus),
            ("concurrency", self.concurrency, reference.concurrency),
            ("dataset", settings.get("dataset"), reference.dataset),
            ("input length", settings.get("input_len"), reference.input_len),
            ("output length", settings.get("output_len"), reference.output_len),
            ("prompt count", self.config.get("num_prompts"), reference.num_prompts),
        ]
        for field, measured, published in ran:
            if measured is None:
                return f"no comparable reference: its config.json does not say its {field}"
            if measured != published:
                return f"no comparable reference: {field} {measured}, the seed's {published}"
        return None

    def value(self, key: str) -> float | None:
        value = self.data.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def load(results: Path) -> list[Run]:
    """Every run under ``results``: ``<host>/<instance>/<file>.json`` at any depth below it."""
    if not results.is_dir():
        raise ReportError(f"{results} is not a directory of benchmark results")
    runs = []
    for path in sorted(results.rglob("*.json")):
        if path.name in ("config.json", accuracy.PROBE_FILE):
            continue  # the rendered config bench stores beside the results, and a probe's answers (accuracy.load)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ReportError(f"{path} is not a vLLM result file: {exc}") from None
        if not isinstance(data, dict) or "output_throughput" not in data:
            continue
        parts = path.relative_to(results).parts
        if len(parts) < 3:
            raise ReportError(f"{path}: expected <host>/<instance>/<result>.json under {results}")
        runs.append(Run(parts[-3], parts[-2], path, data, _config(path.parent / "config.json")))
    return runs


def _config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path} is not the config.json bench writes: {exc}") from None
    return data if isinstance(data, dict) else {}


def measurements(runs: list[Run]) -> list[list[Run]]:
    """The runs grouped into measurements: the repeats of one profile and concurrency on one instance, in one
    folder (``bench`` and the canary write a repeat as ``-runN``). Runs that lost requests are left out."""
    groups: dict[tuple[Path, str, int], list[Run]] = defaultdict(list)
    for run in runs:
        if not run.failed:
            groups[(run.path.parent, run.profile, run.concurrency)].append(run)
    return [groups[key] for key in sorted(groups, key=lambda k: (k[1], k[2], str(k[0])))]


def middle(members: list[Run], key: str) -> float | None:
    """A figure's median over a measurement's runs."""
    values = [v for r in members if (v := r.value(key)) is not None]
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Outlier:
    """An instance more than 10% below the median of its peers (the same model, profile and concurrency).

    ``confirmed`` only when it ran more than once and even its best run is that far below: a difference between
    single runs may be noise (:mod:`instinct_fleet.live.noise`), so it is named as unconfirmed.
    """

    run: Run
    value: float  # the instance's median output throughput over its runs
    peers: float  # the median of every instance's median
    runs: int
    confirmed: bool


def outliers(runs: list[Run]) -> list[Outlier]:
    """Instances more than 10% below their peers' median output throughput, each measurement by its median."""
    groups: dict[tuple[str, str, int], list[list[Run]]] = defaultdict(list)
    for members in measurements(runs):
        first = members[0]
        groups[(first.model, first.profile, first.concurrency)].append(members)
    found = []
    for peers in groups.values():
        medians = [(members, v) for members in peers if (v := middle(members, "output_throughput")) is not None]
        if len(medians) < 2:
            continue
        median = statistics.median(v for _, v in medians)
        for members, value in medians:
            if value < (1 - OUTLIER_BELOW) * median:
                best = max(v for r in members if (v := r.value("output_throughput")) is not None)
                confirmed = len(members) > 1 and best < (1 - OUTLIER_BELOW) * median
                found.append(Outlier(members[0], value, median, len(members), confirmed))
    return found


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def run_rows(runs: list[Run]) -> list[list[str]]:
    """One row per measurement: each figure's median over its runs, and the spread of output throughput where it
    ran more than once. A run that lost requests has its own row (its figures count only the rest)."""
    header = ["host", "instance", "profile", "conc", "runs", "failed", "req/s", "out tok/s", "total tok/s"]
    header += [f"{s} {m} ms" for m in METRICS for s in STATS]
    rows = [header]
    groups = measurements(runs) + [[r] for r in runs if r.failed]
    for members in sorted(groups, key=lambda g: (g[0].profile, g[0].concurrency, g[0].host, g[0].instance)):
        run = members[0]
        failed = run.value("failed")
        throughput = [v for r in members if (v := r.value("output_throughput")) is not None]
        row = [run.host, run.instance, run.profile, str(run.concurrency), str(len(members))]
        row += ["-" if failed is None else str(int(failed)), _fmt(middle(members, "request_throughput"))]
        row += [noise.spread(throughput, 2) if throughput else "-", _fmt(middle(members, "total_token_throughput"))]
        row += [_fmt(middle(members, f"{s}_{m}_ms")) for m in METRICS for s in STATS]
        rows.append(row)
    return rows


def fleet_rows(runs: list[Run]) -> list[list[str]]:
    """Per profile and concurrency: instances, summed throughput, median latencies across instances; an instance
    that ran more than once counts by its median (the runs whose requests all succeeded)."""
    rows = [["profile", "conc", "instances", "sum out tok/s", "sum total tok/s", "median TTFT ms", "median TPOT ms", "p99 TTFT ms (worst)"]]
    groups: dict[tuple[str, int], list[list[Run]]] = defaultdict(list)
    for members in measurements(runs):
        groups[(members[0].profile, members[0].concurrency)].append(members)
    for (profile, conc), instances in sorted(groups.items()):

        def values(key: str, instances: list[list[Run]] = instances) -> list[float]:
            return [v for members in instances if (v := middle(members, key)) is not None]

        rows.append(
            [
                profile,
                str(conc),
                str(len(instances)),
                _fmt(sum(values("output_throughput"))),
                _fmt(sum(values("total_token_throughput"))),
                _fmt(statistics.median(values("median_ttft_ms"))) if values("median_ttft_ms") else "-",
                _fmt(statistics.median(values("median_tpot_ms"))) if values("median_tpot_ms") else "-",
                _fmt(max(values("p99_ttft_ms"), default=None)),
            ]
        )
    return rows


def reference_rows(runs: list[Run]) -> list[list[str]]:
    """Each run like a seed's, as a ratio to its published figures (throughput: higher is better; latency: lower)."""
    rows = [["host", "instance", "profile", "figure", "seed", "measured", "ratio"]]
    for run in sorted(runs, key=lambda r: (r.profile, r.host, r.instance)):
        reference = REFERENCES.get(run.profile)
        if reference is None or run.unlike(reference):
            continue
        for key, published in reference.figures.items():
            measured = run.value(key)
            ratio = "-" if measured is None else f"{measured / published:.2f}"
            rows.append([run.host, run.instance, run.profile, key, _fmt(published), _fmt(measured), ratio])
    return rows


def not_compared(runs: list[Run]) -> list[str]:
    """The runs of a seed's profile that are left out of the comparison, each with why."""
    return [
        f"{r.host}/{r.instance} ({r.profile}): {why}"
        for r in sorted(runs, key=lambda r: (r.profile, r.host, r.instance))
        if (reference := REFERENCES.get(r.profile)) is not None and (why := r.unlike(reference))
    ]


def table(rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def seed_marks(runs: list[Run], key: str) -> tuple[tuple[str, int, float], ...]:
    """(label, concurrency, figure) of each seed reference that some run is like, for the plot."""
    marks = []
    for profile, reference in sorted(REFERENCES.items()):
        if key in reference.figures and any(r.profile == profile and not r.unlike(reference) for r in runs):
            marks.append((f"seed {reference.source[:3]}: {reference.model}", reference.concurrency, reference.figures[key]))
    return tuple(marks)


def plots(runs: list[Run], out: Path) -> list[Path]:
    """Throughput and latency percentiles against concurrency, and one bar per instance (PNG, matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a control machine
    from matplotlib import pyplot as plt

    written = []
    series: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        series[f"{run.host}/{run.instance}"].append(run)

    def line_plot(name: str, keys: list[tuple[str, str]], ylabel: str, marks: tuple[tuple[str, int, float], ...] = ()) -> None:
        fig, ax = plt.subplots(figsize=(8, 5))
        for label, concurrency, value in marks:
            ax.scatter([concurrency], [value], marker="*", s=200, color="black", zorder=5, label=label)
        for label, members in sorted(series.items()):
            members = sorted(members, key=lambda r: r.concurrency)
            for key, suffix in keys:
                points = [(r.concurrency, v) for r in members if (v := r.value(key)) is not None]
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{label} {suffix}".strip())
        ax.set_xlabel("concurrency (max_concurrency)")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        path = out / name
        fig.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append(path)

    line_plot("throughput.png", [("output_throughput", "")], "output tokens/s", seed_marks(runs, "output_throughput"))
    line_plot("ttft.png", [("median_ttft_ms", "median"), ("p99_ttft_ms", "p99")], "TTFT (ms)")
    line_plot("tpot.png", [("median_tpot_ms", "median"), ("p99_tpot_ms", "p99")], "TPOT (ms)")

    fig, ax = plt.subplots(figsize=(8, 5))
    names = sorted(series)
    best = [max((r.value("output_throughput") or 0.0) for r in series[n]) for n in names]
    ax.bar(range(len(names)), best)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize="small")
    ax.set_ylabel("output tokens/s (best run)")
    path = out / "instances.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    written.append(path)
    return written


def write(results: Path) -> tuple[Path, str]:
    """Write report.md and the plots into ``results``; return the report's path and the terminal table."""
    runs = load(results)
    try:
        probes = accuracy.load(results)
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    if not runs and not probes:
        raise ReportError(f"no vLLM result files (--save-result JSON) and no accuracy probes ({accuracy.PROBE_FILE}) under {results}")
    if not runs:
        return _probes_only(results, probes)
    images = plots([r for r in runs if not r.failed], results)  # a run that lost requests would flatter its line
    flagged = outliers(runs)
    lines = [
        f"# Benchmark report: {results.name}",
        "",
        f"{len(runs)} runs of {len({(r.host, r.instance) for r in runs})} instances. Field names are vLLM's (`vllm bench serve --save-result`).",
        "",
        "## Fleet",
        "",
        table(fleet_rows(runs), markdown=True),
        "",
        "## Per instance",
        "",
        table(run_rows(runs), markdown=True),
        "",
        "## Against the seeds",
        "",
    ]
    reference = reference_rows(runs)
    if len(reference) > 1:
        sources = sorted({REFERENCES[r.profile].source for r in runs if r.profile in REFERENCES and not r.unlike(REFERENCES[r.profile])})
        lines += [table(reference, markdown=True), "", *[f"- {s}" for s in sources], ""]
    else:
        lines += [
            "No run is like a seed's measurement: the same model, GPU model and count, concurrency, dataset, "
            "input and output lengths and prompt count (`seed-001-gpt-oss` as 001:73 ran it: openai/gpt-oss-120b "
            "on one MI300X, random 4096/1024, 80 prompts, concurrency 8).",
            "",
        ]
    left_out = not_compared(runs)
    if left_out:
        lines += ["Not compared with the seed, so that unlike is never set against unlike:", "", *[f"- {w}" for w in left_out], ""]
    broken = [r for r in sorted(runs, key=lambda r: (r.host, r.instance, r.path.name)) if r.failed]
    lines += ["## Failed requests", ""]
    if broken:
        lines += [
            "Left out of the fleet table, the outliers and the seed comparison: vLLM counts only the requests that "
            "succeeded, so these figures flatter the instance.",
            "",
            *[f"- **{r.host}** {r.instance} ({r.profile}, concurrency {r.concurrency}, {r.path.name}): {r.failed}" for r in broken],
            "",
        ]
    else:
        lines += ["None: every request of every run succeeded.", ""]
    lines += ["## Outliers", ""]
    if flagged:
        lines += [
            f"- **{o.run.host}** {o.run.instance} ({o.run.profile}, concurrency {o.run.concurrency}): {o.value:.1f} output tok/s, "
            f"{(1 - o.value / o.peers) * 100:.0f}% below the median {o.peers:.1f} of its peers"
            + (
                f", in each of its {o.runs} runs"
                if o.confirmed
                else (
                    "; unconfirmed: one run may be noise, so measure it again with repeats"
                    if o.runs == 1
                    else f"; unconfirmed: its best of {o.runs} runs is within 10% of its peers"
                )
            )
            for o in flagged
        ]
    else:
        lines.append(f"None: no instance is more than {OUTLIER_BELOW:.0%} below the median of its peers.")
    if probes:
        lines += ["", "## Accuracy probe", "", table(accuracy.rows(probes), markdown=True)]
    lines += ["", "## Plots", "", *[f"![{p.stem}]({p.name})" for p in images], ""]
    report = results / "report.md"
    report.write_text("\n".join(lines))
    terminal = table(fleet_rows(runs), markdown=False)
    if broken:
        terminal += "\n\nFailed requests (left out above): " + ", ".join(f"{r.host}/{r.instance} ({r.failed})" for r in broken)
    if flagged:
        terminal += "\n\nOutliers: " + ", ".join(
            f"{o.run.host}/{o.run.instance} ({o.value:.1f} vs median {o.peers:.1f}{'' if o.confirmed else ', unconfirmed'})"
            for o in flagged
        )
    if probes:
        terminal += "\n\n" + table(accuracy.rows(probes), markdown=False)
    return report, terminal


def _probes_only(results: Path, probes: list[tuple[str, str, dict[str, Any]]]) -> tuple[Path, str]:
    """The report of a directory that holds accuracy probes only (``bench --accuracy``)."""
    report = results / "report.md"
    lines = [f"# Accuracy probe: {results.name}", "", ACCURACY_NOTE, "", table(accuracy.rows(probes), markdown=True), ""]
    report.write_text("\n".join(lines))
    return report, table(accuracy.rows(probes), markdown=False)


ACCURACY_NOTE = (
    "Each item's reply is right when its last number equals the item's answer (or its pattern is found in it); "
    "greedy decoding, so the same configuration answers the same way (instinct_fleet/model/probe.py)."
)
