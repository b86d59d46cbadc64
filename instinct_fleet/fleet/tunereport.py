"""What a sweep leaves for a person: tune.md (the table, the Pareto fronts, the best point and its gain), pareto.png and best.py."""

from __future__ import annotations

import pprint
from pathlib import Path

from instinct_fleet.fleet import canary
from instinct_fleet.fleet.sweeps import Checked, Point, Sweep, with_point
from instinct_fleet.fleet.trials import Results, Trial, baseline_for, best, pareto
from instinct_fleet.model import paths
from instinct_fleet.model.inventory import HostData
from instinct_fleet.model.rules import Finding


def best_fragment(hosts: list[HostData], host: str, sweep: Sweep, winner: Trial) -> str:
    """group_data text: the host's ``vllm_instances`` with the winner's flags and env in the instance's entry."""
    data = next(h.data for h in hosts if h.name == host)
    entries = with_point(data, sweep.instance, winner.point)["vllm_instances"]
    head = (
        f'"""instinct-fleet tune: the best point for instance {sweep.instance!r}, {winner.label()},\n'
        f"measured on {winner.host} with profile {sweep.profile!r}. Copy into group_data/<your group>.py, then deploy\n"
        'with canary_profile set, so that the canary proves the gain on production before the rest rolls."""\n\n'
    )
    return head + "vllm_instances = " + pprint.pformat(entries, sort_dicts=False, width=100) + "\n"


def markdown(trials: list[Trial], sweep: Sweep, skipped: tuple[tuple[Point, Finding], ...], speed: str) -> str:
    """tune.md: the table by throughput, the Pareto fronts, the best point within the SLOs and its gain."""
    measured = sorted((t for t in trials if t.status == "measured"), key=lambda t: -t.figures.get("output_throughput", 0))
    front = {id(t) for t in pareto(trials)}
    front_ttft = {id(t) for t in pareto(trials, "median_ttft_ms")}
    lines = [f"# Tuning {paths.vllm_unit(sweep.instance)}: profile {sweep.profile}", ""]
    lines.append(f"SLOs: {', '.join(map(str, sweep.slos)) or 'none'}. {speed}")
    lines += ["", "| settings | host | output tok/s | median TPOT ms | median TTFT ms | p99 TTFT ms | SLO | Pareto (TPOT / TTFT) |"]
    lines.append("|---|---|---:|---:|---:|---:|---|---|")
    for t in measured:
        f = t.figures
        marks = " / ".join("yes" if id(t) in s else "-" for s in (front, front_ttft))
        lines.append(
            f"| {t.label()} | {t.host} | {f.get('output_throughput', 0):.1f} | {f.get('median_tpot_ms', 0):.2f} | "
            f"{f.get('median_ttft_ms', 0):.1f} | {f.get('p99_ttft_ms', 0):.1f} | {'met' if t.meets_slo else 'missed'} | {marks} |"
        )
    lines += ["", "## Pareto front: output throughput against median TPOT", ""]
    lines += [
        f"- {t.label()} on {t.host}: {t.figures['output_throughput']:.1f} tok/s, {t.figures['median_tpot_ms']:.2f} ms"
        for t in pareto(trials)
    ]
    lines += ["", "## Pareto front: output throughput against median TTFT", ""]
    lines += [
        f"- {t.label()} on {t.host}: {t.figures['output_throughput']:.1f} tok/s, {t.figures['median_ttft_ms']:.1f} ms"
        for t in pareto(trials, "median_ttft_ms")
    ]
    winner = best(trials)
    lines += ["", "## Best point within the SLOs", ""]
    if winner is None:
        lines.append("No measured point meets every SLO.")
    else:
        lines.append(f"**{winner.label()}** on {winner.host}: {winner.figures['output_throughput']:.1f} output tok/s.")
        base = baseline_for(trials, winner.host)
        if base is not None and not winner.baseline:
            parts = [
                f"{label} {canary.change(base.figures[key], winner.figures[key]):+.1f}% ({base.figures[key]:.1f} -> {winner.figures[key]:.1f} {unit})"
                for key, label, unit, _ in canary.METRICS
                if key in base.figures and key in winner.figures
            ]
            lines.append(f"Against the deployed configuration measured in this sweep on {base.host}: {', '.join(parts)}.")
        lines.append("`best.py` holds it as group_data.")
    failed = [t for t in trials if t.status == "failed"]
    if failed:
        lines += ["", "## Failed trials", ""]
        for t in failed:
            lines.append(f"- {t.label()} on {t.host}: {t.why}")
    if skipped:
        lines += ["", "## Skipped as invalid (never run)", ""]
        lines += [f"- {p.label()}: [{f.rule}] {f.key}: {f.message}" for p, f in skipped]
    return "\n".join(lines) + "\n"


def plot(trials: list[Trial], path: Path) -> None:
    """pareto.png: every measured trial, output throughput against median TPOT, the front joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [t for t in trials if t.status == "measured" and "median_tpot_ms" in t.figures]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([t.figures["median_tpot_ms"] for t in measured], [t.figures["output_throughput"] for t in measured], color="grey")
    for t in measured:
        ax.annotate(t.label(), (t.figures["median_tpot_ms"], t.figures["output_throughput"]), fontsize=7)
    front = sorted(pareto(trials), key=lambda t: t.figures["median_tpot_ms"])
    ax.plot([t.figures["median_tpot_ms"] for t in front], [t.figures["output_throughput"] for t in front], color="tab:red", marker="o")
    ax.set_xlabel("median TPOT (ms)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("Sweep: Pareto front in red")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: Results, hosts: list[HostData], sweep: Sweep, checked: Checked, speed: str) -> None:
    """tune.md, pareto.png, best.py and the skipped points in trials.json, from the trials so far."""
    for point, found in checked.skipped:
        if not any(t.key == point.key for t in results.trials):
            results.trials.append(Trial(dict(point.settings), "", "skipped", why=f"[{found.rule}] {found.key}: {found.message}"))
    results.save()
    (results.dir / "tune.md").write_text(markdown(results.trials, sweep, checked.skipped, speed))
    plot(results.trials, results.dir / "pareto.png")
    winner = best(results.trials)
    best_file = results.dir / "best.py"
    if winner is not None:
        best_file.write_text(best_fragment(hosts, winner.host, sweep, winner))
    elif best_file.exists():
        best_file.unlink()
