"""End to end: the real CLI and pyinfra over SSH onto the simulated fleet, twice, then drift.

sim-gpu-1 and sim-gpu-2 must converge and serve; sim-c1 and sim-c2 must form a
Ray cluster serving one instance over both; sim-nogpu must fail preflight alone.
The second run must change nothing; drift must be repaired exactly.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from fleetctl import FIGURES, ROOT, SERVING, Run, deploy, run_cli, ssh, started_at, verify


@pytest.fixture(scope="module")
def second(converged: Run) -> Run:
    """A run on the converged fleet (whatever ran before this module, ``converged`` brought it back)."""
    return deploy()


def test_first_run_converges_the_gpu_hosts_and_fails_the_gpu_less_host_alone(first_run: Run) -> None:
    first = first_run
    assert first.rc == 1
    assert first.results["failed_hosts"] == ["sim-nogpu"], first.stderr[-4000:]
    assert "sim-nogpu cannot serve: no AMD GPU found" in first.stderr
    assert "/dev/kfd is missing" in first.stderr
    changed_hosts = {host for host, _ in first.changed()}
    assert changed_hosts == {"sim-gpu-1", "sim-gpu-2", "sim-c1", "sim-c2"}


def test_second_run_changes_nothing(second: Run) -> None:
    assert second.results["totals"]["success"] == 0, second.changed()
    assert second.results["failed_hosts"] == ["sim-nogpu"]


def test_verify_module_passes_on_the_converged_hosts(second: Run) -> None:
    done = verify(SERVING)
    assert done.returncode == 0, done.stdout[-4000:]


def test_verify_module_reports_the_host_that_failed_preflight(second: Run) -> None:
    done = verify("sim-nogpu")
    assert done.returncode == 1
    assert "no AMD GPU found" in done.stdout


def test_endpoint_serves_a_completion(second: Run, fleet: dict[str, Any]) -> None:
    body = json.dumps({"model": "openai/gpt-oss-120b", "prompt": "MI300X says", "max_tokens": 4})
    reply = ssh(
        fleet,
        "sim-gpu-1",
        f"curl -s -X POST -H 'Content-Type: application/json' -H 'Authorization: Bearer {fleet['api_key']}' -d '{body}' "
        "http://127.0.0.1:18001/v1/completions",
    )
    assert json.loads(reply)["choices"][0]["text"].strip()


def test_the_api_key_guards_v1_and_never_leaves_its_file(second: Run, fleet: dict[str, Any]) -> None:
    """sim-gpu-2 serves with vllm_api_key_path: a client gets 401 without the key and 200 with it; /health stays open."""
    port = next(h["api_port"] for h in fleet["hosts"] if h["name"] == "sim-gpu-2")
    url = f"http://{address(fleet, 'sim-gpu-2')}:{port}"
    code = "curl -s -o /dev/null -w '%{http_code}' -m 5"
    assert ssh(fleet, "sim-gpu-1", f"{code} {url}/v1/models").strip() == "401"
    assert ssh(fleet, "sim-gpu-1", f"{code} -H 'Authorization: Bearer wrong' {url}/v1/models").strip() == "401"
    assert ssh(fleet, "sim-gpu-1", f"{code} -H 'Authorization: Bearer {fleet['api_key']}' {url}/v1/models").strip() == "200"
    assert ssh(fleet, "sim-gpu-1", f"{code} {url}/health").strip() == "200"
    places = "cat /etc/systemd/system/vllm-*.service /etc/instinct-fleet/*.env; ps -eo args; docker inspect vllm-llama-a vllm-oss"
    assert fleet["api_key"] not in ssh(fleet, "sim-gpu-2", places)


def test_bad_input_fails_before_any_connection(tmp_path: Path) -> None:
    (tmp_path / "inventories").mkdir()
    shutil.copytree(ROOT / "group_data", tmp_path / "group_data")
    (tmp_path / "inventories" / "bad.py").write_text(
        "hosts = [('mi300x-x01', {'ssh_hostname': '127.0.0.1', 'ssh_port': 1, 'vllm_args': {'tensor-paralel-size': 2}})]\n"
    )
    done = run_cli("deploy", str(tmp_path / "inventories" / "bad.py"))
    assert done.returncode == 1
    assert "mi300x-x01" in done.stderr and "tensor-paralel-size" in done.stderr and "flag-unknown" in done.stderr
    assert "no host was contacted" in done.stderr
    assert "Traceback" not in done.stderr


def test_drift_is_repaired_exactly_and_nothing_else(second: Run, fleet: dict[str, Any]) -> None:
    untouched = {("sim-gpu-1", "vllm-main"): "", ("sim-gpu-2", "vllm-llama-a"): ""}
    for host, container in untouched:
        untouched[host, container] = started_at(fleet, host, container)
    batch_before = started_at(fleet, "sim-gpu-1", "vllm-batch")
    # kernel.numa_balancing itself is shared by every host on this one kernel, so the
    # drift goes into one host's own file instead; a unit edit; a stopped container.
    ssh(fleet, "sim-gpu-1", "sed -i 's/= 0/= 1/' /etc/sysctl.d/90-instinct-fleet.conf")
    ssh(fleet, "sim-gpu-1", "echo '# hand edit' >> /etc/systemd/system/vllm-batch.service")
    ssh(fleet, "sim-gpu-2", "docker stop vllm-oss")
    # An instance renamed away in the inventory: its old unit, written by an earlier deploy, is still running.
    ghost = "# Managed by instinct-fleet\n[Service]\nExecStart=/bin/sleep infinity\n"
    ssh(
        fleet,
        "sim-gpu-2",
        f"printf '{ghost}' > /etc/systemd/system/vllm-ghost.service && systemctl daemon-reload && systemctl start vllm-ghost",
    )
    assert verify("sim_gpu").returncode == 1, "verify did not notice the drift"

    # docker stop ends the unit with the container's exit code: 0 leaves it stopped for the deploy
    # to start; a non-zero code (docker run --rm can race the removal) lets systemd restart it itself.
    for _ in range(30):  # wait out a pending automatic restart (RestartSec=10)
        state = ssh(fleet, "sim-gpu-2", "systemctl is-active vllm-oss || true").strip()
        if state in ("active", "inactive", "failed"):
            break
        time.sleep(1)
    oss_stopped = state != "active"

    repair = deploy()

    expected = {
        ("sim-gpu-1", "NUMA balancing off at boot"),
        ("sim-gpu-1", "vllm-batch unit"),
        ("sim-gpu-1", "Reload systemd (serving units)"),
        ("sim-gpu-1", "Restart vllm-batch"),
        ("sim-gpu-2", "Stop vllm-ghost"),
        ("sim-gpu-2", "Remove vllm-ghost"),
        ("sim-gpu-2", "Reload systemd (serving units)"),
        # The roll marker instinct-fleet bench checks: there while each host's batch runs.
        ("sim-gpu-1", "Roll: mark the host as rolling"),
        ("sim-gpu-1", "Roll: done on this host"),
        ("sim-gpu-2", "Roll: mark the host as rolling"),
        ("sim-gpu-2", "Roll: done on this host"),
        # The serving files change on both hosts, so each keeps what it ran (hand edit and ghost
        # included: that is what answered) and then the repaired files as generations.
        ("sim-gpu-1", "Roll: keep the serving files as generation"),
        ("sim-gpu-1", "Roll: keep the new serving files as generation"),
        ("sim-gpu-2", "Roll: keep the serving files as generation"),
        ("sim-gpu-2", "Roll: keep the new serving files as generation"),
        # vllm-batch restarts behind the router on sim-gpu-1: out of its pool first, back after its gate.
        ("sim-gpu-1", "Roll: out of the router pools"),
        ("sim-gpu-1", "Roll: back into the router pools"),
    }
    if oss_stopped:  # started again, then added back (the router still lists it: add_worker says it exists)
        expected |= {("sim-gpu-2", "vllm-oss running and enabled"), ("sim-gpu-2", "Roll: back into the router pools")}
    changed = repair.changed()
    unexpected = {(h, names) for h, names in changed if not any(h == eh and what in names for eh, what in expected)}
    missing = {(eh, what) for eh, what in expected if not any(h == eh and what in names for h, names in changed)}
    assert not unexpected and not missing, f"unexpected changes {unexpected}, missing repairs {missing}\n{repair.stderr[-4000:]}"
    assert repair.results["failed_hosts"] == ["sim-nogpu"]
    for (host, container), before in untouched.items():
        assert started_at(fleet, host, container) == before, f"{container} on {host} restarted without a change of its own"
    assert started_at(fleet, "sim-gpu-1", "vllm-batch") != batch_before
    assert ssh(fleet, "sim-gpu-2", "systemctl is-active vllm-oss").strip() == "active"
    assert ssh(fleet, "sim-gpu-2", "systemctl is-active vllm-ghost || true").strip() == "inactive"
    assert ssh(fleet, "sim-gpu-2", "ls /etc/systemd/system/vllm-ghost.service 2>/dev/null || echo gone").strip() == "gone"
    assert deploy().results["totals"]["success"] == 0
    assert verify(SERVING).returncode == 0


def address(fleet: dict[str, Any], host: str) -> str:
    return str(next(h["address"] for h in fleet["hosts"] if h["name"] == host))


def ray_status(fleet: dict[str, Any]) -> tuple[int, float]:
    """(active nodes, total GPUs) as `ray status` on the head prints them."""
    status = ssh(fleet, "sim-c1", "docker exec ray-head ray status")
    active = status.split("Active:")[1].split("Pending:")[0]
    gpus = re.search(r"[0-9.]+/([0-9.]+) GPU", status)
    assert gpus is not None, status
    return len(re.findall(r"node_[0-9a-f]+", active)), float(gpus.group(1))


ALIVE = (
    'docker exec ray-head python3 -c \'import ray; ray.init(address="auto", logging_level="ERROR"); '
    'print(sum(n["Alive"] for n in ray.nodes()), ray.cluster_resources().get("GPU", 0))\' 2>/dev/null'
)


def alive(fleet: dict[str, Any]) -> tuple[int, float]:
    """(live nodes, GPUs) as Ray's GCS knows them; `ray status` keeps a replaced node listed for a while."""
    nodes, gpus = ssh(fleet, "sim-c1", ALIVE).split()
    return int(nodes), float(gpus)


def test_cluster_shows_both_nodes_and_all_their_gpus(second: Run, fleet: dict[str, Any]) -> None:
    assert ray_status(fleet) == (2, 16.0)


def test_cluster_instance_reserves_its_gpus_through_ray_and_serves(second: Run, fleet: dict[str, Any]) -> None:
    journal = ssh(fleet, "sim-c1", "journalctl -u vllm-llama-405b -o cat --no-pager")
    assert "ray cluster ready: 2 nodes, 16 GPUs" in journal  # the unit's readiness gate
    assert "placement group of 16 GPUs ready on 2 nodes" in journal  # TP 8 x PP 2 ranks placed
    body = json.dumps({"model": "meta-llama/Llama-3.1-405B-Instruct", "prompt": "Two nodes", "max_tokens": 4})
    url = f"http://{address(fleet, 'sim-c1')}:18004/v1/completions"
    reply = ssh(fleet, "sim-gpu-1", f"curl -s -X POST -H 'Content-Type: application/json' -d '{body}' {url}")
    assert json.loads(reply)["model"] == "meta-llama/Llama-3.1-405B-Instruct"


def test_firewall_keeps_ray_to_members_and_vllm_to_its_allow_list(second: Run, fleet: dict[str, Any]) -> None:
    head = address(fleet, "sim-c1")

    def reach(source: str, port: int) -> str:
        return ssh(fleet, source, f"timeout 3 bash -c 'echo > /dev/tcp/{head}/{port}' 2>/dev/null && echo open || echo blocked").strip()

    assert reach("sim-gpu-1", 6379) == "blocked"  # a fleet host outside the cluster
    assert reach("sim-c2", 6379) == "open"  # a member
    assert reach("sim-gpu-2", 18004) == "blocked"  # not in vllm_allow_from
    assert reach("sim-gpu-1", 18004) == "open"  # in vllm_allow_from
    # The watch's /state and /metrics on the head (it serves): exactly who may reach its instance, nobody more.
    assert reach("sim-gpu-2", 9401) == "blocked"
    assert reach("sim-gpu-1", 9401) == "open"
    assert reach("sim-c2", 9401) == "open"  # a member


def test_killed_worker_comes_back_and_the_cluster_heals(second: Run, fleet: dict[str, Any]) -> None:
    restarts = "systemctl show -p NRestarts --value vllm-llama-405b"
    before = int(ssh(fleet, "sim-c1", restarts))
    ssh(fleet, "sim-c2", "docker kill ray-worker")
    # vLLM dies with a lost Ray worker; wait until the head's instance has noticed.
    for _ in range(90):
        if int(ssh(fleet, "sim-c1", restarts)) > before:
            break
        time.sleep(2)
    else:
        pytest.fail("the vLLM instance on the head did not notice the lost worker within 180s")
    healed = deploy()
    assert healed.results["failed_hosts"] == ["sim-nogpu"], healed.stderr[-3000:]
    assert alive(fleet) == (2, 16.0)
    assert ssh(fleet, "sim-c1", "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18004/health") == "200"
    assert deploy().results["totals"]["success"] == 0


def test_a_restarted_head_gets_its_worker_back_without_a_deploy(second: Run, fleet: dict[str, Any]) -> None:
    """Real Ray: the worker's raylet reaches the old head's GCS, then shuts itself down with exit 0
    (WrongClusterID), which ``ray start --block`` ignores. The unit's shell sees no raylet and exits 1,
    systemd restarts the worker, and the cluster and its instance come back with no one acting."""
    ssh(fleet, "sim-c1", "systemctl restart ray-head")
    started = time.monotonic()
    health = "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18004/health || true"
    while time.monotonic() - started < 300:
        time.sleep(5)
        if ssh(fleet, "sim-c1", f"{ALIVE} || echo 0 0").split() == ["2", "16.0"] and ssh(fleet, "sim-c1", health) == "200":
            break
    else:
        pytest.fail("the cluster did not heal within 300 s of a head restart")
    worker = ssh(fleet, "sim-c2", "journalctl -u ray-worker --no-pager")
    assert "this node has no raylet, but ray start --block still runs" in worker
    FIGURES.append(
        f"a restarted Ray head had its worker back and its instance serving after {time.monotonic() - started:.0f} s, with no deploy"
    )
    assert deploy().results["totals"]["success"] == 0
