#!/usr/bin/env python3
"""vLLM's router in front of the simulated fleet: what clients see during re-tunes and faults, and what cache-aware routing buys.

On the demo fleet (inventories/local.py: the router on sim-gpu-1, gpt-oss-120b's pool of main,
batch and sim-gpu-2's oss behind port 30000), a steady client sends 8 requests a second through the
router, streaming and not in turn, during each of:

(a) a fleet-wide flag change rolled through every serving unit;
(b) a crash-looping change on the gpt-oss hosts, rolled back automatically;
(c) a canary regression (a quarter of the decode speed), rolled back;
(d) ``docker kill`` of one serving unit (sim-gpu-2's oss), with no deploy running.

For each: requests sent, served and failed, and p50/p99 latency; for (d) also how long the router
kept sending to the dead unit (its health checks: every ``router_health_check_interval`` s,
``router_health_failure_threshold`` in a row). Before them, the same client straight to one
instance and through the router, for the router's overhead per request.

Then ``cache_aware`` against ``round_robin`` on a shared-prefix workload: 12 system prompts of
2000 words, each with many users (a short question after it), 16 requests at a time. The gain comes
from the stand-in vLLM's model of the prefix cache (tests/fleet/standin/vllm/vllm_standin.py,
Engine): a cached prefix skips its prefill, and each instance's cache holds five of the twelve
prompts (STANDIN_KV_TOKENS 12000), so round-robin makes every instance cycle through all twelve
and miss, where cache-aware routing keeps each prompt on one instance. On a real fleet the gain
depends on the prefill time of the prompts against their decode, the KV cache each instance has
left for prefixes, and how many distinct prefixes the traffic has.

Writes benchmarks/router.json and its section of benchmarks/RESULTS.md. Needs root (dockerd);
about 20 minutes. Usage: ``.venv/bin/python benchmarks/router.py`` (INSTINCT_FLEET_SLOT picks the fleet).
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "tests" / "fleet"))
from fleetctl import FLAG, FLEET_FILE, OSS, Load, admin_url, deploy, inventory, router_url, ssh  # noqa: E402

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
OUT = ROOT / "benchmarks" / "router.json"
BEGIN, END = "<!-- benchmarks/router.py writes from here -->", "<!-- benchmarks/router.py writes up to here -->"
RATE = 8.0
OFFLINE = {"HF_HUB_OFFLINE": "1"}  # sim-gpu-2's own vllm_env (inventories/local.py)
CANARY = {
    "bench_profiles": {"canary": {"input_len": 2048, "output_len": 64, "num_prompts": 16, "concurrency": [4]}},
    "canary_profile": "canary",
}
# The shared-prefix workload's instances: a KV cache that holds about a third of the prompts, a prefill slow enough to see.
# gpt-oss-120b's --gpu-memory-utilization 0.92 then buys (0.92 - 0.5) / 0.5 * 12000 = 10080 KV tokens: 630 blocks of 16,
# against 12 prompts of 125 blocks each.
PREFIX_ENV = {"STANDIN_KV_TOKENS": "12000", "STANDIN_PREFILL_TOKENS_PER_SECOND": "20000"}
PROMPTS, PROMPT_WORDS, USERS, CONCURRENCY, OUTPUT = 12, 2000, 48, 16, 16
# The router's own cache_aware leaves the best-matching instance for the least loaded one only when their loads
# differ by more than --balance-abs-threshold (64 by default) and 1.5 times: the third row lowers it to this load.
POLICIES: dict[str, dict[str, Any]] = {
    "round_robin": {},
    "cache_aware": {},
    "cache_aware --balance-abs-threshold 4": {"--balance-abs-threshold": 4},
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def figures(load: Load) -> dict[str, Any]:
    ok = [s.seconds * 1000 for s in load.done if s.ok]
    return {
        "sent": len(load.done),
        "served": len(ok),
        "failed": len(load.failed()),
        "p50_ms": round(statistics.median(ok), 1) if ok else None,
        "p99_ms": round(percentile(ok, 0.99), 1) if ok else None,
        "errors": sorted(set(load.failed()))[:3],
    }


def healthy(url: str) -> set[str]:
    with urllib.request.urlopen(f"{url}/workers", timeout=10) as reply:
        return {w["url"] for w in json.loads(reply.read())["workers"] if w["is_healthy"]}


def overhead(fleet: dict[str, Any], key: str) -> dict[str, Any]:
    """The same client for 20 s straight to sim-gpu-2's oss, then through the router."""
    two = next(h["address"] for h in fleet["hosts"] if h["name"] == "sim-gpu-2")
    found = {}
    for name, url in (("direct", f"http://{two}:8001"), ("router", router_url(fleet))):
        with Load(url, RATE, key) as load:
            time.sleep(20)
        found[name] = figures(load)
    found["overhead_p50_ms"] = round(found["router"]["p50_ms"] - found["direct"]["p50_ms"], 1)
    return found


def scenario(fleet: dict[str, Any], key: str, run: Any) -> dict[str, Any]:
    with Load(router_url(fleet), RATE, key) as load:
        time.sleep(2)
        extra = run()
        time.sleep(2)
    return {**figures(load), **extra}


def shared_prefix(url: str, key: str) -> dict[str, Any]:
    """PROMPTS system prompts x USERS users, CONCURRENCY at a time, streamed: throughput and TTFT through ``url``."""
    systems = [" ".join(f"s{p}w{i}" for i in range(PROMPT_WORDS)) for p in range(PROMPTS)]
    requests = [(p, u) for u in range(USERS) for p in range(PROMPTS)]
    random.Random(0).shuffle(requests)  # users arrive in no order (in order, round-robin over 3 would pin 12 prompts by chance)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}

    def one(item: tuple[int, int]) -> tuple[bool, float, float]:
        p, u = item
        body = json.dumps(
            {"model": OSS, "prompt": f"{systems[p]} user {u} asks question {p * 1000 + u}", "max_tokens": OUTPUT, "stream": True}
        )
        started = time.monotonic()
        ttft = None
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/completions", body.encode(), headers), timeout=120) as reply:
                for line in reply:
                    if ttft is None and line.startswith(b"data: {"):
                        ttft = time.monotonic() - started
                    if line.strip() == b"data: [DONE]":
                        return True, ttft or 0.0, time.monotonic() - started
        except OSError:
            pass
        return False, 0.0, time.monotonic() - started

    started = time.monotonic()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        done = list(pool.map(one, requests))
    wall = time.monotonic() - started
    ttfts = [t * 1000 for ok, t, _ in done if ok]
    return {
        "requests": len(done),
        "failed": sum(1 for ok, _, _ in done if not ok),
        "seconds": round(wall, 1),
        "requests_per_s": round(len(ttfts) / wall, 2),
        "output_tokens_per_s": round(len(ttfts) * OUTPUT / wall, 1),
        "ttft_p50_ms": round(statistics.median(ttfts), 1),
        "ttft_p99_ms": round(percentile(ttfts, 0.99), 1),
    }


def counters(fleet: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Each gpt-oss instance's prefix-cache (queries, hits) in tokens, from vLLM's counters on its /metrics."""
    api = next(h["api_port"] for h in fleet["hosts"] if h["name"] == "sim-gpu-1")
    found = {}
    for host, port in (("sim-gpu-1", api), ("sim-gpu-1", 8081), ("sim-gpu-2", 8001)):
        text = ssh(fleet, host, f"curl -s http://127.0.0.1:{port}/metrics")
        values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prefix_cache_")}
        found[f"{host}:{port}"] = (values.get("vllm:prefix_cache_queries_total", 0.0), values.get("vllm:prefix_cache_hits_total", 0.0))
    return found


def hit_rates(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Hits over queries between two readings, per instance."""
    rates = {}
    for name, (queries, hits) in after.items():
        q, h = queries - before[name][0], hits - before[name][1]
        rates[name] = round(h / q, 3) if q else 0.0
    return rates


def main() -> None:
    if not FLEET_FILE.is_file():
        subprocess.run([sys.executable, str(ROOT / "tests" / "fleet" / "fleet.py"), "up"], cwd=ROOT, check=True)
    fleet = json.loads(FLEET_FILE.read_text())
    key = fleet["api_key"]
    tmp = Path(tempfile.mkdtemp(prefix="router-bench-"))
    base = deploy()
    assert "sim-gpu-1" not in base.results["failed_hosts"], base.stderr[-2000:]
    results: dict[str, Any] = {"overhead": overhead(fleet, key)}
    print(json.dumps(results["overhead"]), flush=True)

    def roll() -> dict[str, Any]:
        run = deploy(inventory=inventory(tmp, "a", {"vllm_args": {FLAG: 192}}))
        return {"deploy_s": round(run.seconds), "rolled": sorted({r["host"] for r in run.roll if r["status"] == "rolled"})}

    def crash() -> dict[str, Any]:
        crashing = {"STANDIN_CRASH_AT_START": "1"}
        hosts = {"sim-gpu-1": {"vllm_env": crashing}, "sim-gpu-2": {"vllm_env": {**OFFLINE, **crashing}}}
        run = deploy(inventory=inventory(tmp, "b", {}, hosts))
        return {"deploy_s": round(run.seconds), "rolled_back": sorted({r["host"] for r in run.roll if r["status"] == "rolled-back"})}

    def canary() -> dict[str, Any]:
        run = deploy(inventory=inventory(tmp, "c", {**CANARY, "vllm_env": {"STANDIN_TOKENS_PER_SECOND": "100"}}))
        return {"deploy_s": round(run.seconds), "rolled_back": sorted({r["host"] for r in run.roll if r["status"] == "rolled-back"})}

    def kill() -> dict[str, Any]:
        url, dead = admin_url(fleet), f"http://{next(h['address'] for h in fleet['hosts'] if h['name'] == 'sim-gpu-2')}:8001"
        ssh(fleet, "sim-gpu-2", "docker kill vllm-oss")
        at = time.monotonic()
        while dead in healthy(url) and time.monotonic() - at < 60:
            time.sleep(0.1)
        return {"router_dropped_it_after_s": round(time.monotonic() - at, 1)}

    for name, run in (
        ("a: flag change rolled", roll),
        ("b: crash loop rolled back", crash),
        ("c: canary regression rolled back", canary),
        ("d: docker kill", kill),
    ):
        results[name] = scenario(fleet, key, run)
        print(name, json.dumps(results[name]), flush=True)
        deploy()  # back to inventories/local.py (after d: the killed unit restarted by systemd, or by the deploy)

    for policy, flags in POLICIES.items():
        router = {"router_policy": policy.split()[0], "router_flags": flags}
        hosts = {"sim-gpu-1": {"vllm_env": PREFIX_ENV, **router}, "sim-gpu-2": {"vllm_env": {**OFFLINE, **PREFIX_ENV}}}
        run = deploy(inventory=inventory(tmp, f"prefix-{policy.split()[0]}-{len(flags)}", {}, hosts))
        assert "sim-gpu-1" not in run.results["failed_hosts"], run.stderr[-2000:]
        time.sleep(12)  # the router's health checks have marked sim-nogpu's listed (dead) worker out
        before = counters(fleet)
        results[policy] = shared_prefix(router_url(fleet), key)
        results[policy]["hit_rate"] = hit_rates(before, counters(fleet))
        print(policy, json.dumps(results[policy]), flush=True)
    rr, ca = results["round_robin"], results["cache_aware"]
    results["cache_aware_over_round_robin"] = {
        "throughput": round(ca["requests_per_s"] / rr["requests_per_s"], 2),
        "ttft_p50": round(ca["ttft_p50_ms"] / rr["ttft_p50_ms"], 3),
        "ttft_p99": round(ca["ttft_p99_ms"] / rr["ttft_p99_ms"], 3),
    }
    deploy()
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    write(results)


def write(results: dict[str, Any]) -> None:
    o = results["overhead"]
    rows = ["| scenario | sent | served | failed | p50 ms | p99 ms | note |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("a: flag change rolled", "b: crash loop rolled back", "c: canary regression rolled back", "d: docker kill"):
        r = results[name]
        note = ", ".join(f"{k} {v}" for k, v in r.items() if k in ("deploy_s", "rolled", "rolled_back", "router_dropped_it_after_s"))
        rows.append(f"| {name} | {r['sent']} | {r['served']} | {r['failed']} | {r['p50_ms']} | {r['p99_ms']} | {note} |")
    ratio = results["cache_aware_over_round_robin"]
    text = "\n".join(
        [
            BEGIN,
            f"Measured by `benchmarks/router.py` on {datetime.now(UTC):%Y-%m-%d}: {platform.machine()}, Linux {platform.release()}, "
            f"Python {platform.python_version()}; vllm-router 0.1.17 (the real router) in front of the stand-in vLLM (its speed "
            f"model, not an MI300X). A client sends {RATE:g} requests a second through the router (gpt-oss-120b's pool: main, "
            "batch, sim-gpu-2's oss, and sim-nogpu's, which never answers), streaming and not in turn.",
            "",
            *rows,
            "",
            f"Router overhead: p50 {o['direct']['p50_ms']} ms straight to one instance, {o['router']['p50_ms']} ms through the router "
            f"(+{o['overhead_p50_ms']} ms); p99 {o['direct']['p99_ms']} ms against {o['router']['p99_ms']} ms.",
            "",
            f"Shared prefixes ({PROMPTS} system prompts of {PROMPT_WORDS} words, {USERS} users each, {CONCURRENCY} at a time, "
            f"{OUTPUT} output tokens; each instance's prefix cache holds five of the twelve prompts; hit rates over the run):",
            "",
            "| policy | requests/s | output tok/s | TTFT p50 ms | TTFT p99 ms | prefix-cache hit rate per instance |",
            "| --- | --- | --- | --- | --- | --- |",
            *(
                f"| {name} | {r['requests_per_s']} | {r['output_tokens_per_s']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | "
                + ", ".join(f"{v:.0%}" for v in r["hit_rate"].values())
                + " |"
                for name, r in ((name, results[name]) for name in POLICIES)
            ),
            "",
            f"cache_aware / round_robin in one run: throughput x{ratio['throughput']}, TTFT p50 x{ratio['ttft_p50']}, "
            f"p99 x{ratio['ttft_p99']}. The gain is the stand-in's prefix-cache model (a hit skips its prefill); on a real "
            "fleet it follows the prefill time of the shared prefixes against the decode, the KV cache each instance has "
            "left for them, and how many distinct prefixes the traffic has. The router keys its prefix tree by the token ids\n"
            "the instances' `/tokenize` returns (it asks `/v1/completions/render` first; the stand-in answers 404 there, as vLLM does with its opt-in scale-out endpoints off): on an\n"
            "earlier run against a stand-in without `/tokenize`, cache_aware measured no better than round_robin (43% against\n"
            "38% hits). In (d), only requests in flight on the killed unit could fail; the router stopped sending to it after\n"
            "its health checks (every 5 s, 2 in a row).",
            END,
        ]
    )
    current = RESULTS.read_text()
    if BEGIN in current:
        current = current.split(BEGIN)[0] + text + current.split(END, 1)[1]
    else:
        current = current.rstrip() + "\n\n## A router in front\n\n" + text + "\n"
    RESULTS.write_text(current)


if __name__ == "__main__":
    main()
