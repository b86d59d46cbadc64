#!/usr/bin/env python3
"""How fast does the watch take a hung engine out of rotation, and what do clients see, through real deploys?

On the simulated fleet (tests/fleet/fleet.py, inventories/local.py: the real vllm-router in front of gpt-oss-120b's
three stand-in instances on sim-gpu-1 and sim-gpu-2), with the fault tests' inventory (a 5 s drain) and the watch's
defaults (a reading every 5 s, a 60 s stall window), under a steady client of 8 requests a second through the
router, half of them streamed, each with a prompt of its own (so that the cache-aware router spreads them):

- **hangs**: HANGS times, an instance (in turn) is hung (``POST /standin/hang``: /health stays 200, the step
  counters freeze, every request waits, as vllm#39863's engine core did; two requests of its own wait on it, as those
  the router sent there before it knew would). Measured: the seconds from the hang until
  the router's pool no longer lists it, and until it is back after its restart and gate; the client requests that
  failed, and those of them sent after it had left the pool. The restart budget's window is shortened to 60 s for
  this part, so that ten hangs of three instances never spend it.
- **always hangs**: one instance is hung again each time it is back, with the default budget (3 restarts in 900 s):
  measured, how many restarts until it is left out, and what the client saw meanwhile.

Writes its section of benchmarks/RESULTS.md (between its markers) and the raw figures to ``benchmarks/hangs.json``.
Needs root (dockerd) and the fleet of slot INSTINCT_FLEET_SLOT (started when missing). Usage:
``sudo .venv/bin/python benchmarks/hangs.py [HANGS]`` (default 10: about 25 minutes); ``--rewrite`` writes the
section again from the last figures without a fleet.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import fleetctl  # noqa: E402  (the simulated fleet's inventories and deploys, as the end-to-end tests use them)
import sections  # noqa: E402  (benchmarks/sections.py)

from instinct_fleet.model.defaults import FleetVars  # noqa: E402

RAW = ROOT / "benchmarks" / "hangs.json"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- benchmarks/hangs.py writes from here -->", "<!-- benchmarks/hangs.py writes up to here -->"
# The instances behind the router's pool of gpt-oss-120b (host, unit, port); sim-gpu-1's main answers on its api_port.
TARGETS = (("sim-gpu-1", "vllm-batch", 8081), ("sim-gpu-2", "vllm-oss", 8001), ("sim-gpu-1", "vllm-main", 0))


def address(fleet: dict[str, Any], host: str) -> str:
    return str(next(h["address"] for h in fleet["hosts"] if h["name"] == host))


def port_of(fleet: dict[str, Any], host: str, port: int) -> int:
    return port or int(next(h["api_port"] for h in fleet["hosts"] if h["name"] == host))


def pool(fleet: dict[str, Any]) -> list[str]:
    return fleetctl.pool(fleet)


def watch_state(fleet: dict[str, Any], host: str, unit: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{address(fleet, host)}:{FleetVars().watch_port}/state", timeout=10) as reply:
        return dict(json.loads(reply.read())["instances"][unit])


def until(what: Any, seconds: float) -> float:
    started = time.monotonic()
    while not what():
        if time.monotonic() - started > seconds:
            raise SystemExit(f"not within {seconds} s")
        time.sleep(0.25)
    return time.monotonic() - started


def deploy(fleet: dict[str, Any], data: dict[str, Any]) -> None:
    path = fleetctl.inventory(Path(tempfile.mkdtemp(prefix="hangs-")), "hangs", {**fleetctl.BASELINE, **data})
    run = fleetctl.deploy(inventory=path)
    assert run.results["failed_hosts"] == ["sim-nogpu"], run.stderr[-3000:]
    for host, unit, port in TARGETS:
        url = f"http://{address(fleet, host)}:{port_of(fleet, host, port)}"
        until(lambda url=url, host=host, unit=unit: url in pool(fleet) and watch_state(fleet, host, unit)["state"] == "in", 300)


def hang_once(fleet: dict[str, Any], load: fleetctl.Load, host: str, unit: str, port: int) -> dict[str, Any]:
    url = f"http://{address(fleet, host)}:{port_of(fleet, host, port)}"
    fleetctl.hang(url, fleet["api_key"])
    hung = time.monotonic()
    out = until(lambda: url not in pool(fleet), 300)
    left = time.monotonic()
    back = until(lambda: url in pool(fleet), 600) + out
    time.sleep(5)  # the requests sent just before it came back have ended
    failed = [s for s in load.done if not s.ok and s.at >= hung - 60]
    return {
        "host": host,
        "unit": unit,
        "out_seconds": round(out, 1),
        "back_seconds": round(back, 1),
        "failed": len([s for s in failed if s.at < left]),
        "failed_after_out": len([s for s in failed if s.at >= left]),
        "restarts": watch_state(fleet, host, unit)["restarts"],
    }


def measure(hangs: int) -> dict[str, Any]:
    if not fleetctl.FLEET_FILE.is_file():
        subprocess.run([sys.executable, str(ROOT / "tests" / "fleet" / "fleet.py"), "up"], check=True)
    fleet = json.loads(fleetctl.FLEET_FILE.read_text())
    deploy(fleet, {"watch_restart_window": 60})
    trials = []
    with fleetctl.Load(fleetctl.router_url(fleet), key=fleet["api_key"], vary=True) as load:
        for i in range(hangs):
            host, unit, port = TARGETS[i % len(TARGETS)]
            trials.append(hang_once(fleet, load, host, unit, port))
            print(json.dumps(trials[-1]), flush=True)
            time.sleep(65)  # past the shortened window: each hang starts on a full budget
        served = sum(1 for s in load.done if s.ok)
        sent = len(load.done)
    print(json.dumps({"sent": sent, "served": served}), flush=True)
    deploy(fleet, {})  # the default budget: 3 restarts in 900 s
    host, unit, port = TARGETS[0]
    fleetctl.ssh(fleet, host, f"rm -f /var/lib/instinct-fleet/watch/{unit}.restarts")  # its restarts above do not count here
    url = f"http://{address(fleet, host)}:{port_of(fleet, host, port)}"
    always: list[dict[str, Any]] = []
    with fleetctl.Load(fleetctl.router_url(fleet), key=fleet["api_key"], vary=True) as load:
        started = time.monotonic()
        for _ in range(FleetVars().watch_max_restarts):  # each hang spends one restart
            always.append(hang_once(fleet, load, host, unit, port))
            print(json.dumps(always[-1]), flush=True)
        fleetctl.hang(url, fleet["api_key"])
        until(lambda: url not in pool(fleet) and watch_state(fleet, host, unit)["state"] == "left-out", 300)
        left_out_after = time.monotonic() - started
        time.sleep(30)  # the rest of the fleet serves on
        tail = [s for s in load.done if s.at >= time.monotonic() - 30]
    state = watch_state(fleet, host, unit)
    fleetctl.ssh(fleet, host, f"systemctl restart {unit} && rm /var/lib/instinct-fleet/watch/{unit}.out")
    until(lambda: url in pool(fleet), 300)
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "hangs": trials,
        "sent": sent,
        "served": served,
        "always": {
            "cycles": always,
            "restarts": state["restarts"],
            "state": state["state"],
            "reason": state["reason"],
            "seconds": round(left_out_after, 1),
            "last_30s_sent": len(tail),
            "last_30s_failed": len([s for s in tail if not s.ok]),
        },
    }


def section(data: dict[str, Any]) -> str:
    v = FleetVars()
    trials = data["hangs"]
    outs = [t["out_seconds"] for t in trials]
    backs = [t["back_seconds"] for t in trials]
    always = data["always"]
    return "\n".join(
        [
            BEGIN,
            "",
            f"`benchmarks/hangs.py`, {data['date']} on {data['machine']}: {len(trials)} hangs of the router's three gpt-oss-120b "
            f"instances in turn, under 8 requests a second through the router; the watch's defaults (a reading every "
            f"{v.watch_interval} s, a {v.watch_stall_seconds} s stall window), its budget window shortened to 60 s for this part.",
            "",
            "| | median | max |",
            "| --- | --- | --- |",
            f"| out of the pool after the hang | {statistics.median(outs):.1f} s | {max(outs):.1f} s |",
            f"| back in the pool after the hang (restart and gate) | {statistics.median(backs):.1f} s | {max(backs):.1f} s |",
            "",
            f"Of {data['sent']} client requests, {data['served']} were served. Failed: {sum(t['failed'] for t in trials)} (per hang: "
            f"{', '.join(str(t['failed']) for t in trials)}), each sent in the minute before a hang or while the hung instance "
            f"was still in the pool, where the router sent requests that then waited on it; "
            f"{sum(t['failed_after_out'] for t in trials)} sent after it had left. Every hung instance came back.",
            "",
            f"An instance hung again each time it was back, with the default budget ({v.watch_max_restarts} restarts in "
            f"{v.watch_restart_window} s): left out after {always['restarts']} restarts, {always['seconds']:.0f} s after its first "
            f"hang ({always['reason']}). In the 30 s after, the rest of the fleet served {always['last_30s_sent'] - always['last_30s_failed']} "
            f"of {always['last_30s_sent']} requests.",
            "",
            END,
        ]
    )


def write(data: dict[str, Any]) -> None:
    sections.replace(RESULTS, BEGIN, END, section(data), "Hung engines")


def main() -> None:
    if sys.argv[1:] == ["--rewrite"]:
        write(json.loads(RAW.read_text()))
        return
    data = measure(int(sys.argv[1]) if sys.argv[1:] else 10)
    RAW.write_text(json.dumps(data, indent=2) + "\n")
    write(data)
    print(section(data))


if __name__ == "__main__":
    main()
