#!/usr/bin/env python3
"""What the router's front costs a client: the same completions straight to vllm-router and through its front.

The pinned vllm-router (its wheel's files, as a router host gets them) runs as its unit runs it: the front on one
port, the launcher and the router behind it on another, with one worker: a stand-in that answers /health and a
small /v1/completions at once, so that the figures are the front's and the router's, not an engine's. Each client
request is a new connection (as the front allows: one request per connection), sequential, after a warm-up; the
runs alternate between the two paths. It prints the median and 99th percentile per path, and the difference.

Usage: .venv/bin/python benchmarks/router_front.py [--requests N] [--runs R]
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from instinct_fleet.converge import routerwheel, templating  # noqa: E402
from instinct_fleet.model import router  # noqa: E402

BODY = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1})


class Worker(http.server.BaseHTTPRequestHandler):
    """A stand-in instance: /health, /v1/models and a one-token completion, answered at once."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: with Nagle, each answer waits for a delayed ACK

    def _answer(self, payload: dict[str, object]) -> None:
        out = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:
        self._answer({"data": [{"id": "m"}]} if self.path == "/v1/models" else {})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer({"choices": [{"text": "x", "index": 0, "finish_reason": "length"}], "usage": {"completion_tokens": 1}})

    def log_message(self, *args: object) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one(port: int) -> float:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/completions", BODY, {"Content-Type": "application/json"})
    reply = conn.getresponse()
    reply.read()
    conn.close()
    assert reply.status == 200, reply.status
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="requests per path in each run")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    worker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Worker)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as scratch:
        here = Path(scratch)
        version = router.supported_versions()[-1]
        for name, data in routerwheel.members(version, None).items():
            (here / "release" / name).parent.mkdir(parents=True, exist_ok=True)
            (here / "release" / name).write_bytes(data)
        (here / "front.py").write_bytes(templating.template_bytes("router-front.py"))
        (here / "launch.py").write_bytes(templating.template_bytes("router-launch.py"))
        (here / "workers").write_text(f"http://127.0.0.1:{worker.server_port}\n")
        front, admin, metrics = free_port(), free_port(), free_port()
        options = ["--host", "127.0.0.1", "--port", str(admin), "--policy", "round_robin", "--prometheus-port", str(metrics)]
        command = [sys.executable, str(here / "front.py"), str(front), str(admin), "--", sys.executable, str(here / "launch.py")]
        proc = subprocess.Popen(
            [*command, str(here / "release"), str(here / "workers"), *options, *router.STARTUP],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            end = time.monotonic() + 60
            while True:
                try:
                    one(front)
                    break
                except (OSError, AssertionError):
                    assert time.monotonic() < end and proc.poll() is None, "the router did not serve within 60 s"
                    time.sleep(0.5)
            for port in (admin, front):
                for _ in range(50):  # warm-up
                    one(port)
            times: dict[str, list[float]] = {"router": [], "front": []}
            for _ in range(args.runs):
                for name, port in (("router", admin), ("front", front)):
                    times[name] += [one(port) for _ in range(args.requests)]
        finally:
            proc.terminate()
            proc.wait(30)
    worker.shutdown()
    row = {}
    for name, values in times.items():
        ordered = sorted(values)
        row[name] = (statistics.median(ordered) * 1000, ordered[int(0.99 * (len(ordered) - 1))] * 1000)
        print(f"{name:7s} {len(values)} requests: median {row[name][0]:.2f} ms, p99 {row[name][1]:.2f} ms")
    print(f"the front adds {row['front'][0] - row['router'][0]:.2f} ms at the median, {row['front'][1] - row['router'][1]:.2f} ms at p99")


if __name__ == "__main__":
    main()
