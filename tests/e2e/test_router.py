"""vLLM's real router (vllm-router, the pinned wheel) in front of sim-gpu-1's two gpt-oss instances: installed from the
controller's copy, its pool from the inventory, and a re-tune that rolls a unit while clients send requests through it.

Zero client-visible failures during the roll is the claim; the router stopped answering its worker API must fail
the host before its unit stops. It leaves the fleet on its own inventory, so it runs after the modules on
inventories/local.py (FLEET_LAST).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from fleetctl import deploy, inventory, ssh, started_at

FLEET_SHARE = 1
FLEET_LAST = True

OSS = "openai/gpt-oss-120b"
PORT = 30000
UNIT = f"instinct-fleet-router-{PORT}"


def routed(fleet: dict[str, Any], batch_seqs: int | None = None) -> dict[str, dict[str, Any]]:
    """sim-gpu-1 runs the router for its own model; ``batch_seqs`` changes only the batch instance (one unit rolls)."""
    api_port = next(h["api_port"] for h in fleet["hosts"] if h["name"] == "sim-gpu-1")
    batch: dict[str, Any] = {"name": "batch", "recipe": "gpt-oss-120b-batch", "port": 8081}
    if batch_seqs is not None:
        batch["args"] = {"max-num-seqs": batch_seqs}
    return {
        "sim-gpu-1": {
            "router": True,
            "router_models": [OSS],
            "router_policy": "round_robin",
            "router_health_check_interval": 1,
            "vllm_instances": [{"name": "main", "port": api_port}, batch],
        }
    }


class Load:
    """A steady client: ``rate`` requests a second through the router, streaming and not in turn, each on its own thread."""

    def __init__(self, url: str, rate: float = 8.0) -> None:
        self.url, self.period = url, 1.0 / rate
        self.done: list[tuple[bool, bool, str]] = []  # streamed, ok, what went wrong
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _one(self, stream: bool) -> None:
        body = json.dumps({"model": OSS, "prompt": "route me", "max_tokens": 8, "stream": stream}).encode()
        request = urllib.request.Request(f"{self.url}/v1/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                text = reply.read().decode()
            ok, why = ("[DONE]" in text, text[-200:]) if stream else ('"choices"' in text, text[-200:])
        except OSError as error:
            ok, why = False, str(error)
        with self._lock:
            self.done.append((stream, ok, "" if ok else why))

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self.period):
            thread = threading.Thread(target=self._one, args=(n % 2 == 1,), daemon=True)
            thread.start()
            self._threads.append(thread)
            n += 1

    def __enter__(self) -> Load:
        self._main = threading.Thread(target=self._run, daemon=True)
        self._main.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._main.join()
        for thread in self._threads:
            thread.join(70)

    def failed(self) -> list[str]:
        return [why for _, ok, why in self.done if not ok]


def pool(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/list_workers", timeout=10) as reply:
        return sorted(json.loads(reply.read())["urls"])


def test_a_router_in_front_loses_no_request_while_a_unit_rolls_and_a_router_it_cannot_reach_stops_the_roll(
    fleet: dict[str, Any], tmp_path: Path
) -> None:
    address = next(h["address"] for h in fleet["hosts"] if h["name"] == "sim-gpu-1")
    api_port = next(h["api_port"] for h in fleet["hosts"] if h["name"] == "sim-gpu-1")
    router = f"http://{address}:{PORT}"
    first = deploy(inventory=inventory(tmp_path, "routed", {}, routed(fleet)))
    assert "sim-gpu-1" not in first.results["failed_hosts"], first.stderr[-3000:]
    assert ("sim-gpu-1", f"Router {UNIT} for {OSS}") in first.changed_ops()
    assert pool(router) == sorted([f"http://{address}:{api_port}", f"http://{address}:8081"])
    unit = ssh(fleet, "sim-gpu-1", f"systemctl cat {UNIT}; ps -eo args | grep [l]aunch.py")
    assert "--worker-urls" not in unit and "/opt/instinct-fleet/vllm-router-" in unit

    # (a) A flag change on one unit, rolled while the client sends through the router.
    with Load(router) as load:
        time.sleep(2)
        second = deploy(inventory=inventory(tmp_path, "retuned", {}, routed(fleet, batch_seqs=200)))
        time.sleep(2)
    assert "sim-gpu-1" not in second.results["failed_hosts"], second.stderr[-3000:]
    ops = second.changed_ops()
    assert {("sim-gpu-1", "Roll: out of the router pools"), ("sim-gpu-1", "Roll: back into the router pools")} <= ops
    assert load.failed() == [], load.failed()[:5]
    streamed = sum(1 for s, ok, _ in load.done if s and ok)
    assert streamed >= 10 and len(load.done) - streamed >= 10, len(load.done)
    assert pool(router) == sorted([f"http://{address}:{api_port}", f"http://{address}:8081"])

    # The router's worker API refused (its port rejected on the host): the unit that would roll is not stopped.
    before = started_at(fleet, "sim-gpu-1", "vllm-batch")
    block = "nft add table inet test_block; nft add chain inet test_block input '{ type filter hook input priority -10; }'; "
    ssh(fleet, "sim-gpu-1", block + f"nft add rule inet test_block input tcp dport {PORT} reject with tcp reset")
    try:
        third = deploy(inventory=inventory(tmp_path, "blocked", {}, routed(fleet, batch_seqs=220)))
    finally:
        ssh(fleet, "sim-gpu-1", "nft delete table inet test_block")
    assert "sim-gpu-1" in third.results["failed_hosts"]
    assert "could not take vllm-batch" in third.stderr and "still serves" in third.stderr, third.stderr[-3000:]
    assert started_at(fleet, "sim-gpu-1", "vllm-batch") == before
