"""vLLM's real router (vllm-router, the pinned wheel) in front of the fleet on inventories/local.py: installed from the
controller's copy, one pool per model from the inventory, and a router the roll cannot reach stopping the roll before
its unit stops. The roll's zero-failure claims (a re-tune, a crash loop rolled back, a canary rolled back) are in
test_roll.py, under a client through the router; a killed unit is benchmarks/router.py's (d).

Named to run before test_roll.py on its share: test_roll's last test leaves the fleet on another image, which every
later module on inventories/local.py would have to roll back first.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fleetctl import ADMIN_PORT, ROUTER_PORT, Run, admin_url, deploy, inventory, pool, quiet, router_url, ssh, started_at, until

FLEET_SHARE = 0  # a short module beside test_deploy (conftest.py)

UNIT = f"instinct-fleet-router-{ROUTER_PORT}"


def healthy_workers(fleet: dict[str, Any]) -> set[str]:
    with urllib.request.urlopen(f"{admin_url(fleet)}/workers", timeout=10) as reply:
        return {w["url"] for w in json.loads(reply.read())["workers"] if w["is_healthy"]}


def address(fleet: dict[str, Any], host: str) -> str:
    return str(next(h["address"] for h in fleet["hosts"] if h["name"] == host))


def test_the_router_serves_one_pool_per_model_from_the_pinned_wheel(on_local: Run, fleet: dict[str, Any]) -> None:
    url = router_url(fleet)
    one, two = address(fleet, "sim-gpu-1"), address(fleet, "sim-gpu-2")
    api = {h["name"]: h["api_port"] for h in fleet["hosts"]}
    # sim-nogpu fails preflight: it is in the inventory, never in the pool.
    assert pool(fleet) == sorted([f"http://{one}:{api['sim-gpu-1']}", f"http://{one}:8081", f"http://{two}:8001"])
    unit = ssh(fleet, "sim-gpu-1", f"systemctl cat {UNIT}; ps -eo args | grep [l]aunch.py")
    assert "--worker-urls" not in unit and "/opt/instinct-fleet/vllm-router-" in unit
    # The router passes the client's key on: with sim-gpu-1's instances out of the pool, sim-gpu-2's oss (which
    # requires the key) answers through it with the key, and refuses without.
    body = json.dumps({"model": "openai/gpt-oss-120b", "prompt": "hi", "max_tokens": 2}).encode()
    for port in (api["sim-gpu-1"], 8081):
        remove = urllib.request.Request(f"{admin_url(fleet)}/remove_worker?url=http://{one}:{port}", method="POST")
        urllib.request.urlopen(remove, timeout=10).close()
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401
    request.add_header("Authorization", f"Bearer {fleet['api_key']}")
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert '"choices"' in reply.read().decode()
    # Drift: the running pool lacks two instances the inventory has. The next deploy adds them back through the
    # router's worker API, without restarting it, and changes nothing else.
    repaired = deploy()
    (synced,) = [op for host, op in repaired.changed_ops() if host == "sim-gpu-1" and op.startswith("Router pool of openai/gpt-oss-120b: ")]
    assert set(synced.split(": ", 1)[1].split("; ")) == {f"add http://{one}:{api['sim-gpu-1']}", f"add http://{one}:8081"}, synced
    assert {h for h, _ in repaired.changed()} == {"sim-gpu-1"}
    assert len(pool(fleet)) == 3 and "sim-gpu-1" not in repaired.results["failed_hosts"]


def attempt(fleet: dict[str, Any], command: str) -> str:
    """What a command run on sim-nogpu prints (a host of the inventory that serves nothing: the intruder's seat)."""
    return ssh(fleet, "sim-nogpu", command + "; true")


def test_from_a_host_in_no_pool_the_router_s_worker_api_and_its_pool_are_out_of_reach(on_local: Run, fleet: dict[str, Any]) -> None:
    """The intruder's attempts of issue 60, each one case: the worker API on the clients' port and on the router's own
    port, a fake worker on a host that failed preflight, and a port opened at run time on the router's host."""
    one, nogpu = address(fleet, "sim-gpu-1"), address(fleet, "sim-nogpu")
    fake = f"http://{nogpu}:8099"
    curl = "curl -s -o /dev/null -w '%{http_code}' -m 5"
    # The worker API on the clients' port: the front answers 404 and the router never sees the call.
    for method, route in (("POST", f"/add_worker?url={fake}"), ("POST", f"/remove_worker?url=http://{one}:8081"), ("GET", "/list_workers")):
        assert attempt(fleet, f"{curl} -X {method} 'http://{one}:{ROUTER_PORT}{route}'") == "404", route
    # The router's own port: the firewall drops whoever is not a serving host of its pool or router_admin_from.
    assert attempt(fleet, f"{curl} -X POST 'http://{one}:{ADMIN_PORT}/add_worker?url={fake}'") == "000"
    assert fake not in pool(fleet) and f"http://{nogpu}:8080" not in pool(fleet)
    # A fake worker on the failed host, answering /health as an instance would: the next deploy does not add it.
    ssh(fleet, "sim-nogpu", "systemd-run --unit fake-worker --property User=nobody -- python3 -m http.server -d /tmp 8080")
    try:
        until(lambda: attempt(fleet, f"{curl} http://127.0.0.1:8080/health") == "404", 30)  # it answers (any answer is one)
        quiet(deploy())
        assert f"http://{nogpu}:8080" not in pool(fleet)
    finally:
        ssh(fleet, "sim-nogpu", "systemctl stop fake-worker || true")
    # A port opened at run time on the router's host, by anyone there: nobody else reaches it.
    ssh(fleet, "sim-gpu-1", "systemd-run --unit run-time-port --property User=nobody -- python3 -m http.server -d /tmp 8099")
    try:
        until(lambda: ssh(fleet, "sim-gpu-1", f"{curl} http://127.0.0.1:8099/; true") == "200", 30)
        assert attempt(fleet, f"{curl} http://{one}:8099/") == "000"
    finally:
        ssh(fleet, "sim-gpu-1", "systemctl stop run-time-port || true")
    # A keyed instance's routes that vLLM answers without the key (/tokenize): out of reach, but for who may.
    two = address(fleet, "sim-gpu-2")
    tokenize = f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 -H 'Content-Type: application/json' -d '{{\"prompt\": \"hi\"}}' http://{two}:8001/tokenize"
    assert attempt(fleet, tokenize) == "000"
    assert ssh(fleet, "sim-gpu-1", tokenize + "; true") != "000"  # sim-gpu-1 may (vllm_allow_from): the same call passes the firewall
    # Through the router without the key: every instance of the pool takes the key (router-api-key), so each refuses.
    # A prompt of its own per request: the cache-aware router spreads new prefixes over the pool, where one prompt
    # would reach the same instance every time.
    answers = []
    for n in range(12):
        body = json.dumps({"model": "openai/gpt-oss-120b", "prompt": f"{n} keyless {n * 7919}", "max_tokens": 2})
        keyless = f"curl -s -o /dev/null -w '%{{http_code}}' -m 30 -H 'Content-Type: application/json' -d '{body}' http://{one}:{ROUTER_PORT}/v1/completions"
        answers.append(attempt(fleet, keyless))
    assert answers == ["401"] * 12, answers
    # An OpenAI route with the key answers through the front, from anywhere (router_allow_from is not set).
    answered = attempt(
        fleet,
        f"curl -s -m 30 -H 'Content-Type: application/json' -H 'Authorization: Bearer {fleet['api_key']}' -d '{body}' http://{one}:{ROUTER_PORT}/v1/completions",
    )
    assert '"choices"' in answered, answered


def test_a_router_the_roll_cannot_reach_stops_the_roll_before_its_unit_stops(on_local: Run, fleet: dict[str, Any], tmp_path: Path) -> None:
    before = started_at(fleet, "sim-gpu-1", "vllm-batch")
    block = "nft add table inet test_block; nft add chain inet test_block input '{ type filter hook input priority -10; }'; "
    ssh(fleet, "sim-gpu-1", block + f"nft add rule inet test_block input tcp dport {ADMIN_PORT} reject with tcp reset")
    changed = {"sim-gpu-1": {"vllm_args": {"max-num-seqs": 220}}}
    try:
        # Its only host fails, so pyinfra ends with no results (results=False).
        run = deploy("--limit", "sim-gpu-1", inventory=inventory(tmp_path, "blocked", {}, changed), results=False)
    finally:
        ssh(fleet, "sim-gpu-1", "nft delete table inet test_block")
    assert run.rc != 0 and "Traceback" not in run.stderr
    assert "could not take vllm-main" in run.stderr and "still serves" in run.stderr, run.stderr[-3000:]
    assert started_at(fleet, "sim-gpu-1", "vllm-batch") == before
