"""Stand-in for AMD's amd-smi on the simulated MI300X hosts (test only; the ``amd-smi`` script beside it runs it).

``static --json`` and ``version --json`` print output captured verbatim on an 8x
MI300X Dell XE9680 (ROCm 7.2.1, amd-smi 26.2.2; tests/fixtures/*.source.txt).
``metric --ecc --ecc-blocks --pcie --json``, ``bad-pages --json`` and ``xgmi -m -l --json``
have no capture: they are built in the shape of AMD's published models of amd-smi's
JSON, as amd/node-scraper reads them (nodescraper/plugins/inband/amdsmi/amdsmidata.py:
MetricPcie, MetricEccTotals, EccData, BadPages/PageData, XgmiLinks, XgmiMetrics), one row per GPU
of the captured static output, healthy unless the host's fault file says otherwise.

The fault file (FAULTS, JSON) injects hardware faults per GPU index:
  {"shape": "list",                      ROCm 6's bare lists instead of ROCm 7's {"gpu_data": [...]}
   "noise": true,                        a warning line before the JSON, as amd-smi prints without some groups
   "gpus": {"3": {"uncorrectable": 2,    uncorrectable ECC (total and in "block", UMC by default)
                  "correctable": 5, "deferred": 1, "block": "UMC",
                  "retired": 120, "pending": 2,   bad pages (ras.bad_page_threshold is 128)
                  "exceeded": true,               ras.bad_page_threshold_exceeded
                  "width": 8, "speed": 16,        the PCIe link as trained
                  "recoveries": 5, "replays": 1, "naks": 1,
                  "xgmi_down": [5],               links to these GPUs down
                  "xgmi_rate": 16,                its XGMI links' bit rate in Gb/s (32 when absent)
                  "firmware": "00159999"}}}       another IFWI version in static
Anything else fails the way a missing feature would.
"""

import json
import os
import sys

# Where the simulated host mounts the captures, and its fault file (the unit tests point both elsewhere).
DATA = os.environ.get("STANDIN_AMD_SMI_DATA", os.path.dirname(os.path.abspath(__file__)))
FAULTS = os.environ.get("STANDIN_AMD_SMI_FAULTS", "/etc/instinct-fleet-standin/faults.json")


def faults():
    try:
        with open(FAULTS) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}


def static():
    with open(f"{DATA}/amd-smi-static.json") as handle:
        return json.load(handle)


def shaped(rows, found):
    return rows if found.get("shape") == "list" else {"gpu_data": rows}


def metric(rows, found):
    out = []
    for row in rows:
        fault = found.get("gpus", {}).get(str(row["gpu"]), {})
        blocks = {name: {"correctable_count": 0, "uncorrectable_count": 0, "deferred_count": 0} for name in row["ras"]["ecc_block_state"]}
        block = blocks[fault.get("block", "UMC")]
        block.update(
            correctable_count=fault.get("correctable", 0),
            uncorrectable_count=fault.get("uncorrectable", 0),
            deferred_count=fault.get("deferred", 0),
        )
        out.append(
            {
                "gpu": row["gpu"],
                "ecc": {
                    "total_correctable_count": fault.get("correctable", 0),
                    "total_uncorrectable_count": fault.get("uncorrectable", 0),
                    "total_deferred_count": fault.get("deferred", 0),
                    "cache_correctable_count": 0,
                    "cache_uncorrectable_count": 0,
                },
                "ecc_blocks": blocks,
                "pcie": {
                    "width": fault.get("width", 16),
                    "speed": {"value": fault.get("speed", 32), "unit": "GT/s"},
                    "bandwidth": "N/A",
                    "replay_count": fault.get("replays", 0),
                    "l0_to_recovery_count": fault.get("recoveries", 0),
                    "replay_roll_over_count": 0,
                    "nak_sent_count": fault.get("naks", 0),
                    "nak_received_count": 0,
                },
            }
        )
    return out


def bad_pages(rows, found):
    out = []
    for row in rows:
        fault = found.get("gpus", {}).get(str(row["gpu"]), {})
        pages = [
            {"page_address": hex(0x1000 * n), "page_size": "4 KB", "status": "retired", "value": None}
            for n in range(fault.get("retired", 0))
        ]
        pages += [
            {"page_address": hex(0x900000 + n), "page_size": "4 KB", "status": "pending", "value": None}
            for n in range(fault.get("pending", 0))
        ]
        out.append({"gpu": row["gpu"], "retired": pages or "No bad pages found."})
    return out


def xgmi(rows, found):
    """``xgmi -m -l --json``: per GPU its link metrics (amd-smi's JSON, as node-scraper's XgmiMetrics models it:
    bit_rate and max_bandwidth as value and unit; the captures in ../shared/fixtures print 32 Gb/s and 512 Gb/s on
    MI300X) and its links' state to every GPU."""
    out = []
    for row in rows:
        fault = found.get("gpus", {}).get(str(row["gpu"]), {})
        down = fault.get("xgmi_down", [])
        states = ["SELF" if peer["gpu"] == row["gpu"] else ("D" if peer["gpu"] in down else "U") for peer in rows]
        rate = fault.get("xgmi_rate", 32)
        metrics = {
            "bit_rate": {"value": rate, "unit": "Gb/s"},
            "max_bandwidth": {"value": rate * 16, "unit": "Gb/s"},
            "link_type": "XGMI",
            "links": [{"gpu": peer["gpu"], "bdf": peer["bus"]["bdf"], "read": "N/A", "write": "N/A"} for peer in rows],
        }
        out.append({"gpu": row["gpu"], "bdf": row["bus"]["bdf"], "link_metrics": metrics, "link_status": states})
    return out


def main():
    command = " ".join(sys.argv[1:])
    if command == "version --json":
        with open(f"{DATA}/amd-smi-version.json") as handle:
            sys.stdout.write(handle.read())
        return 0
    found = faults()
    if command == "static --json" and not found:  # the capture, byte for byte
        with open(f"{DATA}/amd-smi-static.json") as handle:
            sys.stdout.write(handle.read())
        return 0
    data = static()
    rows = data["gpu_data"]
    for row in rows:
        firmware = found.get("gpus", {}).get(str(row["gpu"]), {}).get("firmware")
        if firmware:
            row["ifwi"]["version"] = firmware
        fault = found.get("gpus", {}).get(str(row["gpu"]), {})
        if "exceeded" in fault:
            row["ras"]["bad_page_threshold_exceeded"] = str(bool(fault["exceeded"]))
    answers = {
        "static --json": lambda: shaped(rows, found),
        "metric --ecc --ecc-blocks --pcie --json": lambda: shaped(metric(rows, found), found),
        "bad-pages --json": lambda: shaped(bad_pages(rows, found), found),
        "xgmi -m -l --json": lambda: xgmi(rows, found),
    }
    if command not in answers:
        print(f"amd-smi stand-in: '{command}' is not captured in the fixtures", file=sys.stderr)
        return 2
    if found.get("noise"):
        print("WARNING: User is missing the following required groups: render [some metrics may be N/A]", file=sys.stderr, flush=True)
    print(json.dumps(answers[command](), indent=4), flush=True)
    return 0


sys.exit(main())
