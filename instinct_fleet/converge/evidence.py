"""GPU health evidence, parsed from the preflight fact's amd-smi and sysfs sections (pure, run on captured output).

The fields follow AMD's published models of amd-smi's JSON, as AMD's node health
analyzer reads them (amd/node-scraper ``nodescraper/plugins/inband/amdsmi/amdsmidata.py``:
``StaticBus``, ``StaticRas``, ``MetricPcie``, ``MetricEccTotals``, ``EccData``,
``BadPages``/``PageData``, ``XgmiLinks``). Both shapes amd-smi prints are read: ROCm 6's
bare list and ROCm 7's ``{"gpu_data": [...]}``; ``"N/A"`` is no value; warning lines and
Python error text around the JSON are not data. Where amd-smi gives no current PCIe
link, sysfs does (``current_link_width`` and ``current_link_speed`` of the GPU's PCI
device, what ``lspci``'s LnkSta prints).

What a field means for the host is :mod:`instinct_fleet.converge.gpuhealth`'s.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# The probe's sections (instinct_fleet/converge/probe.py) this module reads.
SECTIONS = ("amd-smi-static", "amd-smi-metric", "amd-smi-bad-pages", "amd-smi-xgmi", "pcie-links")


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
