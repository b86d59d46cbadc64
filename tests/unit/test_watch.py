"""The watch: the progress rule (instinct_fleet/model/liveness.py), its config, its checks before any connection, and the
watch script itself (templates/watch.py) run against the stand-in vLLM, hung as vllm#39863's engine was."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from instinct_fleet.converge import content, evidence, gpuhealth, operations, system, templating
from instinct_fleet.model import knowledge, liveness, paths
from instinct_fleet.model.hostrules import GPU_RULES as GPU_RULE_TABLE
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.validate import validate_watch
from tests.unit import smi
from tests.unit.consumers import standin
from tests.unit.test_templates import parse_unit

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("0.11.0", "0.22.0", "0.33.0")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_shipped_table_names_the_series_the_rule_reads(version: str) -> None:
    names = liveness.series(knowledge.load(version).metrics)
    assert names == liveness.Series(
        ("vllm:iteration_tokens_total_count", "vllm:generation_tokens_total", "vllm:prompt_tokens_total"),
        ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    )


def test_a_table_without_the_gauges_or_any_step_counter_cannot_be_judged() -> None:
    table = knowledge.load("0.33.0").metrics
    assert liveness.series({k: v for k, v in table.items() if k != "vllm:num_requests_waiting"}) is None
    assert liveness.series({k: v for k, v in table.items() if k not in liveness.STEPS}) is None


def metrics(steps: float, running: float, waiting: float, engines: int = 1) -> str:
    """/metrics as vLLM writes it: one sample per engine label set."""
    lines = []
    for e in range(engines):
        labels = f'model_name="m",engine="{e}"'
        lines += [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {running}",
            f"vllm:num_requests_waiting{{{labels}}} {waiting}",
            f'vllm:iteration_tokens_total_bucket{{le="+Inf",{labels}}} {steps}',
            f"vllm:iteration_tokens_total_count{{{labels}}} {steps}",
            f"vllm:generation_tokens_total{{{labels}}} 0.0",
        ]
    return "\n".join(lines) + "\n"


NAMES = liveness.series(knowledge.load(VERSIONS[-1]).metrics)
KEY = "sk-watch-test"  # the engine's API key: /v1 answers 401 without it


def read(text: str) -> liveness.Sample:
    assert NAMES is not None
    reading = liveness.sample(text, NAMES)
    assert reading is not None
    return reading


def test_a_reading_sums_every_engine_and_refuses_what_it_cannot_judge() -> None:
    assert read(metrics(7, 2, 3, engines=2)) == liveness.Sample(steps=14.0, busy=10.0)
    assert NAMES is not None
    assert liveness.sample(metrics(7, 2, 3).replace("vllm:num_requests_waiting", "other"), NAMES) is None
    assert liveness.sample(metrics(7, 2, 3).replace('{model_name="m",engine="0"} 3', "{} x"), NAMES) is None
    assert liveness.sample("", NAMES) is None


def test_busy_without_a_step_is_a_stall_and_idle_or_stepping_is_not() -> None:
    p = liveness.Progress()
    assert p.observe(0, read(metrics(5, 0, 0))) == 0  # idle
    assert p.observe(100, read(metrics(5, 0, 0))) == 0  # idle for long: an idle engine takes no steps
    assert p.observe(105, read(metrics(5, 1, 2))) == 5  # busy from the last idle reading on, no step
    assert p.observe(130, read(metrics(5, 1, 2))) == 30
    assert liveness.stalled(p.observe(165, read(metrics(5, 0, 1))), 60)  # waiting alone is work too
    # The window is the verdict's edge: busy without a step for exactly the window is a stall, a moment less is not.
    assert liveness.stalled(60.0, 60) and not liveness.stalled(59.9, 60)
    assert p.observe(170, read(metrics(6, 1, 2))) == 0  # one step: progress
    assert p.observe(175, read(metrics(0, 1, 0))) == 0  # a restarted engine's counters start again: a change
    p.reset()
    assert p.observe(500, read(metrics(0, 1, 0))) == 0  # after a reset nothing is known yet


def specs(**data: Any) -> dict[str, Any]:
    hosts = [
        HostData("r1", (), {"router": True, "scrape_address": "10.1.0.1", "vllm_instances": []}),
        HostData("a", (), {"scrape_address": "10.1.0.2", "vllm_instances": [{"name": "one", "port": 8000}], **data}),
    ]
    return {str(s.host): (s, f) for s, f in plan_hosts(hosts)}


def test_the_config_gives_each_instance_its_gate_and_pools_and_the_routers_a_watch_list() -> None:
    found = specs(watch_stall_seconds=30, vllm_api_key_path="/etc/k")
    a, r1 = found["a"][0], found["r1"][0]
    config = json.loads(content.watch_config(a))
    assert NAMES is not None
    assert config["series"] == NAMES.as_json() and config["stall"] == 30
    # The key is read where the instance reads it, in its container: no inventory path, which a rollback leaves behind.
    assert "/etc/k" not in json.dumps(config) and config["key_in_container"] == paths.API_KEY_IN_CONTAINER
    assert config["state_dir"] == paths.WATCH_STATE and config["roll_marker"] == paths.ROLL_MARKER
    (one,) = config["instances"]
    assert one["unit"] == "vllm-one" and one["port"] == 8000 and one["generates"] is True
    assert one["routers"] == [{"router": "r1", "api": "http://10.1.0.1:31000", "url": "http://10.1.0.2:8000"}]
    assert r1.pools[0].watch_list == "http://10.1.0.2:8000 http://10.1.0.2:9401/state\n"
    # A host without the watch: the router's list leaves its workers out, and nothing is declared for it there.
    off = specs(watch=False)
    assert off["r1"][0].pools[0].watch_list == ""
    assert json.loads(content.watch_config(found["a"][0]))["listen_port"] == 9401


def test_the_watch_unit_runs_the_script_with_its_config_and_the_rule_is_the_package_s() -> None:
    unit = parse_unit(system.watch_unit(9401))
    assert dict(unit["Service"])["ExecStart"] == f"{paths.PYTHON3} {paths.WATCH_SCRIPT} {paths.WATCH_CONFIG}"
    assert dict(unit["Service"])["Restart"] == "always"
    assert (
        templating.watch_module("instinct_fleet.model", "liveness.py") == (ROOT / "instinct_fleet" / "model" / "liveness.py").read_bytes()
    )


def test_timing_the_watch_cannot_keep_and_a_table_it_cannot_read_are_refused_before_any_host() -> None:
    a = specs()["a"][0]
    assert validate_watch(a) == []
    assert [f.rule for f in validate_watch(dataclasses.replace(a, vars=a.vars.model_copy(update={"watch_interval": 60})))] == [
        "watch-timing"
    ]
    blind = dataclasses.replace(a, table=dataclasses.replace(a.table, metrics={}))
    (finding,) = validate_watch(blind)
    assert finding.rule == "watch-metrics" and finding.key == "watch" and f"vllm-facts {a.vars.vllm_version}" in finding.message
    assert validate_watch(dataclasses.replace(blind, vars=a.vars.model_copy(update={"watch": False}))) == []


def test_the_step_estimate_follows_the_model_size_and_gpus() -> None:
    long = {"vllm_args": {"enable-chunked-prefill": False, "max-model-len": 131072}}
    # gpt-oss-120b on one GPU: 250 TFLOP/s over 240 GFLOP a token, about 1042 tokens/s: 126 s for one whole prompt.
    (warned,) = [f for f in validate_watch(specs(**long)["a"][0])]
    assert warned.rule == "watch-stall-step" and "about 126 s at 1042 tokens/s" in warned.message
    # On 8 GPUs the same prompt takes 16 s; a stated rate replaces the estimate.
    eight = {**long, "vllm_instances": [{"name": "one", "port": 8000, "gpus": list(range(8)), "args": {"tensor-parallel-size": 8}}]}
    assert validate_watch(specs(**eight)["a"][0]) == []
    assert validate_watch(specs(**long, watch_prefill_tokens_per_second=20000)["a"][0]) == []


def test_the_roll_puts_back_only_what_the_watch_does_not_hold_unless_it_rolled_it() -> None:
    (membership,) = specs()["a"][0].memberships
    held = operations.worker_calls("add", (membership,))
    assert f"if [ -e {paths.watch_out('vllm-one')} ]" in held and "add_worker" in held
    fresh = operations.worker_calls("add", (membership,), frozenset({"vllm-one"}))
    assert fresh.startswith(f"rm -f {paths.watch_out('vllm-one')} {paths.watch_restarts('vllm-one')}; ")
    removed = operations.worker_calls("remove", (membership,))
    assert "if [ -e" not in removed and "--retry" not in removed  # a remove that cannot reach the router fails at once
    assert "--retry 30 --retry-delay 2 --retry-connrefused" in held  # a router restarted in this run may still be starting


# The watch script itself, on this machine: the stand-in vLLM served in this process, hung on demand.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def engine() -> Iterator[tuple[Any, int]]:
    module = standin()
    module.State.hung.clear()
    module.State.waiting = module.State.running = 0
    module.State.served, module.State.args = "m", {"--max-model-len": 4096, "--api-key": KEY}
    module.ENGINE[:] = [module.Engine({})]
    server = module.Server(("127.0.0.1", 0), module.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield module, server.server_address[1]
    module.State.hung.set()  # the requests still waiting stay so; the server stops taking new ones
    server.shutdown()


def start_watch(
    tmp_path: Path, port: int, max_restarts: int, gpu: dict[str, Any] | None = None, gpus: tuple[int, ...] = (4,)
) -> tuple[subprocess.Popen[str], int]:
    """The watch, started on the files :func:`watch_files` writes."""
    listen = watch_files(tmp_path, port, max_restarts, gpu, gpus)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "watch.py"), str(tmp_path / "watch.json")], stdout=subprocess.PIPE, text=True)
    return proc, listen


def watch_files(tmp_path: Path, port: int, max_restarts: int = 1, gpu: dict[str, Any] | None = None, gpus: tuple[int, ...] = (4,)) -> int:
    """The watch script and the two modules it imports, as the deploy installs them (managed.watch_entries), and its
    config for one instance on ``port``; the port it will listen on."""
    shutil.copy(ROOT / "instinct_fleet" / "templates" / "watch.py", tmp_path / "watch.py")
    (tmp_path / "liveness.py").write_bytes(templating.watch_module("instinct_fleet.model", "liveness.py"))
    (tmp_path / "evidence.py").write_bytes(templating.watch_module("instinct_fleet.converge", "evidence.py"))
    # docker as the watch calls it to read the instance's key in its container (the engine fixture's key).
    docker = tmp_path / "docker"
    want = f"exec vllm-absent cat {paths.API_KEY_IN_CONTAINER}"
    docker.write_text(f'#!/bin/sh\n[ "$*" = "{want}" ] && echo {KEY} && exit 0\nexit 1\n')
    docker.chmod(0o755)
    listen = free_port()
    assert NAMES is not None
    config = {
        "interval": 0.2,
        "stall": 1.5,
        "max_restarts": max_restarts,
        "window": 900,
        "listen_port": listen,
        "docker": str(docker),
        "key_in_container": paths.API_KEY_IN_CONTAINER,
        "series": NAMES.as_json(),
        "state_dir": str(tmp_path / "state"),
        "roll_marker": str(tmp_path / "roll-in-progress"),
        "roll_pause": 600,
        "tune_lock": str(tmp_path),
        "quarantine": str(tmp_path / "quarantine.json"),
        "gpu": gpu,
        "instances": [
            # No such unit here: systemctl's restart fails, and the watch goes on as after any restart.
            {
                "unit": "vllm-absent",
                "port": port,
                "served": "m",
                "generates": True,
                "start_seconds": 30,
                "routers": [],
                "gpus": list(gpus),
            }
        ],
    }
    (tmp_path / "watch.json").write_text(json.dumps(config))
    return listen


def state(listen: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{listen}/state", timeout=5) as reply:
        return dict(json.loads(reply.read()))


def wait_for(listen: int, want: str, seconds: float) -> dict[str, Any]:
    end = time.monotonic() + seconds
    while True:
        try:
            seen = state(listen)["instances"].get("vllm-absent", {})
            if seen.get("state") == want or time.monotonic() > end:
                return dict(seen)
        except OSError:
            if time.monotonic() > end:
                raise
        time.sleep(0.1)


def ask(port: int) -> None:
    body = json.dumps({"model": "m", "prompt": "one two", "max_tokens": 2}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, headers)
    with contextlib.suppress(OSError):
        urllib.request.urlopen(request, timeout=60).close()


def test_a_hung_engine_is_restarted_within_its_budget_then_left_out_and_an_operator_re_admits_it(
    tmp_path: Path, engine: tuple[Any, int]
) -> None:
    module, port = engine
    proc, listen = start_watch(tmp_path, port, max_restarts=1)
    try:
        assert wait_for(listen, "in", 10)["state"] == "in"
        ask(port)  # an engine that steps, with work: no stall
        time.sleep(2)
        assert state(listen)["out"] == [] and not (tmp_path / "state" / "vllm-absent.out").exists()
        # The engine hangs with a request waiting; /health still answers 200.
        module.State.hung.set()
        threading.Thread(target=ask, args=(port,), daemon=True).start()
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200
        # One restart (systemctl fails here, the engine stays hung), its gate's completion stalls, and the budget of 1
        # is spent: left out, in /state, in /metrics and in its file, whoever asks.
        seen = wait_for(listen, "left-out", 20)
        assert seen["state"] == "left-out" and seen["restarts"] == 1, seen
        assert "one-token completion made no engine step" in seen["reason"]
        assert state(listen)["out"] == [port]
        record = json.loads((tmp_path / "state" / "vllm-absent.out").read_text())
        assert record["state"] == "left-out"
        assert len(json.loads((tmp_path / "state" / "vllm-absent.restarts").read_text())) == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{listen}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        assert f'instinct_fleet_watch_left_out{{unit="vllm-absent",port="{port}"}} 1' in text
        assert f'instinct_fleet_watch_restarts_total{{unit="vllm-absent",port="{port}"}} 1' in text
        # Left out stays out: no further restart, however long it stays hung.
        time.sleep(2)
        assert len(json.loads((tmp_path / "state" / "vllm-absent.restarts").read_text())) == 1
        # The engine is fixed (here: it steps again, its stuck requests gone as a restart ends them), and the
        # operator removes the record: gated, then back in.
        module.State.hung.clear()
        module.State.waiting = module.State.running = 0
        (tmp_path / "state" / "vllm-absent.out").unlink()
        assert wait_for(listen, "in", 20)["state"] == "in"
        assert state(listen)["out"] == []
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert "<3>vllm-absent is left out of its router pools" in out
    assert "re-admitted by an operator" in out and "its gate passed after the restart" in out


def test_the_watch_only_reads_while_a_roll_runs_on_the_host(tmp_path: Path, engine: tuple[Any, int]) -> None:
    module, port = engine
    (tmp_path / "roll-in-progress").write_text("roll batch 1\n")
    proc, listen = start_watch(tmp_path, port, max_restarts=3)
    try:
        module.State.hung.set()
        threading.Thread(target=ask, args=(port,), daemon=True).start()
        seen = wait_for(listen, "paused", 10)
        time.sleep(3)  # twice the stall window
        assert state(listen)["instances"]["vllm-absent"]["state"] == "paused" and seen["reason"] == "a roll batch runs on this host"
        assert not (tmp_path / "state" / "vllm-absent.restarts").exists()
        # A marker older than roll_pause is a failed roll's, left behind: the watch acts again.
        os.utime(tmp_path / "roll-in-progress", (time.time() - 601, time.time() - 601))
        assert wait_for(listen, "left-out", 20)["state"] == "left-out"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def events(listen: int) -> dict[str, int]:
    text = watch_metrics(listen)
    return {k: int(v) for k, v in re.findall(r"^instinct_fleet_watch_(rolls|canaries|rollbacks)_total (\d+)$", text, re.M)}


def test_the_watch_counts_the_roll_s_batches_canaries_and_rollbacks_from_its_marker(tmp_path: Path, engine: tuple[Any, int]) -> None:
    """What the boards annotate: each batch once, its canary and its rollback once each, a tune trial's marker not."""
    _, port = engine
    marker = tmp_path / "roll-in-progress"
    proc, listen = start_watch(tmp_path, port, max_restarts=3)
    try:
        assert wait_for(listen, "in", 10)["state"] == "in"
        assert events(listen) == {"rolls": 0, "canaries": 0, "rollbacks": 0}
        marker.write_text("roll batch 1 started 2026-11-28T10:00:00Z\ncanary\n")
        time.sleep(1)  # several readings of the same marker: counted once
        marker.write_text("roll batch 1 started 2026-11-28T10:00:00Z\ncanary\nrolled back to generation 3\n")
        time.sleep(1)
        marker.unlink()  # the restore's end
        time.sleep(0.5)
        marker.write_text("roll batch 2 started 2026-11-28T10:05:00Z\n")  # the next batch, no canary there
        time.sleep(1)
        marker.write_text("tune trial 2 of 6 on vllm-main\n")
        time.sleep(1)
        assert events(listen) == {"rolls": 2, "canaries": 1, "rollbacks": 1}
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def watch_metrics(listen: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{listen}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def test_a_quarantined_instance_is_out_and_left_alone_until_its_record_lets_it_go(tmp_path: Path, engine: tuple[Any, int]) -> None:
    """The deploy's GPU health record (converge/gpuhealth.py) holds it out: /state lists it out (the pool sync adds
    no worker held out), and a hung engine under it is not restarted; once the record lets it go, the watch judges it."""
    module, port = engine
    (tmp_path / "quarantine.json").write_text(
        json.dumps({"units": {"vllm-absent": ["GPU 4: 2 uncorrectable ECC error(s) [gpu-ecc-uncorrectable]"]}})
    )
    proc, listen = start_watch(tmp_path, port, max_restarts=1)
    try:
        seen = wait_for(listen, "quarantined", 10)
        assert seen["state"] == "quarantined" and "GPU 4" in seen["reason"] and state(listen)["out"] == [port]
        module.State.hung.set()
        threading.Thread(target=ask, args=(port,), daemon=True).start()
        time.sleep(3)  # twice the stall window
        assert state(listen)["instances"]["vllm-absent"]["state"] == "quarantined"
        assert not (tmp_path / "state" / "vllm-absent.restarts").exists()
        (tmp_path / "quarantine.json").write_text(json.dumps({"units": {}, "readmitted": [1]}))
        assert wait_for(listen, "left-out", 20)["state"] == "left-out"  # judged again: hung, restarted once, left out
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_a_unit_s_watch_files_are_the_same_with_or_without_service() -> None:
    assert paths.watch_out("vllm-a.service") == paths.watch_out("vllm-a") == f"{paths.WATCH_STATE}/vllm-a.out"
    assert paths.watch_restarts("vllm-a.service") == paths.watch_restarts("vllm-a") == f"{paths.WATCH_STATE}/vllm-a.restarts"


class _Api(BaseHTTPRequestHandler):
    """A worker API as vllm-router answers it (list_workers, add_worker), a worker's /health, and a watch's /state,
    for the sync script's decisions: which listed worker it adds."""

    calls: ClassVar[list[str]] = []
    out: ClassVar[list[int]] = []
    live: ClassVar[list[str]] = []  # the router's pool, as /list_workers answers it

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply({"urls": self.live} if self.path == "/list_workers" else {"out": self.out} if self.path == "/state" else {})

    def do_POST(self) -> None:
        self.calls.append(self.path)
        self._reply({})


def test_the_pool_sync_adds_no_worker_its_watch_holds_out(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        # Two workers answer /health (both are this server); the watch of the first holds it out.
        first, second = f"http://127.0.0.1:{port}", f"http://localhost:{port}"
        workers, watches = tmp_path / "w", tmp_path / "watch"
        workers.write_text(f"{first}\n{second}\n")
        watches.write_text(f"{first} http://127.0.0.1:{port}/state\n")
        _Api.out = [port]
        sync = [sys.executable, str(ROOT / "instinct_fleet" / "templates" / "router-sync.py"), str(port), str(workers), str(watches)]
        check = subprocess.run([*sync, "--check"], capture_output=True, text=True)
        assert (check.returncode, check.stdout) == (1, f"add {second}\n")
        _Api.calls.clear()
        assert subprocess.run(sync, capture_output=True, text=True).returncode == 0
        assert [c.split("?")[0] for c in _Api.calls] == ["/add_worker"] and "localhost" in _Api.calls[0]
        # Not held out any more, or no watch file yet (a router host upgraded from before the watch): both are added.
        _Api.out = []
        assert subprocess.run([*sync, "--check"], capture_output=True, text=True).stdout == f"add {first}\nadd {second}\n"
        watches.unlink()
        _Api.out = [port]
        assert subprocess.run([*sync, "--check"], capture_output=True, text=True).stdout == f"add {first}\nadd {second}\n"
    finally:
        server.shutdown()


def test_the_pool_sync_never_adds_a_joining_worker_and_takes_it_out_of_the_router(tmp_path: Path) -> None:
    """A worker whose unit was not running at preflight (its host failed halfway through its last deploy) may answer
    /health from someone else's listener: the sync neither adds it nor leaves it in the pool; its roll adds it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        mine, theirs, listed = f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}"
        workers, watches = tmp_path / "w", tmp_path / "watch"
        workers.write_text(f"{mine}\n{theirs}\n{listed}\n")
        _Api.out, _Api.live = [], [listed]
        sync = [sys.executable, str(ROOT / "instinct_fleet" / "templates" / "router-sync.py"), str(port), str(workers), str(watches)]
        sync += ["--joining", theirs, "--joining", listed]
        check = subprocess.run([*sync, "--check"], capture_output=True, text=True)
        assert (check.returncode, check.stdout) == (1, f"remove {listed}\nadd {mine}\n")
        _Api.calls.clear()
        assert subprocess.run(sync, capture_output=True, text=True).returncode == 0
        assert sorted(c.split("?")[0] for c in _Api.calls) == ["/add_worker", "/remove_worker"]
        assert "127.0.0.1" in next(c for c in _Api.calls if c.startswith("/add")) and "%3A%3A1" in _Api.calls[0] + _Api.calls[1]
    finally:
        _Api.live = []
        server.shutdown()


def test_the_pool_sync_waits_for_a_router_that_is_starting_when_asked_and_only_then(tmp_path: Path) -> None:
    """After the router stage (re)started a router, it read every worker of its file: the sync waits for its API to
    take out the joining ones. Without --wait, a router that is not running is left to its file at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workers, watches = tmp_path / "w", tmp_path / "watch"
    joining = f"http://localhost:{port}"
    workers.write_text(f"{joining}\n")
    sync = [sys.executable, str(ROOT / "instinct_fleet" / "templates" / "router-sync.py"), str(port), str(workers), str(watches)]
    sync += ["--joining", joining]
    started = time.monotonic()
    assert "is not running" in subprocess.run(sync, capture_output=True, text=True, timeout=30).stdout
    assert time.monotonic() - started < 10
    waiting = subprocess.Popen([*sync, "--wait"], stdout=subprocess.PIPE, text=True)
    time.sleep(2)
    _Api.live, _Api.out = [joining], []
    _Api.calls.clear()
    server = ThreadingHTTPServer(("127.0.0.1", port), _Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out, _ = waiting.communicate(timeout=30)
        assert waiting.returncode == 0 and out == f"remove {joining}\n"
        assert [c.split("?")[0] for c in _Api.calls] == ["/remove_worker"]
    finally:
        _Api.live = []
        server.shutdown()


def test_the_watch_s_modules_use_the_standard_library_alone() -> None:
    """The watch imports them on the host, with the host's python3 and no package installed."""
    for module in ("model/liveness.py", "converge/evidence.py"):
        tree = ast.parse((ROOT / "instinct_fleet" / module).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert {name.split(".")[0] for name in names} <= set(sys.stdlib_module_names), (module, names)


def test_the_config_judges_gpus_by_the_host_s_thresholds_and_severities() -> None:
    config = json.loads(content.watch_config(specs(gpu_health_pcie_width=8, gpu_health_levels={"gpu-pcie-speed": "warning"})["a"][0]))
    assert config["instances"][0]["gpus"] == [0]
    gpu = config["gpu"]
    assert gpu["interval"] == 30 and gpu["amd_smi"] == "amd-smi"
    assert gpu["thresholds"] == {"pcie_width": 8, "pcie_speed": 32.0, "recovery_error": 3, "recovery_warning": 1, "bad_page_warning": 0.9}
    assert set(gpu["levels"]) == set(evidence.PER_GPU_RULES)
    assert gpu["levels"]["gpu-pcie-speed"] == "warning" and gpu["levels"]["gpu-ecc-uncorrectable"] == "error"
    assert gpu["levels"]["gpu-ecc-correctable"] == "warning"
    assert json.loads(content.watch_config(specs(gpu_health=False)["a"][0]))["gpu"] is None


def test_the_per_gpu_rules_are_the_rules_table_s() -> None:
    """Each rule evidence.trips can name is a gpu-* rule of the table, and every rule of the table that reads one GPU
    alone is one of them (the rest need the host or the fleet: gpuhealth.judge)."""
    host_wide = {"gpu-node-mismatch", "gpu-fleet-drift", "gpu-fleet-split", "gpu-evidence"}
    assert set(evidence.PER_GPU_RULES) == {r.id for r in GPU_RULE_TABLE} - host_wide


def amd_smi(tmp_path: Path, faults: dict[str, Any] | None) -> str:
    """An amd-smi for the watch: the fleet's stand-in on the captured MI300X output, with this fault file."""
    data = Path(smi.data())
    (tmp_path / "faults.json").write_text(json.dumps(faults or {}))
    command = tmp_path / "amd-smi"
    command.write_text(
        f'#!/bin/sh\nSTANDIN_AMD_SMI_DATA={data} STANDIN_AMD_SMI_FAULTS={tmp_path / "faults.json"} exec {sys.executable} {smi.STANDIN} "$@"\n'
    )
    command.chmod(0o755)
    return str(command)


def test_an_error_on_its_gpu_quarantines_an_instance_at_once_until_the_deploy_lets_it_go(tmp_path: Path, engine: tuple[Any, int]) -> None:
    _, port = engine
    levels = {rule: gpuhealth.level(rule, {}) for rule in evidence.PER_GPU_RULES}
    thresholds = dataclasses.asdict(gpuhealth.thresholds(specs()["a"][0].vars))
    # An uncorrectable error on GPU 5, which it does not run on, and a correctable one (a warning) on its GPU 4.
    gpu = {"interval": 0.3, "amd_smi": amd_smi(tmp_path, {"gpus": {"5": {"uncorrectable": 1}, "4": {"correctable": 3}}})}
    proc, listen = start_watch(tmp_path, port, max_restarts=1, gpu={**gpu, "levels": levels, "thresholds": thresholds})
    try:
        assert wait_for(listen, "in", 10)["state"] == "in"
        time.sleep(2)  # several readings
        assert state(listen)["instances"]["vllm-absent"]["state"] == "in" and state(listen)["out"] == []
        # Two uncorrectable errors in GPU 4's memory: out at the next reading, with the deploy's own words.
        (tmp_path / "faults.json").write_text(json.dumps({"gpus": {"4": {"uncorrectable": 2, "block": "UMC"}}}))
        seen = wait_for(listen, "quarantined", 30)
        assert seen["state"] == "quarantined", seen
        assert "GPU 4: 2 uncorrectable ECC error(s) (blocks: UMC 2)" in seen["reason"] and "[gpu-ecc-uncorrectable]" in seen["reason"]
        assert state(listen)["out"] == [port]
        record = json.loads((tmp_path / "state" / "vllm-absent.out").read_text())
        assert record["state"] == "quarantined" and "GPU 4: 2 uncorrectable" in record["reason"]
        with urllib.request.urlopen(f"http://127.0.0.1:{listen}/metrics", timeout=5) as reply:
            assert f'instinct_fleet_watch_quarantined{{unit="vllm-absent",port="{port}"}} 1' in reply.read().decode()
        # The error clears (a reset): it stays out, stopped, until the deploy starts it behind its gate and its join
        # removes the record, which the watch then judges as any other instance.
        (tmp_path / "faults.json").write_text("{}")
        deadline = time.monotonic() + 30  # a reading runs the stand-in amd-smi four times: seconds on a loaded machine
        while (
            "its evidence has cleared" not in (seen := state(listen)["instances"]["vllm-absent"])["reason"] and time.monotonic() < deadline
        ):
            assert seen["state"] == "quarantined", seen
            time.sleep(0.2)
        assert seen["state"] == "quarantined" and "its evidence has cleared" in seen["reason"], seen
        (tmp_path / "state" / "vllm-absent.out").unlink()
        assert wait_for(listen, "in", 10)["state"] == "in"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert "<3>vllm-absent is quarantined: GPU 4: 2 uncorrectable ECC error(s)" in out, out
    assert "systemctl stop failed" in out  # it stopped it (no such unit here)
    assert "GPU 4: its evidence has cleared" in out


def test_a_reading_older_than_the_deploy_s_re_admission_is_read_again_before_the_watch_acts(
    tmp_path: Path, engine: tuple[Any, int]
) -> None:
    """The deploy re-admits the instance on evidence that has cleared (its join removes the record) while the watch's
    last reading still shows the error: the watch reads again before it quarantines, and lets it serve."""
    _, port = engine
    levels = {rule: gpuhealth.level(rule, {}) for rule in evidence.PER_GPU_RULES}
    thresholds = dataclasses.asdict(gpuhealth.thresholds(specs()["a"][0].vars))
    fault = amd_smi(tmp_path, {"gpus": {"4": {"uncorrectable": 1}}})
    gpu = {"interval": 600, "amd_smi": fault, "levels": levels, "thresholds": thresholds}  # one reading, at start
    proc, listen = start_watch(tmp_path, port, max_restarts=1, gpu=gpu)
    try:
        assert wait_for(listen, "quarantined", 30)["state"] == "quarantined"
        (tmp_path / "faults.json").write_text("{}")  # a reset; the deploy reads it, starts the unit, joins its pools
        (tmp_path / "state" / "vllm-absent.out").unlink()
        assert wait_for(listen, "in", 30)["state"] == "in"
        time.sleep(1)
        assert state(listen)["instances"]["vllm-absent"]["state"] == "in" and not (tmp_path / "state" / "vllm-absent.out").exists()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert out.count("is quarantined") == 1 and "GPU 4: its evidence has cleared" in out, out


def test_a_host_that_lowers_a_rule_keeps_the_instance_and_a_host_without_amd_smi_judges_nothing(
    tmp_path: Path, engine: tuple[Any, int]
) -> None:
    _, port = engine
    levels = {**{rule: gpuhealth.level(rule, {}) for rule in evidence.PER_GPU_RULES}, "gpu-pcie-width": "warning"}
    thresholds = dataclasses.asdict(gpuhealth.thresholds(specs()["a"][0].vars))
    fault = amd_smi(tmp_path, {"gpus": {"4": {"width": 8}}})
    gpu = {"interval": 0.3, "amd_smi": fault, "levels": levels, "thresholds": thresholds}
    proc, listen = start_watch(tmp_path, port, max_restarts=1, gpu=gpu)
    try:
        assert wait_for(listen, "in", 10)["state"] == "in"
        time.sleep(2)
        assert state(listen)["instances"]["vllm-absent"]["state"] == "in"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    # No amd-smi on the host: nothing read, nothing held out, and the watch keeps running.
    proc, listen = start_watch(tmp_path, port, max_restarts=1, gpu={**gpu, "amd_smi": str(tmp_path / "absent")})
    try:
        assert wait_for(listen, "in", 10)["state"] == "in"
        time.sleep(1.5)
        assert state(listen)["instances"]["vllm-absent"]["state"] == "in" and proc.poll() is None
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_the_gate_passes_only_when_its_completion_moved_a_step_counter(tmp_path: Path) -> None:
    """An engine that answers the gate's one-token completion while its step counters stand still (an answer that is
    not the engine's: a cache, a proxy, a stale /metrics) is stalled, not passed; one whose counters move passes."""
    assert NAMES is not None
    stepped = {"steps": 7.0}

    class Fake(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def reply(self, body: str) -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                lines = [f"{NAMES.steps[0]} {stepped['steps']}", *(f"{b} 0" for b in NAMES.busy)]
                self.reply("\n".join(lines) + "\n")
            else:
                self.reply(json.dumps({"data": [{"id": "m"}]}))

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            stepped["steps"] += stepped.get("advance", 0.0)
            self.reply(json.dumps({"choices": [{"text": "x"}]}))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        watch_files(tmp_path, server.server_address[1])
        probe = (
            "import importlib.util, sys\n"
            f"sys.argv = ['watch.py', {str(tmp_path / 'watch.json')!r}]\n"
            f"spec = importlib.util.spec_from_file_location('watch', {str(tmp_path / 'watch.py')!r})\n"
            "watch = importlib.util.module_from_spec(spec); spec.loader.exec_module(watch)\n"
            "print(watch.Instance(watch.CONFIG['instances'][0]).gate())\n"
        )
        still = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert still.stdout.strip() == "stalled", still.stderr[-2000:]
        stepped["advance"] = 1.0
        moving = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert moving.stdout.strip() == "passed", moving.stderr[-2000:]
    finally:
        server.shutdown()
