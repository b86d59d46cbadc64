"""STAND-IN for vLLM's OpenAI-compatible server, for the simulated fleet only.

It is not vLLM. It runs where the real 20+ GB ROCm image and MI300X GPUs cannot:
it accepts ``vllm serve MODEL [flags]``, parses the flags against the table
extracted from the real vLLM release's source (vllm-knowledge.json, the same
table instinct-fleet validates with), exits 2 with argparse's message on a flag
vLLM would reject, refuses to start without /dev/kfd or with fewer render nodes
than tensor x pipeline parallel (as vLLM fails on too few GPUs), and then answers
/health, /v1/models, /v1/completions, /v1/chat/completions and /metrics.

Like vLLM with ``--shutdown-timeout``, SIGTERM drains: /health turns 503 and the
process exits once in-flight requests are done, or when the timeout ends.

Test-only knobs (env vars, set through vllm_env by the end-to-end tests; never
in product code): STANDIN_STARTUP_SECONDS (start-up delay), STANDIN_REQUEST_SECONDS
(time each completion takes), STANDIN_CRASH_AT_START=1 (exit 1 after start-up:
a crash loop under systemd), STANDIN_NEVER_HEALTHY=1 (listen, but /health stays 503).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from glob import glob
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm-knowledge.json")) as _table:
    TABLE = json.load(_table)
FLAGS: dict[str, dict[str, Any]] = TABLE["flags"]
ALIASES: dict[str, str] = TABLE["aliases"]
ENV_VARS = set(TABLE["env_vars"])


def fail(message: str, code: int = 2) -> None:
    prog = "vllm serve"
    print(f"usage: {prog} [model_tag] [options]\n{prog}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def resolve(option: str) -> tuple[str, bool]:
    """The canonical flag for ``option`` and whether it was the ``--no-`` form."""
    if option in FLAGS:
        return option, False
    if option in ALIASES:
        return ALIASES[option], False
    if option.startswith("--no-") and FLAGS.get("--" + option[5:], {}).get("kind") == "bool":
        return "--" + option[5:], True
    prefixed = [f for f in FLAGS if f.startswith(option)]
    if option.startswith("--") and len(prefixed) == 1:
        return prefixed[0], False
    if len(prefixed) > 1:
        fail(f"ambiguous option: {option} could match {', '.join(sorted(prefixed)[:4])}")
    fail(f"unrecognized arguments: {option}")
    raise AssertionError


def parse(argv: list[str]) -> tuple[str, dict[str, Any]]:
    if not argv or argv[0] != "serve":
        fail("this stand-in only implements 'vllm serve'")
    args: dict[str, Any] = {}
    model = None
    rest = argv[1:]
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if not token.startswith("-"):
            if model is not None:
                fail(f"unrecognized arguments: {token}")
            model = token
            continue
        option, _, inline = token.partition("=")
        flag, negated = resolve(option)
        kind = FLAGS[flag]["kind"]
        if kind in ("switch", "bool"):
            if inline:
                fail(f"argument {flag}: ignored explicit argument {inline!r}")
            args[flag] = not negated
            continue
        if inline:
            value = inline
        elif i < len(rest) and (kind == "value" or not rest[i].startswith("-")):
            value = rest[i]
            i += 1
        elif kind == "optional_value":
            value = ""
        else:
            fail(f"argument {flag}: expected one argument")
        choices = FLAGS[flag].get("choices")
        if choices and value not in choices:
            fail(f"argument {flag}: invalid choice: {value!r} (choose from {', '.join(map(repr, choices))})")
        args[flag] = value
    model = model or args.get("--model")
    if not model:
        fail("the following arguments are required: model_tag")
    return str(model), args


def check_devices(args: dict[str, Any]) -> None:
    """Fail as vLLM does on ROCm when the container cannot see enough GPUs."""
    if not os.path.exists("/dev/kfd"):
        fail("RuntimeError: No HIP GPUs are available (/dev/kfd is not in the container)", code=1)
    world = int(args.get("--tensor-parallel-size", 1)) * int(args.get("--pipeline-parallel-size", 1))
    visible = len(glob("/dev/dri/renderD*"))
    if args.get("--distributed-executor-backend") != "ray" and visible < world:
        fail(f"ValueError: tensor x pipeline parallel = {world} needs {world} GPUs, {visible} visible", code=1)


class State:
    ready = True  # False while a Ray-backed instance waits for its GPUs
    model = ""
    served = ""
    args: ClassVar[dict[str, Any]] = {}
    requests = 0
    prompt_tokens = 0
    generation_tokens = 0
    inflight = 0
    draining = False
    lock = threading.Lock()


def completion_text(prompt: str, max_tokens: int) -> str:
    words = f"[stand-in for {State.model}] echo: {prompt}".split()
    return " " + " ".join(words[: max(1, max_tokens)])


class Handler(BaseHTTPRequestHandler):
    server_version = "vllm-standin"

    def log_message(self, format: str, *args: Any) -> None:
        print(f"INFO stand-in {self.address_string()} {format % args}", flush=True)

    def reply(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.reply(200 if State.ready and not State.draining else 503, "", "text/plain")
        elif self.path == "/v1/models":
            max_len = int(State.args.get("--max-model-len", 8192))
            card = {"id": State.served, "object": "model", "owned_by": "vllm", "root": State.model, "max_model_len": max_len}
            self.reply(200, {"object": "list", "data": [card]})
        elif self.path == "/metrics":
            labels = f'model_name="{State.served}"'
            self.reply(
                200,
                "\n".join(
                    [
                        "# TYPE vllm:num_requests_running gauge",
                        f"vllm:num_requests_running{{{labels}}} 0.0",
                        "# TYPE vllm:request_success_total counter",
                        f"vllm:request_success_total{{{labels}}} {float(State.requests)}",
                        "# TYPE vllm:prompt_tokens_total counter",
                        f"vllm:prompt_tokens_total{{{labels}}} {float(State.prompt_tokens)}",
                        "# TYPE vllm:generation_tokens_total counter",
                        f"vllm:generation_tokens_total{{{labels}}} {float(State.generation_tokens)}",
                        "",
                    ]
                ),
                "text/plain; version=0.0.4",
            )
        else:
            self.reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        with State.lock:
            State.inflight += 1
        try:
            time.sleep(float(os.environ.get("STANDIN_REQUEST_SECONDS", "0")))
            self.complete()
        finally:
            with State.lock:
                State.inflight -= 1

    def complete(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as exc:
            self.reply(400, {"error": {"message": f"invalid JSON: {exc}", "type": "BadRequestError", "code": 400}})
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self.reply(404, {"detail": "Not Found"})
            return
        if body.get("model") != State.served:
            message = f"The model `{body.get('model')}` does not exist."
            self.reply(404, {"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}})
            return
        max_tokens = int(body.get("max_tokens") or 16)
        if self.path == "/v1/completions":
            prompt = str(body.get("prompt", ""))
        else:
            prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        text = completion_text(prompt, max_tokens)
        used = len(text.split())
        State.requests += 1
        State.prompt_tokens += len(prompt.split())
        State.generation_tokens += used
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": used, "total_tokens": len(prompt.split()) + used}
        if self.path == "/v1/completions":
            choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "length"}
            kind = "text_completion"
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text.strip()}, "finish_reason": "length"}
            kind = "chat.completion"
        self.reply(
            200,
            {
                "id": f"cmpl-standin-{State.requests}",
                "object": kind,
                "created": int(time.time()),
                "model": State.served,
                "choices": [choice],
                "usage": usage,
            },
        )


def join_ray(tp: int, pp: int) -> None:
    """Do what vLLM's Ray executor does: join the cluster, reserve the GPUs, start workers on them.

    One actor per pipeline stage holds that stage's TP GPUs (vLLM has one per GPU;
    one per stage keeps the stand-in light). Healthy only once every actor runs;
    exit 1 when one dies, as vLLM does when a Ray worker is lost, so that systemd
    restarts the instance and its unit waits for the cluster again.
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0)
    class Stage:
        def ping(self) -> str:
            return str(ray.get_runtime_context().get_node_id())

    ray.init(address="auto", logging_level="ERROR")
    nodes = [n for n in ray.nodes() if n["Alive"]]
    print(f"INFO stand-in joined Ray: {len(nodes)} nodes, {ray.cluster_resources().get('GPU', 0):g} GPUs; needs {tp * pp}", flush=True)
    group = placement_group([{"GPU": tp}] * pp, strategy="SPREAD")
    ray.get(group.ready())
    stages = [
        Stage.options(num_gpus=tp, scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)).remote()
        for i in range(pp)
    ]
    hosts = set(ray.get([s.ping.remote() for s in stages]))
    print(f"INFO stand-in placement group of {tp * pp} GPUs ready on {len(hosts)} nodes", flush=True)
    State.ready = True
    while True:
        time.sleep(2)
        try:
            ray.get([s.ping.remote() for s in stages], timeout=15)
        except Exception as exc:  # RayActorError, GetTimeoutError: a worker is gone
            print(f"ERROR stand-in: lost a Ray worker ({type(exc).__name__}); exiting like vLLM", flush=True)
            os._exit(1)


def drain(timeout: float) -> None:
    """SIGTERM: with --shutdown-timeout, answer 503 on /health and wait for in-flight requests, as vLLM does."""
    State.draining = True
    end = time.monotonic() + timeout
    while State.inflight and time.monotonic() < end:
        time.sleep(0.1)
    print(f"INFO stand-in shutting down ({State.inflight} requests still in flight)", flush=True)
    sys.exit(0)


def main() -> None:
    model, args = parse(sys.argv[1:])
    for name in sorted(os.environ):
        if name.startswith("VLLM_") and name not in ENV_VARS:
            print(f"WARNING Unknown vLLM environment variable detected: {name}", flush=True)
    check_devices(args)
    token_path = os.environ.get("HF_TOKEN_PATH")
    if token_path:
        with open(token_path) as handle:
            print(f"INFO Hugging Face token read from {token_path} ({len(handle.read().strip())} characters)", flush=True)
    State.model = model
    State.served = str(args.get("--served-model-name") or model)
    State.args = args
    signal.signal(signal.SIGTERM, lambda *_: drain(float(args.get("--shutdown-timeout", 0))))
    if args.get("--distributed-executor-backend") == "ray":
        tp, pp = int(args.get("--tensor-parallel-size", 1)), int(args.get("--pipeline-parallel-size", 1))
        State.ready = False
        threading.Thread(target=join_ray, args=(tp, pp), daemon=True).start()
    # A real server loads weights before it listens; keep a short, visible delay.
    time.sleep(float(os.environ.get("STANDIN_STARTUP_SECONDS", "2")))
    if os.environ.get("STANDIN_CRASH_AT_START") == "1":
        print("ERROR stand-in: STANDIN_CRASH_AT_START=1, exiting as a broken configuration would", flush=True)
        sys.exit(1)
    if os.environ.get("STANDIN_NEVER_HEALTHY") == "1":
        State.ready = False
        print("WARNING stand-in: STANDIN_NEVER_HEALTHY=1, /health will stay 503", flush=True)
    host = str(args.get("--host") or "0.0.0.0")
    port = int(args.get("--port", 8000))
    print(f"INFO stand-in vLLM serving {model} as {State.served!r} on {host}:{port} with {json.dumps(args, sort_keys=True)}", flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main()
