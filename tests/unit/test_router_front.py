"""The router's front (templates/router-front.py): clients reach the OpenAI routes alone, never the worker API.

First against a recording stand-in for the router, to see exactly what reaches it (bodies, a request smuggled behind
a checked one, a client that goes away); then in front of the real vllm-router of the pinned wheel, which serves its
worker API on the port the front keeps from clients.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from instinct_fleet.converge import routerwheel, templating
from instinct_fleet.model import router


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The front and the launcher, as the deploy writes them to a router host."""
    here = tmp_path_factory.mktemp("scripts")
    (here / "front.py").write_bytes(templating.template_bytes("router-front.py"))
    (here / "launch.py").write_bytes(templating.template_bytes("router-launch.py"))
    return here / "front.py", here / "launch.py"


# A stand-in router: writes each request line and body it gets to a log, answers 200 with the path, streams slowly
# on /v1/chat/completions (so a client that leaves mid-answer can be seen ending the request here).
RECORDER = r"""
import http.server, sys, time
log = open(sys.argv[2], "a", buffering=1)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_one_request(self):
        super().handle_one_request()
    def do(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode() if n else ""
        log.write(f"{self.command} {self.path} {body!r} conn={self.headers.get('Connection')}\n")
        if self.path == "/v1/chat/completions":
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
            for i in range(50):
                try:
                    self.wfile.write(f"data: {i}\n\n".encode()); self.wfile.flush()
                except OSError:
                    log.write("client gone\n"); return
                time.sleep(0.1)
            log.write("stream done\n"); return
        out = f"router saw {self.path}".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers(); self.wfile.write(out)
    do_GET = do_POST = do
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes], seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port} after {seconds}s")


def raw(port: int, data: bytes, seconds: float = 10) -> bytes:
    """Send ``data`` as is and read the whole answer (the front closes after one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, scripts: tuple[Path, Path]) -> Iterator[tuple[int, Path, subprocess.Popen[bytes]]]:
    FRONT = scripts[0]
    here = tmp_path_factory.mktemp("front")
    (here / "recorder.py").write_text(RECORDER)
    log = here / "seen.log"
    log.touch()
    front, upstream = free_port(), free_port()
    command = [
        sys.executable,
        str(FRONT),
        str(front),
        str(upstream),
        "--",
        sys.executable,
        str(here / "recorder.py"),
        str(upstream),
        str(log),
    ]
    proc = subprocess.Popen(command)
    try:
        wait_listening(front, proc)
        wait_listening(upstream, proc)
        yield front, log, proc
    finally:
        proc.terminate()
        proc.wait(10)


def seen(log: Path) -> list[str]:
    return log.read_text().splitlines()


def test_the_openai_routes_pass_with_their_bodies_and_one_request_per_connection(
    recorded: tuple[int, Path, subprocess.Popen[bytes]],
) -> None:
    port, log, _ = recorded
    before = len(seen(log))
    body = json.dumps({"model": "m", "prompt": "hi"})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/completions?x=1", body, {"Content-Type": "application/json", "Authorization": "Bearer k"})
    reply = conn.getresponse()
    assert reply.status == 200 and reply.read() == b"router saw /v1/completions?x=1"
    conn.close()
    for path in ("/health", "/v1/models"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path)
        assert conn.getresponse().status == 200
        conn.close()
    assert seen(log)[before:] == [
        f"POST /v1/completions?x=1 {body!r} conn=close",
        "GET /health '' conn=close",
        "GET /v1/models '' conn=close",
    ]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/add_worker?url=http://10.9.9.9:8099"),
        ("POST", "/remove_worker?url=http://10.0.0.2:8080"),
        ("GET", "/list_workers"),
        ("GET", "/workers"),
        ("POST", "/flush_cache"),
        ("GET", "/get_loads"),
        ("GET", "/v1/../list_workers"),
        ("POST", "/%61dd_worker?url=http://10.9.9.9:8099"),
        ("POST", "//add_worker?url=http://10.9.9.9:8099"),
        ("GET", "/v1/completions"),  # a client route, with another method
        ("POST", "/tokenize"),  # vLLM answers it without the key: never through the router
        ("POST", "/invocations"),
    ],
)
def test_every_other_route_is_answered_404_by_the_front_and_never_reaches_the_router(
    recorded: tuple[int, Path, subprocess.Popen[bytes]], method: str, path: str
) -> None:
    port, log, _ = recorded
    before = len(seen(log))
    answer = raw(port, f"{method} {path} HTTP/1.1\r\nHost: r\r\nContent-Length: 0\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 404 "), answer[:200]
    assert b"is not a route of this router's clients" in answer
    assert seen(log)[before:] == []


def test_a_request_smuggled_behind_a_checked_one_never_reaches_the_router(recorded: tuple[int, Path, subprocess.Popen[bytes]]) -> None:
    port, log, _ = recorded
    before = len(seen(log))
    second = b"POST /add_worker?url=http://10.9.9.9:8099 HTTP/1.1\r\nHost: r\r\nContent-Length: 0\r\n\r\n"
    # Pipelined after a complete request, and hidden in a body that is longer than its Content-Length.
    raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\n{}" + second)
    raw(port, b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n" + second)
    got = seen(log)[before:]
    assert got == ["POST /v1/completions '{}' conn=close", "GET /health '' conn=close"], got
    # Framing a front could read otherwise than the router: refused, not passed.
    chunked = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + second)
    assert chunked.startswith(b"HTTP/1.1 411 ")
    twice = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}")
    assert twice.startswith(b"HTTP/1.1 400 ")
    folded = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n Content-Length: 2\r\n\r\n{}")
    assert folded.startswith(b"HTTP/1.1 400 ")
    assert b"add_worker" not in log.read_bytes()


def test_a_client_that_goes_away_ends_its_request_at_the_router(recorded: tuple[int, Path, subprocess.Popen[bytes]]) -> None:
    port, log, _ = recorded
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")  # answered by the front, which reads the body first
        s.sendall(b"{}")
        got = b""
        while b"data: 0" not in got:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
    end = time.monotonic() + 10
    while "client gone" not in seen(log) and time.monotonic() < end:
        time.sleep(0.1)
    assert "client gone" in seen(log) and "stream done" not in seen(log)


def test_the_front_ends_with_its_router(scripts: tuple[Path, Path]) -> None:
    """The router exits: the front exits with its status (systemd restarts the unit). SIGTERM: passed on, and the front
    ends by the signal, which systemd counts as a clean stop."""
    FRONT = scripts[0]
    front = free_port()
    done = subprocess.run([sys.executable, str(FRONT), str(front), "1", "--", sys.executable, "-c", "raise SystemExit(3)"], timeout=30)
    assert done.returncode == 3
    proc = subprocess.Popen([sys.executable, str(FRONT), str(front), "1", "--", sys.executable, "-c", "import time; time.sleep(60)"])
    wait_listening(front, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM


def test_in_front_of_the_real_router_the_worker_api_is_on_its_own_port_alone(tmp_path: Path, scripts: tuple[Path, Path]) -> None:
    """The pinned vllm-router, started as the unit starts it (the front, then the launcher with its release's files):
    its worker API answers on the admin port, and on the clients' port only 404; an OpenAI route reaches it."""
    FRONT, LAUNCHER = scripts
    version = router.supported_versions()[-1]
    release = tmp_path / "release"
    for name, data in routerwheel.members(version, None).items():
        (release / name).parent.mkdir(parents=True, exist_ok=True)
        (release / name).write_bytes(data)
    workers = tmp_path / "workers"
    workers.write_text("")
    front, admin, metrics = free_port(), free_port(), free_port()
    options = ["--host", "127.0.0.1", "--port", str(admin), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
    command = [sys.executable, str(FRONT), str(front), str(admin), "--", sys.executable, str(LAUNCHER), str(release), str(workers)]
    proc = subprocess.Popen([*command, *options, *router.STARTUP], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(admin, proc, 60)

        def call(port: int, method: str, path: str, body: str = "") -> tuple[int, str]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
            conn.request(method, path, body or None, {"Content-Type": "application/json"} if body else {})
            reply = conn.getresponse()
            out = reply.status, reply.read().decode()
            conn.close()
            return out

        listed = call(admin, "GET", "/list_workers")
        assert listed[0] == 200 and json.loads(listed[1])["urls"] == [], listed
        assert call(front, "POST", "/add_worker?url=http://127.0.0.1:9")[0] == 404
        assert call(front, "GET", "/list_workers")[0] == 404
        assert json.loads(call(admin, "GET", "/list_workers")[1])["urls"] == []
        # A client route reaches the router, which answers it (no worker: not the front's 404).
        status, text = call(front, "POST", "/v1/completions", json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}))
        assert status != 404 and "not a route of this router's clients" not in text, (status, text)
        assert call(front, "GET", "/health")[0] != 404
    finally:
        proc.terminate()
        assert proc.wait(30) == -signal.SIGTERM
