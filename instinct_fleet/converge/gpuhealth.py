"""GPU health: the verdict on each GPU and host from the preflight fact's evidence, and what it quarantines.

Pure, like the rest of the preflight policy: :func:`judge` reads one host's
:class:`~instinct_fleet.converge.evidence.Evidence` against its thresholds (the
``gpu_health_*`` variables, whose defaults are AMD's node-scraper's) and a
:class:`Majority` made once for the run from every host read (:func:`majority`), or the
host's pinned ``gpu_health_expected``. Each finding has its ``gpu-*``
rule (instinct_fleet/model/rules.py), at the severity ``gpu_health_levels`` gives it
on that host.

An error quarantines (:func:`quarantine`): the instances on the GPU it names, or all
of the host's for a host-wide rule. The quarantine is planned like any state: the run
drains those instances out of their routers, stops them, keeps their files as they
are, and writes the record (``paths.QUARANTINE``) that the watch and ``status`` read.
The evidence is read again on every run: once it has cleared, the record goes and the
roll starts the instances behind their health gate.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from instinct_fleet.converge.evidence import PER_GPU_RULES, Evidence, GpuEvidence, Thresholds, trips
from instinct_fleet.converge.preflight import HostReport
from instinct_fleet.model import paths
from instinct_fleet.model.defaults import FleetVars
from instinct_fleet.model.rules import RULES, Finding
from instinct_fleet.model.spec import HostSpec

# What the fleet must agree on (gpu-fleet-drift), per GPU (firmware, driver, XGMI bit rate) or per host (partitions).
AGREED = ("firmware", "driver", "xgmi_rate", "compute_partition", "memory_partition")
PER_GPU = ("firmware", "driver", "xgmi_rate")


@dataclass(frozen=True)
class Judged:
    """One finding of the verdict; ``gpu``: the GPU it names, None for the host as a whole."""

    gpu: int | None
    finding: Finding


@dataclass(frozen=True)
class Majority:
    """The most common value of each agreed field over the hosts read in this run; ``split``: fields where the most
    common values tie (no majority)."""

    values: Mapping[str, str]
    split: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Quarantine:
    """The units this run holds out, each with its reasons, and the record it writes for the watch and ``status``."""

    units: Mapping[str, tuple[str, ...]]
    record: bytes

    def reason(self, unit: str) -> str:
        return "; ".join(self.units[unit])


def values(report: HostReport) -> dict[str, list[str]]:
    """The agreed fields as this host reports them: one value per GPU for firmware, driver and XGMI bit rate, one per
    host otherwise."""
    gpus = report.evidence.gpus
    found: dict[str, list[str]] = {key: [value for g in gpus if (value := getattr(g, key))] for key in PER_GPU}
    if report.compute_partition:
        found["compute_partition"] = [report.compute_partition]
    if report.memory_partition:
        found["memory_partition"] = [report.memory_partition]
    return found


def majority(reports: Iterable[HostReport]) -> Majority:
    """The most common value of each agreed field over every GPU (or host) read; a tie for the most common leaves the
    field without one (a ``gpu-fleet-split`` warning, unless the host pins it in ``gpu_health_expected``)."""
    counts: dict[str, Counter[str]] = {k: Counter() for k in AGREED}
    for report in reports:
        for key, seen in values(report).items():
            counts[key].update(seen)
    chosen: dict[str, str] = {}
    split: dict[str, tuple[str, ...]] = {}
    for key, counter in counts.items():
        ranked = counter.most_common()
        top = [value for value, n in ranked if n == ranked[0][1]]
        if len(top) == 1:
            chosen[key] = top[0]
        elif top:
            split[key] = tuple(sorted(top))
    return Majority(chosen, split)


def thresholds(v: FleetVars) -> Thresholds:
    """The thresholds of the per-GPU rules (evidence.trips) as these hosts set them."""
    return Thresholds(
        pcie_width=v.gpu_health_pcie_width,
        pcie_speed=float(v.gpu_health_pcie_speed),
        recovery_error=v.gpu_health_recovery_error,
        recovery_warning=v.gpu_health_recovery_warning,
        bad_page_warning=float(v.gpu_health_bad_page_warning),
    )


def level(rule: str, levels: Mapping[str, str]) -> str:
    """A ``gpu-*`` rule's severity on a host: its ``gpu_health_levels`` entry, else the rule's own."""
    return levels.get(rule, RULES[rule].severity)


def gpu_levels(v: FleetVars) -> dict[str, str]:
    """Every per-GPU rule's severity on these hosts: what the watch judges a GPU by between deploys."""
    return {rule: level(rule, v.gpu_health_levels) for rule in PER_GPU_RULES}


def _finding(rule: str, host: str, gpu: int | None, message: str, levels: Mapping[str, str]) -> Judged | None:
    found = level(rule, levels)
    if found == "off":
        return None
    key = "preflight.gpus" if gpu is None else f"preflight.gpu{gpu}"
    where = "" if gpu is None else f"GPU {gpu}: "
    return Judged(gpu, Finding(rule=rule, severity="error" if found == "error" else "warning", host=host, key=key, message=where + message))


def judge(report: HostReport, spec: HostSpec, most: Majority) -> list[Judged]:
    """Every ``gpu-*`` finding of this host, at its severity here (``gpu_health_levels``); none when gpu_health is off."""
    v, host = spec.vars, str(spec.host)
    if not v.gpu_health:
        return []
    evidence: Evidence = report.evidence
    levels = v.gpu_health_levels
    judged: list[Judged | None] = [_finding("gpu-evidence", host, None, why, levels) for why in evidence.unread]
    for g in evidence.gpus:
        judged += [_finding(rule, host, g.index, message, levels) for rule, message in trips(g, thresholds(v))]
    for what, pick in (("model", "market"), ("compute units", "cus"), ("gfx version", "arch")):
        seen = {_field(report, g, pick) for g in evidence.gpus} - {None}
        if len(seen) > 1:
            judged.append(
                _finding("gpu-node-mismatch", host, None, f"the GPUs disagree on {what}: {', '.join(sorted(map(str, seen)))}", levels)
            )
    judged += _drift(report, v.gpu_health_expected.model_dump(), most, host, levels)
    return [j for j in judged if j is not None]


def _field(report: HostReport, g: GpuEvidence, pick: str) -> str | int | None:
    if pick == "market":
        gpu = next((x for x in report.gpus if x.index == g.index), None)
        return gpu.market_name if gpu is not None and gpu.market_name != "N/A" else None
    return g.compute_units if pick == "cus" else g.arch


def _drift(
    report: HostReport, pinned: Mapping[str, str | None], most: Majority, host: str, levels: Mapping[str, str]
) -> list[Judged | None]:
    """Each agreed field against the host's ``gpu_health_expected``, or where it pins none, the run's majority."""
    found: list[Judged | None] = []
    for key in AGREED:
        want = pinned.get(key)
        whose = "gpu_health_expected"
        if want is None and key in most.split:
            tied = " and ".join(most.split[key])
            found.append(
                _finding(
                    "gpu-fleet-split", host, None, f"{key}: the hosts split evenly between {tied}; pin one in gpu_health_expected", levels
                )
            )
            continue
        if want is None:
            want, whose = most.values.get(key), "the fleet's majority"
        if want is None:
            continue
        if key in PER_GPU:
            for g in report.evidence.gpus:
                have = getattr(g, key)
                if have is not None and have != want:
                    said = key.replace("xgmi_rate", "XGMI bit rate")
                    found.append(_finding("gpu-fleet-drift", host, g.index, f"{said} {have}, where {whose} is {want}", levels))
        else:
            have = getattr(report, key)
            if have is not None and have != want:
                found.append(_finding("gpu-fleet-drift", host, None, f"{key.replace('_', ' ')} {have}, where {whose} is {want}", levels))
    return found


@dataclass(frozen=True)
class Ask:
    """What an operator asked of this run: ``instinct-fleet quarantine`` (host -> the GPU, None for all, and why) and
    ``instinct-fleet admit`` (hosts whose operator entries and re-admission count are cleared, if the evidence allows)."""

    quarantine: Mapping[str, tuple[int | None, str]] = field(default_factory=dict)
    admit: frozenset[str] = frozenset()


def _operator(previous: Mapping[str, Any], ask: Ask, host: str, now: float) -> list[dict[str, Any]]:
    """The operator's entries this run keeps: the record's, none after ``admit``, plus the one ``quarantine`` adds."""
    kept = [] if host in ask.admit else [e for e in previous.get("operator", []) if isinstance(e, dict)]
    if host in ask.quarantine:
        gpu, reason = ask.quarantine[host]
        kept = [e for e in kept if e.get("gpu") != gpu] + [{"gpu": gpu, "reason": reason, "at": round(now)}]
    return kept


def quarantine(spec: HostSpec, judged: Iterable[Judged], previous: Mapping[str, Any], ask: Ask, now: float) -> Quarantine | None:
    """The units this run holds out, and the record it leaves; None when there is nothing to hold or remember.

    Held: the units whose instance runs on a GPU an error names (all of the host's for a host-wide one), the units of
    the operator's entries, and units the evidence released after ``gpu_health_readmit_max`` re-admissions within
    ``gpu_health_readmit_window``. ``previous``: the record the host has (the preflight fact read it)."""
    v, host = spec.vars, str(spec.host)
    reasons: list[tuple[int | None, str]] = [
        (j.gpu, f"{j.finding.message} [{j.finding.rule}]") for j in judged if j.finding.severity == "error"
    ]
    operator = _operator(previous, ask, host, now)
    reasons += [(e.get("gpu"), f"{e.get('reason', '')} (by an operator) [quarantine-operator]") for e in operator]
    units: dict[str, list[str]] = {}
    for svc in spec.serves:
        unit = paths.vllm_unit(svc.name)
        for gpu, why in reasons:
            if gpu is None or gpu in svc.gpus:
                units.setdefault(unit, []).append(why)
    before = previous.get("units", {}) if isinstance(previous.get("units"), dict) else {}
    history = (
        []
        if host in ask.admit
        else [t for t in previous.get("readmitted", []) if isinstance(t, int | float) and now - t < v.gpu_health_readmit_window]
    )
    released = sorted(u for u in before if u not in units and u in spec.serving_units)
    if released and len(history) >= v.gpu_health_readmit_max:
        held = (
            f"its evidence cleared, but it was re-admitted {len(history)} times within {v.gpu_health_readmit_window} s "
            f"(gpu_health_readmit_max {v.gpu_health_readmit_max}): it stays out until `instinct-fleet admit INVENTORY {host}` [quarantine-held]"
        )
        units.update({u: [held] for u in released})
    elif released:
        history.append(round(now))
    if not units and not history and not operator:
        return None
    since = previous.get("since", {}) if isinstance(previous.get("since"), dict) else {}
    record = {
        "state": "quarantined",
        "units": {u: why for u, why in sorted(units.items())},
        "since": {u: since.get(u, round(now)) if u in before else round(now) for u in sorted(units)},
        "operator": operator,
        "readmitted": history,
    }
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    return Quarantine({u: tuple(r) for u, r in units.items()}, text.encode())
