"""GPU health evidence, parsed from the preflight fact's amd-smi and sysfs sections (pure, run on captured output).

The fields follow AMD's published models of amd-smi's JSON, as AMD's node health
analyzer reads them (amd/node-scraper ``nodescraper/plugins/inband/amdsmi/amdsmidata.py``:
``StaticBus``, ``StaticRas``, ``MetricPcie``, ``MetricEccTotals``, ``EccData``,
``BadPages``/``PageData``, ``XgmiLinks``). Both shapes amd-smi prints are read: ROCm 6's
bare list and ROCm 7's ``{"gpu_data": [...]}``; ``"N/A"`` is no value; warning lines and
Python error text around the JSON are not data. Where amd-smi gives no current PCIe
link, sysfs does (``current_link_width`` and ``current_link_speed`` of the GPU's PCI
device, what ``lspci``'s LnkSta prints).

What one GPU's evidence trips is here too (:func:`trips`, the rules of :data:`PER_GPU_RULES`), with
the amd-smi commands that read it (:data:`COMMANDS`): this module uses the standard library
alone, so that the watch on each serving host runs this same file (``templates/watch.py``
imports it) and judges a GPU between deploys as the deploy does. What the fleet must agree
on, and what a verdict quarantines, is :mod:`instinct_fleet.converge.gpuhealth`'s.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

# Each amd-smi section this module reads, and amd-smi's arguments that print it: the preflight fact (converge/probe.py)
# and the watch run these same commands.
COMMANDS = (
    ("amd-smi-static", "static --json"),
    # ECC totals and blocks with the PCIe link, bad pages, and the XGMI links' state with their bit rate, one call each.
    ("amd-smi-metric", "metric --ecc --ecc-blocks --pcie --json"),
    ("amd-smi-bad-pages", "bad-pages --json"),
    ("amd-smi-xgmi", "xgmi -m -l --json"),
)
# Where amd-smi gives no current link: each amdgpu PCI device's, as sysfs (and lspci's LnkSta) show it, one awk.
PCIE_LINKS = (
    'awk \'{ d = FILENAME; sub(/\\/[^\\/]*$/, "", d); sub(/.*\\//, "", d); if (FILENAME ~ /width$/) w[d] = $0; else s[d] = $0 } '
    "END { for (d in w) print d, w[d], s[d] }' /sys/module/amdgpu/drivers/pci:amdgpu/*/current_link_width "
    "/sys/module/amdgpu/drivers/pci:amdgpu/*/current_link_speed 2>/dev/null"
)
# The probe's sections (instinct_fleet/converge/probe.py) this module reads.
SECTIONS = (*(name for name, _ in COMMANDS), "pcie-links")
# The rules one GPU's evidence can trip (instinct_fleet/model/rules.py holds each one's text and default severity).
PER_GPU_RULES = (
    "gpu-ecc-uncorrectable",
    "gpu-ecc-correctable",
    "gpu-ecc-deferred",
    "gpu-bad-pages",
    "gpu-bad-pages-near",
    "gpu-pcie-width",
    "gpu-pcie-speed",
    "gpu-pcie-recovery",
    "gpu-pcie-recovery-warning",
    "gpu-pcie-replay",
    "gpu-pcie-nak",
    "gpu-xgmi-down",
)


@dataclass(frozen=True)
class Thresholds:
    """The ``gpu_health_*`` thresholds :func:`trips` reads (their defaults, node-scraper's, are the variables')."""

    pcie_width: int
    pcie_speed: float
    recovery_error: int
    recovery_warning: int
    bad_page_warning: float


@dataclass(frozen=True)
class Ecc:
    """Error counts of a GPU or of one of its RAS blocks; None where amd-smi gave none."""

    correctable: int | None = None
    uncorrectable: int | None = None
    deferred: int | None = None


@dataclass(frozen=True)
class GpuEvidence:
    """What one GPU reported. ``xgmi``: its link state to each GPU of the node (U up, D down, X disabled, SELF);
    ``xgmi_rate``: its XGMI links' bit rate as amd-smi's link metrics print it (``32 Gb/s``), which the fleet must
    agree on (node-scraper compares the same ``bit_rate`` with a reference host)."""

    index: int
    bdf: str | None = None
    ecc: Ecc = Ecc()
    blocks: dict[str, Ecc] = field(default_factory=dict)
    retired: int | None = None
    pending: int | None = None
    bad_page_threshold: int | None = None
    threshold_exceeded: bool | None = None
    width: int | None = None
    speed: float | None = None  # GT/s
    max_width: int | None = None
    max_speed: float | None = None
    replays: int | None = None
    recoveries: int | None = None
    naks: int | None = None
    xgmi: tuple[str, ...] = ()
    xgmi_rate: str | None = None
    firmware: str | None = None
    driver: str | None = None
    compute_units: int | None = None
    arch: str | None = None
    link_source: str = "amd-smi"  # where width and speed came from: amd-smi, or sysfs when it had none


@dataclass(frozen=True)
class Evidence:
    """Every GPU's evidence, and what could not be read (``unread``: one line per amd-smi command that gave no data)."""

    gpus: tuple[GpuEvidence, ...] = ()
    unread: tuple[str, ...] = ()


def json_in(text: str) -> Any:
    """The first JSON object or list in amd-smi's output: warnings may come before it (on stdout or, merged,
    stderr) and a Python traceback after it; a bracket in a warning line is not the start."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict | list) and value:
            return value
    return None


def rows(value: Any) -> list[dict[str, Any]] | None:
    """Per-GPU rows of either shape: ROCm 7's ``{"gpu_data": [...]}`` or ROCm 6's list; None when neither."""
    if isinstance(value, dict) and isinstance(value.get("gpu_data"), list):
        value = value["gpu_data"]
    if isinstance(value, dict) and "gpu" in value:
        value = [value]
    if not isinstance(value, list):
        return None
    return [row for row in value if isinstance(row, dict)]


def number(value: Any) -> int | None:
    """An integer amd-smi printed as a number, a digit string, or ``{"value": N, "unit": ...}``; None for N/A."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def rate(value: Any) -> float | None:
    """A link speed in GT/s: ``32``, ``{"value": 32, "unit": "GT/s"}``, ``"32 GT/s"`` or sysfs's ``"32.0 GT/s PCIe"``."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and (found := re.match(r"\s*([0-9]+(?:\.[0-9]+)?)", value)):
        return float(found.group(1))
    return None


def _bit_rate(value: Any) -> str | None:
    """An XGMI bit rate as one string, ``32 Gb/s``, from ``{"value": 32, "unit": "Gb/s"}`` or the text itself."""
    if isinstance(value, dict):
        amount, unit = value.get("value"), value.get("unit")
        return f"{amount:g} {unit}".strip() if isinstance(amount, int | float) and not isinstance(amount, bool) else None
    return text(value)


def text(value: Any) -> str | None:
    """A value amd-smi printed, or None for N/A, nothing, or an object where a value was expected."""
    return None if value in (None, "", "N/A") or isinstance(value, dict | list) else str(value)


def dig(row: Any, *keys: str) -> Any:
    """row[k1][k2]..., or None where amd-smi put "N/A" (or nothing) instead of an object."""
    for key in keys:
        if not isinstance(row, dict):
            return None
        row = row.get(key)
    return row


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def _ecc(row: Any, prefix: str = "") -> Ecc:
    if not isinstance(row, dict):
        return Ecc()
    return Ecc(
        number(row.get(f"{prefix}correctable_count")),
        number(row.get(f"{prefix}uncorrectable_count")),
        number(row.get(f"{prefix}deferred_count")),
    )


def _pages(row: dict[str, Any]) -> tuple[int | None, int | None]:
    """Retired and pending pages of one ``bad-pages`` row: page records under any key, counted by their status."""
    records: list[Any] = []
    read = False
    for key, value in row.items():
        if key == "gpu":
            continue
        if isinstance(value, list):
            records += value
            read = True
        elif isinstance(value, str) and "no bad pages" in value.lower():
            read = True
    if not read:
        return None, None
    statuses = [str(r.get("status", "")).lower() for r in records if isinstance(r, dict)]
    return sum(s == "retired" for s in statuses), sum(s == "pending" for s in statuses)


def _sysfs_links(text: str) -> dict[str, tuple[int | None, float | None]]:
    """``BDF WIDTH SPEED...`` lines (the probe's awk over each amdgpu PCI device) to {bdf: (width, GT/s)}."""
    links = {}
    for line in text.splitlines():
        bits = line.split(None, 2)
        if len(bits) == 3:
            links[bits[0].lower()] = (number(bits[1]), rate(bits[2]))
    return links


def _by_gpu(value: Any) -> dict[int, dict[str, Any]]:
    found = rows(value) or []
    return {index: row for position, row in enumerate(found) if (index := _index(row, position)) is not None}


def _index(row: dict[str, Any], position: int) -> int | None:
    gpu = row.get("gpu")
    return gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else position


def parse(part: dict[str, str]) -> Evidence:
    """The evidence of every GPU amd-smi static listed, from the fact's sections (``part``: name -> text)."""
    static = _by_gpu(json_in(part.get("amd-smi-static", "")))
    if not static:
        return Evidence()
    unread: list[str] = []

    def read(section: str, command: str) -> dict[int, dict[str, Any]]:
        text = part.get(section, "")
        found = _by_gpu(json_in(text)) if text else {}
        if not found:
            last = (text.strip().splitlines() or ["no output"])[-1][:200]
            unread.append(f"amd-smi {command} --json gave no data ({last})")
        return found

    metric = read("amd-smi-metric", "metric --ecc --ecc-blocks --pcie")
    pages = read("amd-smi-bad-pages", "bad-pages")
    xgmi_value = json_in(part.get("amd-smi-xgmi", ""))
    if isinstance(xgmi_value, dict) and isinstance(xgmi_value.get("link_status"), list):
        xgmi_value = xgmi_value["link_status"]
    xgmi = _by_gpu(xgmi_value)
    links = _sysfs_links(part.get("pcie-links", ""))
    gpus = []
    for index, row in sorted(static.items()):
        m = metric.get(index, {})
        found_pcie = m.get("pcie")
        pcie: dict[str, Any] = found_pcie if isinstance(found_pcie, dict) else {}
        bdf = text(dig(row, "bus", "bdf"))
        width, speed, source = number(pcie.get("width")), rate(pcie.get("speed")), "amd-smi"
        if (width is None or speed is None) and bdf is not None and bdf.lower() in links:
            width, speed, source = (
                links[bdf.lower()][0] if width is None else width,
                links[bdf.lower()][1] if speed is None else speed,
                "sysfs",
            )
        blocks = m.get("ecc_blocks")
        retired, pending = _pages(pages[index]) if index in pages else (None, None)
        naks = [n for n in (number(pcie.get("nak_sent_count")), number(pcie.get("nak_received_count"))) if n is not None]
        link_states = dig(xgmi.get(index), "link_status")
        bit_rate = dig(xgmi.get(index), "link_metrics", "bit_rate")
        gpus.append(
            GpuEvidence(
                index=index,
                bdf=bdf,
                ecc=_ecc(m.get("ecc"), "total_"),
                blocks={str(k): _ecc(v) for k, v in blocks.items()} if isinstance(blocks, dict) else {},
                retired=retired,
                pending=pending,
                bad_page_threshold=number(dig(row, "ras", "bad_page_threshold")),
                threshold_exceeded=_flag(dig(row, "ras", "bad_page_threshold_exceeded")),
                width=width,
                speed=speed,
                max_width=number(dig(row, "bus", "max_pcie_width")),
                max_speed=rate(dig(row, "bus", "max_pcie_speed")),
                replays=number(pcie.get("replay_count")),
                recoveries=number(pcie.get("l0_to_recovery_count")),
                naks=sum(naks) if naks else None,
                xgmi=tuple(str(s) for s in link_states) if isinstance(link_states, list) else (),
                xgmi_rate=_bit_rate(bit_rate),
                firmware=text(dig(row, "ifwi", "version")) or text(dig(row, "vbios", "version")),
                driver=text(dig(row, "driver", "version")),
                compute_units=number(dig(row, "asic", "num_compute_units")),
                arch=text(dig(row, "asic", "target_graphics_version")),
                link_source=source,
            )
        )
    return Evidence(tuple(gpus), tuple(unread))


def trips(g: GpuEvidence, t: Thresholds) -> list[tuple[str, str]]:
    """(rule, message) for each rule of :data:`PER_GPU_RULES` one GPU's evidence trips, at the thresholds ``t``."""
    found: list[tuple[str, str]] = []
    reset = "the counters clear at a GPU reset or reboot, and the next deploy re-admits it"
    bad_blocks = {name: e.uncorrectable for name, e in g.blocks.items() if e.uncorrectable}
    if g.ecc.uncorrectable or bad_blocks:
        blocks = ", ".join(f"{name} {n}" for name, n in sorted(bad_blocks.items()))
        found.append(
            (
                "gpu-ecc-uncorrectable",
                f"{g.ecc.uncorrectable or sum(bad_blocks.values())} uncorrectable ECC error(s)"
                + (f" (blocks: {blocks})" if blocks else "")
                + f": read them with `amd-smi metric --ecc --ecc-blocks`; {reset}",
            )
        )
    if g.ecc.correctable:
        found.append(("gpu-ecc-correctable", f"{g.ecc.correctable} correctable ECC error(s) (`amd-smi metric --ecc`)"))
    if g.ecc.deferred:
        found.append(("gpu-ecc-deferred", f"{g.ecc.deferred} deferred ECC error(s) (`amd-smi metric --ecc`)"))
    pages = (g.retired or 0) + (g.pending or 0)
    threshold = g.bad_page_threshold
    if g.threshold_exceeded or (threshold and pages >= threshold):
        found.append(
            (
                "gpu-bad-pages",
                f"{g.retired or 0} retired and {g.pending or 0} pending bad page(s) against ras.bad_page_threshold "
                f"{threshold if threshold is not None else 'N/A'} (bad_page_threshold_exceeded {g.threshold_exceeded}): "
                "the driver stops initialising this GPU; replace it or reset its RAS table (`amd-smi bad-pages`)",
            )
        )
    elif threshold and pages >= t.bad_page_warning * threshold:
        found.append(
            (
                "gpu-bad-pages-near",
                f"{pages} retired and pending bad page(s), {pages / threshold:.0%} of ras.bad_page_threshold {threshold} "
                f"(gpu_health_bad_page_warning {t.bad_page_warning:g})",
            )
        )
    source = "" if g.link_source == "amd-smi" else f" (read from {g.link_source})"
    if g.width is not None and g.width != t.pcie_width:
        found.append(
            (
                "gpu-pcie-width",
                f"PCIe link trained at x{g.width}{source}, not x{t.pcie_width} (gpu_health_pcie_width; the card's maximum is "
                f"x{g.max_width if g.max_width is not None else 'N/A'}): reseat or check the slot and riser, then reboot",
            )
        )
    if g.speed is not None and g.speed != float(t.pcie_speed):
        found.append(
            (
                "gpu-pcie-speed",
                f"PCIe link trained at {g.speed:g} GT/s{source}, not {t.pcie_speed:g} GT/s (gpu_health_pcie_speed; the card's "
                f"maximum is {f'{g.max_speed:g}' if g.max_speed is not None else 'N/A'} GT/s): check the slot, the riser and the BIOS's PCIe setting",
            )
        )
    if g.recoveries is not None and g.recoveries > t.recovery_error:
        found.append(
            (
                "gpu-pcie-recovery",
                f"{g.recoveries} L0-to-recovery transitions, over gpu_health_recovery_error {t.recovery_error}",
            )
        )
    elif g.recoveries is not None and g.recoveries > t.recovery_warning:
        found.append(
            (
                "gpu-pcie-recovery-warning",
                f"{g.recoveries} L0-to-recovery transitions, over gpu_health_recovery_warning {t.recovery_warning}",
            )
        )
    if g.replays:
        found.append(("gpu-pcie-replay", f"{g.replays} PCIe replay(s)"))
    if g.naks:
        found.append(("gpu-pcie-nak", f"{g.naks} PCIe NAK(s) sent or received"))
    down = [peer for peer, state in enumerate(g.xgmi) if state == "D"]
    if down:
        found.append(
            (
                "gpu-xgmi-down",
                f"XGMI link(s) to GPU {', '.join(map(str, down))} down (`amd-smi xgmi -l`): reboot; a link that stays down needs service",
            )
        )
    return found


def read_here(amd_smi: str) -> Evidence:
    """The evidence of the host this runs on, read with the same commands and sysfs read as the deploy's fact (both
    output streams, as its ``2>&1``): the watch's reading between deploys. A command that cannot run leaves its error
    text, which :func:`parse` reads as no data."""
    part: dict[str, str] = {}
    for name, arguments in COMMANDS:
        try:
            done = subprocess.run([amd_smi, *arguments.split()], capture_output=True, text=True, timeout=120)
            part[name] = done.stdout + done.stderr
        except (OSError, subprocess.TimeoutExpired) as error:
            part[name] = str(error)
    try:
        part["pcie-links"] = subprocess.run(["sh", "-c", PCIE_LINKS], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        part["pcie-links"] = ""
    return parse(part)


def errors(evidence: Evidence, t: Thresholds, levels: dict[str, str]) -> dict[int, list[str]]:
    """Each GPU's findings at error level (``levels``: every rule of :data:`PER_GPU_RULES` -> error, warning or off on this
    host), as ``GPU N: message [rule]``: what the watch holds an instance out for (the deploy's verdict says the same)."""
    found: dict[int, list[str]] = {}
    for g in evidence.gpus:
        for rule, message in trips(g, t):
            if levels.get(rule) == "error":
                found.setdefault(g.index, []).append(f"GPU {g.index}: {message} [{rule}]")
    return found
