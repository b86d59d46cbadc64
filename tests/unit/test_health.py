"""The health wait: its output parsed, and the verdict the deploy fails a host with."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from instinct_fleet.converge import health

MODELS = '{"object": "list", "data": [{"id": "openai/gpt-oss-120b", "object": "model"}]}'


def text(**parts: str) -> str:
    return "".join(f"{health.MARK}{name}\n{value}\n" for name, value in parts.items())


def test_healthy_instance_serving_its_model() -> None:
    result = health.parse(text(code="200", state="healthy", models=MODELS))
    assert result.models == ("openai/gpt-oss-120b",)
    assert health.verdict("vllm-main.service", 8080, "openai/gpt-oss-120b", result) is None


def test_healthy_but_serving_another_model() -> None:
    result = health.parse(text(code="200", state="healthy", models=MODELS))
    message = health.verdict("vllm-main.service", 8080, "meta-llama/Llama-3.1-70B-Instruct", result)
    assert message == (
        "vllm-main.service: /health answers on :8080 but /v1/models lists ['openai/gpt-oss-120b'], not 'meta-llama/Llama-3.1-70B-Instruct'"
    )


def test_crash_loop_reports_the_journal() -> None:
    journal = "usage: vllm serve [model_tag] [options]\nvllm serve: error: unrecognized arguments: --foo"
    result = health.parse(text(code="000", state="unit restarted while starting (crash loop)", journal=journal))
    message = health.verdict("vllm-main.service", 8080, "m", result)
    assert message is not None
    assert message.startswith("vllm-main.service: not healthy on :8080: unit restarted while starting (crash loop)")
    assert "unrecognized arguments: --foo" in message and "journalctl -u vllm-main.service" in message


def test_garbage_model_listing_is_not_healthy() -> None:
    result = health.parse(text(code="200", state="healthy", models="<html>proxy error</html>"))
    assert result.models == ()
    assert health.verdict("u", 1, "m", result) is not None


def test_wait_script_checks_health_models_and_the_unit() -> None:
    script = health.wait_script("vllm-a b.service", 8001, "org/model", 60)
    assert "http://127.0.0.1:8001/health" in script and "http://127.0.0.1:8001/v1/models" in script
    assert "'vllm-a b.service'" in script  # quoted for the shell
    assert "no answer within 60s (health_timeout)" in script


def _server(models: list[str], health_code: int, completion_code: int = 200, key: str | None = None) -> ThreadingHTTPServer:
    """A loopback HTTP server answering /health, /v1/models and /v1/completions as vLLM's API server does:
    with ``key`` (``--api-key``), /v1 answers 401 without its bearer header. It records the paths it was asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self, code: int, body: bytes) -> None:
            if key is not None and self.path.startswith("/v1/") and self.headers.get("Authorization") != f"Bearer {key}":
                code, body = 401, b'{"error": "Unauthorized"}'
            asked.append(self.path)
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer(health_code, b"")
            elif self.path == "/v1/models":
                self.answer(200, json.dumps({"object": "list", "data": [{"id": m} for m in models]}).encode())
            else:
                self.answer(404, b"")

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            if self.path != "/v1/completions" or request.get("max_tokens") != 1 or request.get("model") not in models:
                self.answer(400, b"{}")
            elif completion_code != 200:
                self.answer(completion_code, json.dumps({"error": {"message": "EngineCore encountered an issue"}}).encode())
            else:
                self.answer(200, json.dumps({"choices": [{"index": 0, "text": " world"}]}).encode())

        def log_message(self, *_args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.asked = asked  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(
    ("models", "code", "completion", "healthy"),
    [
        (["org/model"], 200, 200, True),
        (["org/other"], 200, 200, False),
        (["org/model"], 503, 200, False),
        (["org/model-2"], 200, 200, False),
        (["org/model"], 200, 500, False),  # answers /health and lists the model, but cannot generate
    ],
)
def test_serving_is_health_200_the_model_listed_and_one_token(models: list[str], code: int, completion: int, healthy: bool) -> None:
    """The one definition of healthy, run by bash and curl against a real socket."""
    server = _server(models, code, completion)
    try:
        result = subprocess.run(["bash", "-c", health.serving(server.server_port, "org/model", None)], check=False)
        assert (result.returncode == 0) == healthy
    finally:
        server.shutdown()


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_serving_sends_the_api_key_from_its_file_and_never_in_argv(tmp_path: Path, shell: str) -> None:
    """With vllm_api_key_path, /v1 answers only with the key; it goes to curl on stdin (a process list never
    shows it). A missing or wrong key file is not healthy; /health never needed it."""
    server = _server(["org/model"], 200, key="s3cret")
    key_file = tmp_path / "api-key"
    try:
        key_file.write_text("s3cret\n")
        command = health.serving(server.server_port, "org/model", str(key_file))
        assert "s3cret" not in command
        assert subprocess.run([shell, "-c", command], check=False).returncode == 0
        assert server.asked == ["/health", "/v1/models", "/v1/completions"]  # type: ignore[attr-defined]
        models = f"http://127.0.0.1:{server.server_port}/v1/models"  # the gate's and verify's listing: the same key
        listed = subprocess.run([shell, "-c", health.v1_curl(models, str(key_file), 5)], capture_output=True, text=True, check=False)
        assert listed.returncode == 0 and '"org/model"' in listed.stdout
        refused = health.v1_curl(models, None, 5, show_code=True)  # the answer whatever its code, as the gate keeps it
        assert subprocess.run([shell, "-c", refused], capture_output=True, text=True, check=False).stdout.endswith("(HTTP 401)")
        key_file.write_text("wrong")  # no newline at its end: read still takes it, and it is refused
        assert subprocess.run([shell, "-c", command], check=False).returncode != 0
        key_file.unlink()
        assert subprocess.run([shell, "-c", command], check=False).returncode != 0
    finally:
        server.shutdown()


def test_serving_stops_at_the_first_failed_answer() -> None:
    """One curl, --fail-early: a failed /health asks nothing more (a completion costs a real instance a forward pass)."""
    server = _server(["org/model"], 503)
    try:
        assert subprocess.run(["sh", "-c", health.serving(server.server_port, "org/model", None)], check=False).returncode != 0
        assert server.asked == ["/health"]  # type: ignore[attr-defined]
    finally:
        server.shutdown()


def test_a_pooling_model_is_healthy_without_a_completion() -> None:
    server = _server(["org/model"], 200, 404)
    try:
        assert (
            subprocess.run(["bash", "-c", health.serving(server.server_port, "org/model", None, generates=False)], check=False).returncode
            == 0
        )
        assert subprocess.run(["bash", "-c", health.serving(server.server_port, "org/model", None)], check=False).returncode != 0
    finally:
        server.shutdown()


def test_the_gate_names_a_failed_first_completion_with_its_answer() -> None:
    """The wait script, on a unit that does not exist (systemctl answers empty) and an instance whose first
    completion fails: it stops with the answer (HTTP code and body), instead of waiting out health_timeout."""
    server = _server(["org/model"], 200, 500)
    try:
        script = health.wait_script("instinct-fleet-test-none.service", server.server_port, "org/model", 60)
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, check=False)
        result = health.parse(done.stdout)
        problem = health.verdict("vllm-main.service", server.server_port, "org/model", result)
        assert problem is not None and "its first completion failed" in problem and "HTTP 500" in problem and "EngineCore" in problem
    finally:
        server.shutdown()


def test_nothing_listening_is_not_healthy() -> None:
    server = _server([], 200)
    port = server.server_port
    server.shutdown()
    server.server_close()
    assert subprocess.run(["bash", "-c", health.serving(port, "org/model", None)], check=False).returncode != 0


def test_a_unit_waiting_to_restart_fails_the_gate_at_once(tmp_path: Path) -> None:
    """systemd reports a crashed unit as ``activating (auto-restart)`` for RestartSec before it restarts it: the
    gate stops there, with the journal, instead of waiting for the restart. systemctl and journalctl here are
    stand-ins printing what systemd prints for such a unit."""
    (tmp_path / "systemctl").write_text(
        '#!/bin/sh\ncase "$*" in *SubState*) echo auto-restart;; *ActiveState*) echo activating;; *NRestarts*) echo 0;; esac\n'
    )
    (tmp_path / "journalctl").write_text("#!/bin/sh\necho 'ValueError: No available memory for the cache blocks.'\n")
    for tool in ("systemctl", "journalctl"):
        (tmp_path / tool).chmod(0o755)
    script = health.wait_script("vllm-main.service", 1, "org/model", 60)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    started = time.monotonic()
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, check=False, env=env)
    problem = health.verdict("vllm-main.service", 1, "org/model", health.parse(done.stdout))
    assert problem is not None and "waits to restart (crash loop)" in problem and "No available memory" in problem
    assert time.monotonic() - started < 15  # one poll, not health_timeout


@pytest.mark.parametrize("version", ["0.11.0", "0.22.0", "0.33.0"])
def test_a_start_is_read_from_the_lines_vllm_logs_for_it(version: str) -> None:
    """The gate's startup section: seconds to healthy and each phase, by the format strings of that version's source
    (a leading logger prefix, the GiB and the compile range are text; the seconds are the number that matters)."""
    from instinct_fleet.model import knowledge

    formats = knowledge.load(version).startup_log
    fill = {"weights": (0.52, 41.5), "compile": (7.25,), "cache-miss": ("(1, 8192)", 7.0), "graph-capture": (12, 0.5)}

    def line(phase: str) -> str:
        values = list(fill[phase])
        fmt = formats[phase][-1]
        return "INFO " + health.CONVERSION.sub(lambda m: "" if m.start() == 0 and m.group() == "%s" else m.group() % values.pop(0), fmt)

    startup = health.parse(text(code="200", state="healthy", models=MODELS, startup="\n".join(["elapsed 63.4", *map(line, fill)]))).startup
    got = health.startup(startup, formats)
    assert (got.seconds, got.weights, got.compile, got.graph_capture, got.cache) == (63.4, 41.5, 7.25, 12.0, "cold")
    assert got.describe() == "started in 63.4 s, cold (weights 41.5 s, compile 7.25 s, graph capture 12 s)"
    assert health.startup(("elapsed 3.0",), formats).describe() == "started in 3 s"  # no phase logged: only the time


def test_the_wait_script_reports_the_start_only_when_healthy() -> None:
    script = health.wait_script("vllm-main.service", 8080, "m", 60, anchors=("Model loading took",))
    healthy, _, rest = script.partition("exit 0; fi; ")
    assert "InactiveExitTimestampMonotonic" in healthy and "_SYSTEMD_INVOCATION_ID" in healthy and "-e 'Model loading took'" in healthy
    assert "_SYSTEMD_INVOCATION_ID" not in rest


@pytest.mark.parametrize("version", ["0.11.0", "0.22.0", "0.33.0"])
def test_the_phase_under_way_is_the_one_after_the_last_vllm_logged(version: str) -> None:
    """vLLM logs each phase as it ends: a wait shows the next one (model, compile, graphs, the server)."""
    from instinct_fleet.model import knowledge

    formats = knowledge.load(version).startup_log
    fill = {"weights": (0.52, 41.5), "cache-miss": ("(1, 8192)", 7.0), "compile": (7.25,), "graph-capture": (12, 0.5)}

    def line(phase: str) -> str:
        values = list(fill[phase])
        fmt = formats[phase][-1]
        return "INFO " + health.CONVERSION.sub(lambda m: "" if m.start() == 0 and m.group() == "%s" else m.group() % values.pop(0), fmt)

    def seen(*phases: str) -> str:
        return f"{health.MARK}startup\nelapsed 20.0\n" + "\n".join(map(line, phases))

    assert health.phase_now("", formats) is None  # the unit has not started: the section is not there
    assert health.phase_now(seen(), formats) == "loading the model"
    assert health.phase_now(seen("weights"), formats) == "compiling or capturing graphs"
    assert health.phase_now(seen("weights", "cache-miss"), formats) == "compiling (torch.compile)"
    assert health.phase_now(seen("weights", "cache-miss", "compile"), formats) == "capturing CUDA/HIP graphs"
    assert health.phase_now(seen("weights", "cache-miss", "compile", "graph-capture"), formats) == "starting the API server"


def test_the_progress_probe_runs_the_gates_own_start_reading() -> None:
    script = health.startup_script("vllm-main.service", ("Model loading took",))
    assert script in health.wait_script("vllm-main.service", 8080, "m", 60, anchors=("Model loading took",))
    assert script.startswith(f"echo '{health.MARK}startup'") and "-e 'Model loading took'" in script


def test_a_waits_probe_reads_this_start_through_the_hosts_runner() -> None:
    """phase_probe: the gate's own start reading, sent through whichever runner the wait has (pyinfra's Host in a
    deploy, remote.Hosts in tune); no answer is no phase, and no formats is no probe."""
    from instinct_fleet.model import knowledge

    formats = knowledge.load("0.22.0").startup_log
    asked: list[str] = []

    def read(command: str) -> str | None:
        asked.append(command)
        return f"{health.MARK}startup\nelapsed 2.0\n"

    probe = health.phase_probe(read, "vllm-main.service", formats)
    assert probe is not None and probe() == "loading the model"
    assert asked == [health.startup_script("vllm-main.service", health.log_anchors(formats))]
    silent = health.phase_probe(lambda _command: None, "vllm-main.service", formats)
    assert silent is not None and silent() is None
    assert health.phase_probe(read, "vllm-main.service", {}) is None
