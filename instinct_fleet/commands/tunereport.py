"""What a sweep leaves for a person: tune.md (the table with each figure's spread, the Pareto fronts, the best point and
whether it beats the deployed configuration beyond the noise), pareto.png and best.py (only when it does)."""

from __future__ import annotations

import pprint
from pathlib import Path

from instinct_fleet.commands.sweeps import Checked, Point, Sweep, with_point
from instinct_fleet.commands.trials import Results, Trial, baseline_for, best, gain, judge, pareto, samples
from instinct_fleet.live import noise
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


def champion(trials: list[Trial], sweep: Sweep, floor: float, alpha: float) -> tuple[Trial | None, str]:
    """The point best.py names, and what tune.md says of it: the best point within the SLOs
    (:func:`instinct_fleet.commands.trials.best`), only when it beats the deployed configuration on its host beyond the
    noise. Where the deployed configuration meets the SLOs too, its throughput must be higher by more than ``floor``
    tok/s and beyond the noise of the runs at ``alpha`` split over the measured points it is the best of; where it
    misses them, the point must meet them in every one of its runs, not by its median alone."""
    winner = best(trials)
    if winner is None:
        return None, "No measured point meets every SLO."
    if winner.baseline:
        return None, f"No point beats the deployed configuration: it has the highest output throughput ({winner.host})."
    base = baseline_for(trials, winner.host)
    if base is None:
        return (
            None,
            f"{winner.label()} has the highest output throughput, but the deployed configuration was not measured to compare it with.",
        )
    parts = [
        f"{m.label} {noise.change(base.figures[m.key], winner.figures[m.key]):+.1f}% "
        f"({base.figures[m.key]:.1f} -> {winner.figures[m.key]:.1f} {m.unit})"
        for m in noise.METRICS
        if m.key in base.figures and m.key in winner.figures
    ]
    against = f"against the deployed configuration measured in this sweep on {base.host}: {', '.join(parts)}"
    head = f"**{winner.label()}** on {winner.host}: {winner.figures['output_throughput']:.1f} output tok/s (median), {against}"
    runs = samples(winner)
    if not base.meets_slo:
        if all(judge(run, sweep.slos) for run in runs):
            return (
                winner,
                f"{head}. It meets every SLO in each of its {len(runs)} run(s); the deployed configuration misses them. `best.py` holds it as group_data.",
            )
        return (
            None,
            f"No point beats the deployed configuration beyond the noise. The best, {head}, meets the SLOs by its median, not in each of its runs.",
        )
    judged = gain(winner, base, floor, alpha, sum(1 for t in trials if t.status == "measured" and not t.baseline))
    evidence = judged.evidence() if judged is not None else "no throughput to compare"
    if judged is None or judged.status != "beyond":
        return None, f"No point beats the deployed configuration beyond the noise. The best, {head}; {evidence}."
    return winner, f"{head}; {evidence}. `best.py` holds it as group_data."


def markdown(trials: list[Trial], sweep: Sweep, skipped: tuple[tuple[Point, Finding], ...], speed: str, floor: float, alpha: float) -> str:
    """tune.md: the table by median throughput with each figure's spread over the runs, the Pareto fronts (of the
    medians), and the best point within the SLOs when it beats the deployed configuration beyond the noise."""
    measured = sorted((t for t in trials if t.status == "measured"), key=lambda t: -t.figures.get("output_throughput", 0))
    front = {id(t) for t in pareto(trials)}
    front_ttft = {id(t) for t in pareto(trials, "median_ttft_ms")}
    lines = [f"# Tuning {paths.vllm_unit(sweep.instance)}: profile {sweep.profile}", ""]
    lines.append(f"SLOs: {', '.join(map(str, sweep.slos)) or 'none'}. {speed}")
    lines.append("Each figure is the median over the point's runs, with their range and count where it ran more than once.")

    def cell(t: Trial, key: str) -> str:
        return noise.spread([run[key] for run in samples(t) if key in run]) if any(key in run for run in samples(t)) else "-"

    lines += ["", "| settings | host | output tok/s | median TPOT ms | median TTFT ms | p99 TTFT ms | SLO | Pareto (TPOT / TTFT) |"]
    lines.append("|---|---|---:|---:|---:|---:|---|---|")
    for t in measured:
        marks = " / ".join("yes" if id(t) in s else "-" for s in (front, front_ttft))
        figures = " | ".join(cell(t, key) for key in ("output_throughput", "median_tpot_ms", "median_ttft_ms", "p99_ttft_ms"))
        lines.append(f"| {t.label()} | {t.host} | {figures} | {'met' if t.meets_slo else 'missed'} | {marks} |")
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
    lines += ["", "## Best point within the SLOs", "", champion(trials, sweep, floor, alpha)[1]]
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
    (results.dir / "tune.md").write_text(markdown(results.trials, sweep, checked.skipped, speed, checked.floor, checked.alpha))
    plot(results.trials, results.dir / "pareto.png")
    winner, _ = champion(results.trials, sweep, checked.floor, checked.alpha)
    best_file = results.dir / "best.py"
    if winner is not None:
        best_file.write_text(best_fragment(hosts, winner.host, sweep, winner))
    elif best_file.exists():
        best_file.unlink()
