"""STAND-IN for vLLM's OpenAI-compatible server, for the simulated fleet only.

It is not vLLM. It runs where the real 20+ GB ROCm image and MI300X GPUs cannot:
it accepts ``vllm serve MODEL [flags]``, parses the flags against the table
extracted from the real vLLM release's source (vllm-knowledge.json, the same
table instinct-fleet validates with), exits 2 with argparse's message on a flag
vLLM would reject, refuses to start without /dev/kfd or with fewer render nodes
than tensor x pipeline parallel (as vLLM fails on too few GPUs), and then answers
/health, /v1/models, /v1/completions, /v1/chat/completions and /metrics; with
VLLM_API_KEY in its environment the /v1 routes answer 401 without the bearer
token, as vLLM's AuthenticationMiddleware does.

Like vLLM with ``--shutdown-timeout``, SIGTERM drains: /health turns 503 and the
process exits once in-flight requests are done, or when the timeout ends.

Completions stream (``"stream": true``, server-sent events as vLLM sends them)
or answer whole. A request is one "token" per word. Streamed requests go through
a speed model (:class:`Engine`) that answers the serving settings the way vLLM
does, so that a sweep of them (``instinct-fleet tune``) finds a real trade-off.
/metrics exposes vLLM's own names and types for what it does
(vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
token counters, a TTFT histogram). With HF_HUB_OFFLINE=1 it refuses to start
unless the model is in its Hugging Face cache, as vLLM fails offline.

``vllm bench serve`` is stood in for by bench_standin.py.

Test-only knobs (env vars, set through vllm_env by the end-to-end tests; never
in product code): STANDIN_STARTUP_SECONDS (start-up delay), STANDIN_REQUEST_SECONDS
(time each completion takes), STANDIN_CRASH_AT_START=1 (exit 1 after start-up:
a crash loop under systemd), STANDIN_NEVER_HEALTHY=1 (listen, but /health stays 503),
STANDIN_FAIL_COMPLETIONS=1 (healthy and listed, but the first completion gets a 500 and the
server exits, as vLLM does when its engine dies at the first forward pass),
STANDIN_FAIL_EVERY=N (every Nth streamed completion gets a 500 before it takes a place in
the batch, so the rest run faster: a configuration that loses requests under load),
STANDIN_COMPILE_S (a cold start's compile time, skipped on a hit in VLLM_CACHE_ROOT; see
``compile_or_reuse``), STANDIN_CORRUPT=N (from the Nth word of a reply on, degenerate digits,
as AITER's fused all-reduce wrote them in ROCm/aiter#4855: see :func:`answer_words`),
STANDIN_HANG_AFTER=N (once N completions were asked, the engine stops stepping, as vLLM's deadlocked
engine core did in vllm#39863: /health keeps answering 200, the step counters freeze, every request waits;
``POST /standin/hang`` does the same at once, for a test that hangs one running instance), and the
speed model's constants (STANDIN_TOKENS_PER_SECOND and the others named in :class:`Engine`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
import tomllib
import zlib
from collections import OrderedDict
from glob import glob
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, ClassVar, Literal, get_args

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "vllm-knowledge.json")) as _table:
    TABLE = json.load(_table)
with open(os.path.join(HERE, "checkpoints.toml"), "rb") as _checkpoints:
    CHECKPOINTS: dict[str, dict[str, Any]] = tomllib.load(_checkpoints)["models"]
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
        fail("this stand-in only implements 'vllm serve' and 'vllm bench serve'")
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


def config_error(message: str) -> None:
    """vLLM's engine config raises at start-up: a traceback ending in the error, exit 1."""
    fail(message, code=1)


def check_json_config(flag: str, value: Any, fields: dict[str, Any], where: str = "") -> None:
    """A JSON config flag becomes a pydantic dataclass that forbids extra keys and checks its bounds."""
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            config_error(f"pydantic_core.ValidationError: {flag}{where}.{key}: Extra inputs are not permitted")
        if field.get("settable") is False:
            config_error(f"pydantic_core.ValidationError: {flag}{where}.{key}: cannot be set (init=False)")
        if "fields" in field and isinstance(item, dict):
            check_json_config(flag, item, field["fields"], f"{where}.{key}")
        elif field.get("choices") and isinstance(item, str):
            wanted = item.upper() if field.get("choices_case") == "upper" else item
            if wanted not in field["choices"]:
                config_error(f"pydantic_core.ValidationError: {flag}{where}.{key}: Input should be one of {field['choices']}")
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            check_bounds(f"{flag}{where}.{key}", float(item), field.get("bounds", {}))


def check_bounds(name: str, value: float, bounds: dict[str, float]) -> None:
    tests = {
        "gt": value > bounds.get("gt", 0),
        "ge": value >= bounds.get("ge", 0),
        "lt": value < bounds.get("lt", 0),
        "le": value <= bounds.get("le", 0),
    }
    for op in bounds:
        if not tests[op]:
            config_error(f"pydantic_core.ValidationError: {name}: Input should be {op} {bounds[op]}")


def numbers(args: dict[str, Any]) -> dict[str, float]:
    """The flags given as plain numbers (``--max-num-seqs 32``, ``--gpu-memory-utilization 0.9``)."""
    return {k: float(v) for k, v in args.items() if isinstance(v, str) and v.replace(".", "", 1).isdigit()}


GPU_MEMORY_GIB = 192  # the captured amd-smi fixture's GPUs are MI300X: 192 GiB of HBM each


def scheduler_defaults(
    args: dict[str, Any], seqs: float | None, batched: float | None, length: float | None, chunked_off: bool
) -> tuple[float | None, float | None]:
    """What EngineArgs sets an absent --max-num-seqs and --max-num-batched-tokens to on this GPU (TABLE["scheduler_defaults"])."""
    rules = TABLE.get("scheduler_defaults") or {}
    tier = next((t for t in rules.get("tiers", []) if t["min_gib"] <= GPU_MEMORY_GIB), None)
    if tier is None:
        return seqs, batched
    factor = 2 if rules["throughput_doubles"] and args.get("--performance-mode") == "throughput" else 1
    if batched is None:
        batched = float(tier["max_num_batched_tokens"] * factor)
        if chunked_off and length is not None:
            batched = max(length, batched) if rules["chunked_off_batched"].startswith("max") else length
        elif chunked_off:
            batched = None  # the model's own length, which the stand-in does not model
    if seqs is None:
        seqs = float(tier["max_num_seqs"] * factor)
        if rules["seqs_capped_by_batched"] and batched is not None:
            seqs = min(seqs, batched)
    return seqs, batched


def executor_backend(args: dict[str, Any]) -> str:
    """ParallelConfig's executor on ROCm: the flag, else ray for --data-parallel-backend ray, mp for more than one process, uni for one."""
    if args.get("--distributed-executor-backend"):
        return str(args["--distributed-executor-backend"])
    number = numbers(args)
    world = (
        number.get("--tensor-parallel-size", 1)
        * number.get("--pipeline-parallel-size", 1)
        * number.get("--prefill-context-parallel-size", 1)
    )
    if world * number.get("--data-parallel-size", 1) > 1:
        return "ray" if args.get("--data-parallel-backend") == "ray" else "mp"
    return "uni"


# vllm/config/kv_transfer.py: KVProducer, KVConsumer and KVRole, as 0.22.0 and 0.33.0 write them.
KV_ROLE = Literal["kv_producer", "kv_both", "kv_consumer"]  # Literal[KVProducer, KVConsumer], flattened as Python flattens it
MTP_SUFFIX = "_mtp"  # vllm/config/speculative.py MTPModelTypes: every deprecated *_mtp method becomes "mtp" before the checks


def vllm_names(model: str, args: dict[str, Any], path: str) -> dict[str, Any]:
    """The names that vLLM's own conditions in ``path`` read (TABLE["startup_conditions"], extracted from its
    source), as vLLM holds them when it checks: its config objects built from argv, with the defaults and
    normalisations its code applies first. This is the stand-in's one hand-written part of those checks; each
    default names the source that sets it."""
    number = numbers(args)
    if path == "vllm/config/scheduler.py":
        chunked_off = args.get("--enable-chunked-prefill") is False
        length = number.get("--max-model-len")  # None: the model's own length, which the stand-in does not model
        seqs, batched = scheduler_defaults(args, number.get("--max-num-seqs"), number.get("--max-num-batched-tokens"), length, chunked_off)
        config = SimpleNamespace(
            max_num_batched_tokens=batched,
            max_num_seqs=seqs,
            max_model_len=length,
            enable_chunked_prefill=not chunked_off,
            chunked_prefill_enabled=not chunked_off,
            max_num_partial_prefills=number.get("--max-num-partial-prefills", 1),  # SchedulerConfig's defaults
            max_long_partial_prefills=number.get("--max-long-partial-prefills", 1),
            long_prefill_token_threshold=number.get("--long-prefill-token-threshold", 0),
        )
        return {"self": config, "max_model_len": length}
    if path == "vllm/config/vllm.py":  # VllmConfig.__post_init__, after Executor.get_class (TABLE["executors"])
        backend = executor_backend(args)
        choice = TABLE.get("executors", {}).get(backend, {})
        chosen = choice.get("class")
        if "env" in choice:
            value = os.environ.get(choice["env"], choice["default"])
            chosen = choice["on"] if bool(int(value)) else choice["off"]  # envs.py reads it as bool(int(...))
        asked = args.get("--async-scheduling")
        return {
            "self": SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=asked if isinstance(asked, bool) else None)),
            "executor_backend": backend,
            "executor_supports_async_sched": chosen in TABLE.get("async_executors", []),
        }
    if path == "vllm/engine/arg_utils.py":  # EngineArgs._check_feature_supported, against SchedulerConfig's defaults
        engine = SimpleNamespace(
            max_num_partial_prefills=number.get("--max-num-partial-prefills", 1),
            max_long_partial_prefills=number.get("--max-long-partial-prefills", 1),
        )
        return {"self": engine, "SchedulerConfig": SimpleNamespace(max_num_partial_prefills=1, max_long_partial_prefills=1)}
    if path == "vllm/config/speculative.py":
        spec = json.loads(args["--speculative-config"]) if args.get("--speculative-config") else {}
        model, method = spec.get("model"), spec.get("method")
        if method is None:  # SpeculativeConfig.__post_init__ infers it
            method = "ngram" if model in ("ngram", "[ngram]") else "draft_model"
        if str(method).endswith(MTP_SUFFIX):
            method = "mtp"
        low, high = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        low, high = (5, 5) if low is None and high is None else (low if low is not None else high, high if high is not None else low)
        config = SimpleNamespace(
            model=model,
            method=method,
            num_speculative_tokens=spec.get("num_speculative_tokens"),
            prompt_lookup_min=low,
            prompt_lookup_max=high,
            tensor_parallel_size=spec.get("tensor_parallel_size"),
        )
        return {
            "self": config,
            "speculative_draft_tensor_parallel_size": spec.get("draft_tensor_parallel_size"),
            "target_parallel_config": SimpleNamespace(tensor_parallel_size=int(number.get("--tensor-parallel-size", 1))),
        }
    if path == "vllm/config/kv_transfer.py":
        transfer = json.loads(args["--kv-transfer-config"]) if args.get("--kv-transfer-config") else {}
        return {
            "self": SimpleNamespace(kv_connector=transfer.get("kv_connector"), kv_role=transfer.get("kv_role")),
            "get_args": get_args,
            "KVRole": KV_ROLE,
        }
    if path == "vllm/config/parallel.py":
        backend = executor_backend(args)
        config = SimpleNamespace(
            ray_workers_use_nsight=args.get("--ray-workers-use-nsight") is True,
            use_ray=backend == "ray",
            distributed_executor_backend=backend,
            nnodes=number.get("--nnodes", 1),
        )
        return {"self": config, "allowed_backends": ("mp", "uni", "external_launcher")}  # ParallelConfig.__post_init__
    if path == "vllm/v1/attention/backends/rocm_aiter_fa.py":
        spec = json.loads(args["--speculative-config"]) if args.get("--speculative-config") else None
        tokens = int(spec.get("num_speculative_tokens") or 1) if spec is not None else 0
        sinks = CHECKPOINTS.get(model, {}).get("sinks", False)
        impl = SimpleNamespace(sliding_window=(-1, -1), sinks=True if sinks else None)  # sliding windows are not modelled
        return {
            "self": impl,
            "attn_metadata": SimpleNamespace(use_cascade=False),
            "num_decodes": 1,  # the engine decodes
            "decode_max_query_len": 1 + tokens,  # a speculative decode step scores its proposed tokens at once
            "use_swa_paged": False,
            "rocm_aiter_ops": SimpleNamespace(
                is_shuffle_kv_cache_enabled=lambda: os.environ.get("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT") in ("1", "true", "True")
            ),
        }
    raise KeyError(f"the stand-in holds no names for vLLM's {path}: teach vllm_names how vLLM builds it")


def backend_reasons(backend: dict[str, Any], args: dict[str, Any], checkpoint: dict[str, Any]) -> list[str]:
    """Why a backend's validate_configuration refuses this launch, in vLLM's words (empty: it takes it)."""
    reasons = []
    dtype = args.get("--kv-cache-dtype")
    if dtype and backend.get("kv_cache_dtypes") and dtype not in backend["kv_cache_dtypes"]:
        reasons.append("kv_cache_dtype not supported")
    block = args.get("--block-size")
    sizes = backend.get("block_sizes")
    if block and sizes and not any(int(block) % int(str(s).lstrip("*")) == 0 for s in sizes):
        reasons.append("block_size not supported")
    if bool(checkpoint.get("mla")) != bool(backend.get("is_mla")):
        reasons.append("MLA not supported" if checkpoint.get("mla") else "non-MLA not supported")
    if checkpoint.get("sinks") and not backend.get("supports_sink"):
        reasons.append("attention sinks not supported")
    return reasons


def running_backend(model: str, args: dict[str, Any]) -> str | None:
    """The ROCm attention backend the launch runs, as RocmPlatform.get_attn_backend_cls picks it: the one named, else
    for an MHA model the first of the table's priorities (TABLE["attention_backends"]["mha_priority"], from
    _get_backend_priorities) that is listed under its condition and validates; None for an MLA model."""
    if args.get("--attention-backend"):
        return str(args["--attention-backend"]).upper()
    checkpoint = CHECKPOINTS.get(model, {})
    if checkpoint.get("mla") or checkpoint.get("sparse"):
        return None
    table = TABLE.get("attention_backends", {})
    on = ("1", "true", "True")
    names = {  # vllm/_aiter_ops.py: is_mha_enabled is the AITER switch and its MHA flag (default on) together
        "use_kv_connector": bool(args.get("--kv-transfer-config")),
        "rocm_aiter_ops": SimpleNamespace(
            is_mha_enabled=lambda: os.environ.get("VLLM_ROCM_USE_AITER") in on and os.environ.get("VLLM_ROCM_USE_AITER_MHA", "1") in on
        ),
        "is_aiter_found_and_supported": lambda: True,  # an MI300X with the AITER of vLLM's ROCm images
    }
    for name, condition in table.get("mha_priority", []):
        backend = table.get("rocm", {}).get(name)
        if backend is None or (condition is not None and not eval(condition, {"__builtins__": {}}, names)):
            continue
        if not backend_reasons(backend, args, checkpoint):
            return name
    return None


def stated_checks(model: str, args: dict[str, Any]) -> list[tuple[str, str]]:
    """Each anchored check between settings that vLLM's own source raises on this launch, with vLLM's message: its
    conditions and message (TABLE["startup_conditions"], extracted at the line TABLE["startup_checks"] names) evaluated
    over the names vLLM holds (:func:`vllm_names`). A condition over a value the stand-in does not know (the model's
    own length) does not hold: the product cannot decide it either."""
    raised = []
    for check, stated in TABLE.get("startup_conditions", {}).items():
        path = TABLE["startup_checks"][check].split(":")[0]
        if path.startswith("vllm/v1/attention/backends/rocm_aiter_fa") and running_backend(model, args) != "ROCM_AITER_FA":
            continue
        names = vllm_names(model, args, path)
        try:
            holds = all(eval(condition, {"__builtins__": {}}, names) for condition in stated["when"])
        except TypeError:  # a comparison with a value the stand-in does not know
            holds = False
        if holds:
            raised.append((check, f"{stated['raises']}: {eval(stated['says'], {'__builtins__': {}}, names)}"))
    return raised


def check_settings(model: str, args: dict[str, Any]) -> None:
    """The checks between settings: the pairs of a flag and a JSON key that set the same thing, then the first check
    that vLLM's source raises (:func:`stated_checks`)."""
    for pair in TABLE.get("exclusive", []):
        config = json.loads(args[pair["config"]]) if args.get(pair["config"]) else {}
        if args.get(pair["flag"]) is not None and isinstance(config, dict) and config.get(pair["key"]) is not None:
            config_error(f"ValueError: {pair['flag']} and {pair['config']}['{pair['key']}'] are mutually exclusive")
    for _, message in stated_checks(model, args)[:1]:
        config_error(message)


def json_object(flag: str, value: str) -> dict[str, Any]:
    """A flag's value as vLLM's argparse reads a dict: JSON, and an object."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        fail(f"argument {flag}: invalid loads value: {value!r} ({exc.msg})")
    if not isinstance(parsed, dict):
        fail(f"argument {flag}: must be a JSON object")
    return parsed


def check_startup(model: str, args: dict[str, Any]) -> None:
    """What vLLM's engine config refuses at start-up, read from the same generated tables.

    In vLLM's order: flag bounds and JSON configs (pydantic), the quantization
    (ModelConfig._verify_quantization with the checkpoint's config.json), the
    scheduler limits, then the attention backend's validate_configuration. First, as vLLM's envs.py does: a VLLM_*
    variable it does not know is a warning, and an error under --fail-on-environ-validation.
    """
    for name in sorted(os.environ):
        if name.startswith("VLLM_") and name not in ENV_VARS:
            if args.get("--fail-on-environ-validation") is True:
                fail(f"ValueError: Unknown vLLM environment variable detected: {name}", 1)
            print(f"WARNING Unknown vLLM environment variable detected: {name}", flush=True)
    for flag, value in args.items():
        info = FLAGS[flag]
        if isinstance(value, bool):
            continue
        if info.get("json") and (info["json"] == "object" or value.lstrip().startswith("{")):
            json_object(flag, value)  # argparse's json.loads, or union_dict_and_str's for a value shaped {...}
        if "json_fields" in info:
            check_json_config(flag, json_object(flag, value), info["json_fields"])
        elif info.get("bounds"):
            try:
                number = float(value)
            except ValueError:
                continue
            check_bounds(flag, number, info["bounds"])
    quant = TABLE["quantization"]
    checkpoint = CHECKPOINTS.get(model, {})
    declared = checkpoint.get("quant_method") or None
    given = args.get("--quantization")
    if given and declared and given.removeprefix("auto_").removesuffix("_marlin") != declared.removeprefix("auto_").removesuffix("_marlin"):
        config_error(
            f"ValueError: Quantization method specified in the model config ({declared}) does not match the quantization "
            f"method specified in the `quantization` argument ({given})."
        )
    method = given or declared
    if method:
        if method not in quant["methods"]:
            config_error(f"ValueError: Unknown quantization method: {method}. Must be one of {quant['methods']}.")
        if quant["rocm"] and method not in quant["rocm"]:
            config_error(f"ValueError: {method} quantization is currently not supported in rocm.")
        if method in quant["deprecated"] and args.get(quant["deprecated_flag"] or "") is not True:
            config_error(f"ValueError: The quantization method {method} is deprecated and will be removed in future versions of vLLM.")
    check_settings(model, args)
    backends = TABLE["attention_backends"].get("rocm", {})
    selected = args.get("--attention-backend")
    if backends and selected:
        backend = backends.get(selected.upper())
        reasons = []
        if backend is None:
            reasons.append("ImportError")
        else:
            reasons += backend_reasons(backend, args, checkpoint)
        if reasons:
            config_error(f"ValueError: Selected backend {selected.upper()} is not valid for this configuration. Reason: {reasons}")


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
    streamed = 0  # streamed completions asked for (STANDIN_FAIL_EVERY counts them)
    prompt_tokens = 0
    generation_tokens = 0
    inflight = 0
    running = 0
    waiting = 0
    kv_tokens = 0  # prompt + generated tokens of the running requests
    ttfts: ClassVar[list[float]] = []
    itls: ClassVar[list[float]] = []  # the gaps between two tokens of a streamed reply
    prefix_queries = 0  # prompt tokens looked up in the prefix cache, and those found (vLLM's two counters)
    prefix_hits = 0
    draining = False
    lock = threading.Lock()
    steps = 0  # engine steps taken (vllm:iteration_tokens_total's count) and the tokens they carried (its sum)
    step_tokens = 0
    asked = 0  # completions asked for (STANDIN_HANG_AFTER counts them)
    hung = threading.Event()


def stepped(tokens: int) -> None:
    """One engine step that carried ``tokens``. A hung engine takes no step: its caller waits for good."""
    if State.hung.is_set():
        threading.Event().wait()
    with State.lock:
        State.steps += 1
        State.step_tokens += tokens


VOCAB = 201088  # gpt-oss's vocabulary size: the stand-in's token ids are below it
BLOCK = 16  # words per prefix-cache block: vLLM's default KV block size, the unit its prefix cache hits in


class Engine:
    """The stand-in's speed model. Test-only: its shape is the seeds', its numbers are nobody's.

    - **Decode.** Every running sequence gets one token per engine step, and a step takes
      ``(1 / STANDIN_TOKENS_PER_SECOND) * (1 + running / STANDIN_BATCH_KNEE)`` seconds: a
      bigger batch makes each step slower (TPOT rises) but yields more tokens per second in
      all (throughput rises towards TOKENS_PER_SECOND x KNEE). ``--max-num-seqs`` caps the
      batch, so raising it "raises throughput at the cost of latency" (seed 000) and
      lowering it to 8-32 gives "faster individual responses" (seed 000, seed 002).
    - **Prefill.** Prompts are prefilled one engine step after another (one lane), each step
      carrying at most ``--max-num-batched-tokens`` prompt tokens. A prompt of P tokens costs
      ``P / STANDIN_PREFILL_TOKENS_PER_SECOND`` plus its share ``P / budget`` of a step's fixed
      cost STANDIN_STEP_SECONDS: a larger budget means fewer steps and a lower TTFT under load,
      the "latency/throughput balance" seeds 002 and 003 sweep it for. Without the flag the
      budget is --max-model-len with chunked prefill off, else vLLM's default, 8192.
    - **KV cache.** ``--gpu-memory-utilization`` minus the weights' share of the GPU
      (STANDIN_WEIGHTS_FRACTION) buys KV tokens: ``(util - weights) / (1 - weights) *
      STANDIN_KV_TOKENS``. A request holds its prompt plus ``max_tokens`` until it ends and
      waits while they do not fit, so the budget bounds concurrent sequences (seed 000:
      "HBM budget set by gpu-memory-utilization"). Below one --max-model-len of KV tokens the
      server exits at start-up with vLLM's own message, as vLLM does.

    - **Cold start.** The first STANDIN_COLD_REQUESTS (4) prefills after start each take
      STANDIN_COLD_SECONDS (0.05 s) more, holding the engine's one lane, as kernels compile and
      caches fill on a real engine's first requests (a measured run with no warm-up inflated an
      MI300X baseline about 3.9x, ROCm/iris PR #535): what a benchmark's warm-up is for.

    - **Prefix cache.** Prompts are cut into blocks of BLOCK (16) words, each keyed by every
      block before it, as vLLM's prefix cache keys KV blocks by their prefix's hash. A prompt's
      leading blocks that are cached cost no prefill: a request whose long system prompt is
      already there answers its first token sooner. The cache holds as many blocks as the KV
      tokens buy, least recently used out first; ``--no-enable-prefix-caching`` turns it off.
      Hits and lookups are counted as vLLM's ``vllm:prefix_cache_hits`` and ``_queries``.

    Not modelled: prefill chunks slowing the decode steps they share, CUDA graphs, AITER.
    """

    def __init__(self, args: dict[str, Any]) -> None:
        number = numbers(args)
        self.seqs = int(number.get("--max-num-seqs", 256))
        self.length = int(number.get("--max-model-len", 8192))
        unchunked = args.get("--enable-chunked-prefill") is False
        self.budget = int(number.get("--max-num-batched-tokens", self.length if unchunked else 8192))
        weights = min(0.95, rate("STANDIN_WEIGHTS_FRACTION", 0.5))
        utilization = number.get("--gpu-memory-utilization", 0.9)
        self.kv_tokens = int(max(0.0, utilization - weights) / (1 - weights) * rate("STANDIN_KV_TOKENS", 400000))
        self.held = 0  # KV tokens of the running requests
        self.running = 0
        self.admitted = threading.Condition()
        self.lane = threading.Lock()
        self.cold = int(os.environ.get("STANDIN_COLD_REQUESTS", "4"))  # prefills left that pay the cold start
        self.caching = args.get("--enable-prefix-caching") is not False
        self.blocks: OrderedDict[int, None] = OrderedDict()  # cached prefix blocks, least recently used first

    def cached(self, words: list[str]) -> int:
        """Prompt tokens found in the prefix cache (whole leading blocks); every full block is cached after."""
        if not self.caching:
            return 0
        hits, key, missed = 0, 0, False
        for start in range(0, len(words) - len(words) % BLOCK, BLOCK):
            key = hash((key, tuple(words[start : start + BLOCK])))
            if not missed and key in self.blocks:
                hits += BLOCK
                self.blocks.move_to_end(key)
            else:
                missed = True
                self.blocks[key] = None
        while len(self.blocks) > max(1, self.kv_tokens // BLOCK):
            self.blocks.popitem(last=False)
        return hits

    def refuses(self) -> str | None:
        """vLLM's start-up error when the KV cache cannot hold one request (vllm/v1/core/kv_cache_utils.py)."""
        if self.kv_tokens <= 0:
            return "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
        if self.kv_tokens < self.length:
            return (
                f"ValueError: To serve at least one request with the models's max seq len ({self.length}), "
                f"({self.length * 0.0001:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
                f"({self.kv_tokens * 0.0001:.2f} GiB). Based on the available memory, the estimated maximum model length is "
                f"{self.kv_tokens}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
            )
        return None

    def admit(self, tokens: int) -> None:
        """Wait for a place in the batch and room in the KV cache (a lone request always gets in)."""
        with self.admitted:
            while self.running and (self.running >= self.seqs or self.held + tokens > self.kv_tokens):
                self.admitted.wait()
            self.running += 1
            self.held += tokens

    def release(self, tokens: int) -> None:
        with self.admitted:
            self.running -= 1
            self.held -= tokens
            self.admitted.notify_all()

    def prefill(self, words: list[str]) -> None:
        with self.lane:
            hits = self.cached(words)
            with State.lock:
                State.prefix_queries += len(words)
                State.prefix_hits += hits
            prompt_len = len(words) - hits
            cold = 0.0
            if self.cold > 0:
                self.cold -= 1
                cold = float(os.environ.get("STANDIN_COLD_SECONDS", "0.05"))
            time.sleep(
                cold
                + prompt_len / rate("STANDIN_PREFILL_TOKENS_PER_SECOND", 50000)
                + prompt_len / self.budget * float(os.environ.get("STANDIN_STEP_SECONDS", "0.05"))
            )

    def step(self) -> float:
        return (1 + self.running / rate("STANDIN_BATCH_KNEE", 8)) / rate("STANDIN_TOKENS_PER_SECOND", 400)


ENGINE: list[Engine] = []  # set once the flags are parsed


class Server(ThreadingHTTPServer):
    """Listens with uvicorn's default backlog, 2048, as vLLM's API server does. socketserver's default of 5
    reset connections when a benchmark opened 32 at once on a busy machine, and the lost requests made
    the rest look faster."""

    request_queue_size = 2048


def buckets(name: str) -> list[float]:
    """A histogram's bounds as this release's source fixes them (TABLE["histogram_buckets"]), or as
    --custom-histogram-buckets replaces its family's, as vLLM's histogram_buckets() does (0.33.0 on)."""
    histogram = TABLE.get("histogram_buckets", {}).get(name, {})
    family = histogram.get("family")
    custom = json.loads(State.args["--custom-histogram-buckets"]) if State.args.get("--custom-histogram-buckets") else {}
    return [float(b) for b in (custom[family] if family in custom else histogram.get("buckets", []))]


def histogram(name: str, values: list[float], labels: str) -> list[str]:
    """A histogram's exposition (prometheus_client's): cumulative buckets at the release's bounds, +Inf, count, sum."""
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{le(bound)}",{labels}}} {float(sum(v <= bound for v in values))}' for bound in buckets(name)]
    return [
        *lines,
        f'{name}_bucket{{le="+Inf",{labels}}} {float(len(values))}',
        f"{name}_count{{{labels}}} {float(len(values))}",
        f"{name}_sum{{{labels}}} {sum(values)}",
    ]


def le(bound: float) -> str:
    """A bound as prometheus_client writes it (floatToGoString): repr of the float, exponent form past 6 digits."""
    text = repr(float(bound))
    dot = text.find(".")
    if bound > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def metrics_text() -> str:
    """vLLM's Prometheus names and types (vllm/v1/metrics/loggers.py) for what the stand-in does."""
    labels = f'model_name="{State.served}",engine="0"'
    capacity = int(State.args.get("--max-model-len", 8192)) * int(State.args.get("--max-num-seqs", 256)) // 4
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(State.running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(State.waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {min(1.0, State.kv_tokens / max(1, capacity))}",
        "# TYPE vllm:request_success_total counter",
        # One child per finish reason, as vLLM makes them at start (TABLE["finish_reasons"]); each request ends on length.
        *(
            f'vllm:request_success_total{{finished_reason="{reason}",{labels}}} {float(State.requests if reason == "length" else 0)}'
            for reason in TABLE.get("finish_reasons", ["length"])
        ),
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {float(State.prompt_tokens)}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {float(State.generation_tokens)}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{labels}}} {float(State.prefix_queries)}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{labels}}} {float(State.prefix_hits)}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} 0.0",  # the stand-in's engine admits what fits, and never preempts
        *histogram("vllm:time_to_first_token_seconds", list(State.ttfts), labels),
        *histogram("vllm:inter_token_latency_seconds", list(State.itls), labels),
        "# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.",
        "# TYPE vllm:iteration_tokens_total histogram",
        f'vllm:iteration_tokens_total_bucket{{le="+Inf",{labels}}} {float(State.steps)}',
        f"vllm:iteration_tokens_total_count{{{labels}}} {float(State.steps)}",
        f"vllm:iteration_tokens_total_sum{{{labels}}} {float(State.step_tokens)}",
        "",
    ]
    return "\n".join(lines)


def rate(name: str, default: float) -> float:
    return max(1e-3, float(os.environ.get(name, default)))


def completion_text(prompt: str, max_tokens: int, config: str | None = None) -> str:
    """A whole reply: a probe item's answer (``config``: the fingerprint it depends on, computed when not given), or an
    echo of the prompt."""
    words = answer_words(prompt, fingerprint() if config is None else config) or f"[stand-in for {State.model}] echo: {prompt}".split()
    return " " + " ".join(corrupted(words)[: max(1, max_tokens)])


# The accuracy probe's items (instinct_fleet/model/probe.py): "Compute <expression>. Reply with ...".
PROBE_ITEM = re.compile(r"^Compute ([0-9+\-*() ]+)\. Reply with the final result")
ALWAYS_WRONG = 7  # percent of the items this "model" gets wrong in every configuration
CONFIG_WRONG = 3  # percent more, drawn again for each configuration (a harmless change flips a few items)


def fingerprint() -> str:
    """The configuration a reply depends on: the serve flags and the engine's environment (not STANDIN_CORRUPT, which
    stands for a broken kernel, not a setting)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "STANDIN_")) and k != "STANDIN_CORRUPT"}
    return json.dumps([State.model, State.args, env], sort_keys=True, default=str)


def chance(*parts: str) -> int:
    """A stable draw in 0..99 from text (sha256: similar prompts draw independently, unlike crc32)."""
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:8], "big") % 100


def answer_words(prompt: str, config: str) -> list[str]:
    """A probe item's reply, greedy and imperfect like a model's: right for about 90 items in 100, deterministically
    per item and configuration (ALWAYS_WRONG, CONFIG_WRONG); a wrong reply is off by a small amount. Empty for any
    other prompt."""
    found = PROBE_ITEM.match(prompt)
    if not found:
        return []
    expression = found.group(1)
    value = evaluate(expression)
    if chance(prompt) < ALWAYS_WRONG or chance(config, prompt) < CONFIG_WRONG:
        value += 1 + chance("off by", prompt) % 9
    return f"Working it out step by step: {expression} comes to {value}. The final result is:\n{value}".split(" ")


def evaluate(expression: str) -> int:
    """The integer value of a probe item's expression (+, -, *, parentheses), without eval."""
    tokens = re.findall(r"\d+|[-+*()]", expression)
    position = 0

    def atom() -> int:
        nonlocal position
        token = tokens[position]
        position += 1
        if token == "(":
            value = total()
            position += 1  # ")"
            return value
        return int(token)

    def product() -> int:
        nonlocal position
        value = atom()
        while position < len(tokens) and tokens[position] == "*":
            position += 1
            value *= atom()
        return value

    def total() -> int:
        nonlocal position
        value = product()
        while position < len(tokens) and tokens[position] in "+-":
            sign = tokens[position]
            position += 1
            value = value + product() if sign == "+" else value - product()
        return value

    return total()


def corrupted(words: list[str]) -> list[str]:
    """STANDIN_CORRUPT=N: from the Nth word on, a run of one repeated digit, as a corrupting kernel writes it."""
    start = int(os.environ.get("STANDIN_CORRUPT", "0") or 0)
    if start <= 0:
        return words
    return words[: start - 1] + ["7" * (1 + i % 3) for i in range(len(words) - start + 1)]


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

    def authorized(self) -> bool:
        """vLLM's AuthenticationMiddleware: with VLLM_API_KEY (or --api-key) set, /v1, /v2 and /inference need the bearer token."""
        key = State.args.get("--api-key") or os.environ.get("VLLM_API_KEY")
        if not key or not self.path.startswith(("/v1", "/v2", "/inference")):
            return True
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token == key:
            return True
        self.reply(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        if not self.authorized():
            return
        if self.path == "/health":
            self.reply(200 if State.ready and not State.draining else 503, "", "text/plain")
        elif self.path == "/v1/models":
            max_len = int(State.args.get("--max-model-len", 8192))
            card = {"id": State.served, "object": "model", "owned_by": "vllm", "root": State.model, "max_model_len": max_len}
            self.reply(200, {"object": "list", "data": [card]})
        elif self.path == "/metrics":
            self.reply(200, metrics_text(), "text/plain; version=0.0.4")
        else:
            self.reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if not self.authorized():
            return
        if self.path == "/tokenize":
            self.tokenize()
            return
        if self.path == "/standin/hang":  # test-only: the engine stops stepping now
            State.hung.set()
            print("WARNING stand-in: POST /standin/hang, the engine takes no more steps", flush=True)
            self.reply(200, {"hung": True})
            return
        after = os.environ.get("STANDIN_HANG_AFTER")
        with State.lock:
            State.asked += 1
            if after is not None and State.asked > int(after) and not State.hung.is_set():
                State.hung.set()
                print(f"WARNING stand-in: STANDIN_HANG_AFTER={after}, the engine takes no more steps", flush=True)
        with State.lock:
            State.inflight += 1
        try:
            time.sleep(float(os.environ.get("STANDIN_REQUEST_SECONDS", "0")))
            self.complete()
        finally:
            with State.lock:
                State.inflight -= 1

    def tokenize(self) -> None:
        """vLLM's /tokenize (TokenizeCompletionRequest or TokenizeChatRequest -> TokenizeResponse), with the stand-in's
        tokenizer: one token per whitespace-separated word, its id a stable hash. vllm-router's cache_aware policy
        calls it to key its prefix tree by token ids (it tries /v1/completions/render first: 404 here, as in vLLM with its opt-in scale-out endpoints off)."""
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", [])) if "messages" in body else str(body.get("prompt", ""))
        tokens = [zlib.crc32(word.encode()) % VOCAB for word in text.split()]
        strs = text.split() if body.get("return_token_strs") else None
        self.reply(200, {"count": len(tokens), "max_model_len": ENGINE[0].length, "tokens": tokens, "token_strs": strs})

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
        if os.environ.get("STANDIN_FAIL_COMPLETIONS") == "1":
            # vLLM's engine core dying at its first forward pass (vllm#34641): a 500, then the server exits.
            message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
            self.reply(500, {"error": {"message": message, "type": "InternalServerError", "code": 500}})
            print("ERROR stand-in: STANDIN_FAIL_COMPLETIONS=1, the engine died at its first forward pass", flush=True)
            threading.Timer(0.5, lambda: os._exit(1)).start()
            return
        if body.get("model") != State.served:
            message = f"The model `{body.get('model')}` does not exist."
            self.reply(404, {"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}})
            return
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if self.path == "/v1/completions":
            prompt = str(body.get("prompt", ""))
        else:
            prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        prompt_len = len(prompt.split())
        text = " " + " ".join(["tok"] * max_tokens) if body.get("ignore_eos") else completion_text(prompt, max_tokens)
        used = len(text.split())
        if body.get("stream"):
            every = int(os.environ.get("STANDIN_FAIL_EVERY", "0"))
            with State.lock:
                State.streamed += 1
                lost = every > 0 and State.streamed % every == 0
            if lost:
                message = f"stand-in: STANDIN_FAIL_EVERY={every}, streamed completion {State.streamed} failed"
                self.reply(500, {"error": {"message": message, "type": "InternalServerError", "code": 500}})
                return
            self.stream(prompt.split(), text.split(), body)
            return
        if State.hung.is_set():  # it waits for a step that never comes
            with State.lock:
                State.waiting += 1
        stepped(prompt_len + used)
        State.requests += 1
        State.prompt_tokens += prompt_len
        State.generation_tokens += used
        usage = {"prompt_tokens": prompt_len, "completion_tokens": used, "total_tokens": prompt_len + used}
        if self.path == "/v1/completions":
            choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "length"}
            kind = "text_completion"
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text.strip()}, "finish_reason": "length"}
            kind = "chat.completion"
            if body.get("logprobs"):  # vLLM's ChatCompletionLogProbs: one entry per generated token
                choice["logprobs"] = {
                    "content": [{"token": w, "logprob": 0.0, "bytes": list(w.encode()), "top_logprobs": []} for w in text.split()]
                }
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

    def stream(self, prompt_words: list[str], words: list[str], body: dict[str, Any]) -> None:
        """Server-sent events as vLLM streams them: one chunk per token, usage at the end, then [DONE]."""
        prompt_len = len(prompt_words)
        chat = self.path == "/v1/chat/completions"
        kind = "chat.completion.chunk" if chat else "text_completion"
        ident = f"cmpl-standin-{time.monotonic_ns()}"
        engine = ENGINE[0]
        held = prompt_len + int(body.get("max_tokens") or len(words))
        with State.lock:
            State.waiting += 1
        engine.admit(held)
        with State.lock:
            State.waiting -= 1
            State.running += 1
            State.kv_tokens += prompt_len
        started = time.monotonic()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            engine.prefill(prompt_words)
            stepped(prompt_len)
            last = started
            for i, word in enumerate(words):
                if i:
                    time.sleep(engine.step())
                    stepped(1)
                    with State.lock:
                        State.itls.append(time.monotonic() - last)
                last = time.monotonic()
                text = (" " if i else "") + word
                delta: dict[str, Any] = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                delta["finish_reason"] = "length" if i == len(words) - 1 else None
                self.event({"id": ident, "object": kind, "created": int(time.time()), "model": State.served, "choices": [delta]})
                if i == 0:
                    with State.lock:
                        State.ttfts.append(time.monotonic() - started)
                with State.lock:
                    State.kv_tokens += 1
            usage = {"prompt_tokens": prompt_len, "completion_tokens": len(words), "total_tokens": prompt_len + len(words)}
            if (body.get("stream_options") or {}).get("include_usage"):
                self.event({"id": ident, "object": kind, "created": int(time.time()), "model": State.served, "choices": [], "usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        finally:
            engine.release(held)
            with State.lock:
                State.running -= 1
                State.kv_tokens -= prompt_len + len(words)
                State.requests += 1
                State.prompt_tokens += prompt_len
                State.generation_tokens += len(words)

    def event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()


def check_offline_cache(model: str) -> None:
    """With HF_HUB_OFFLINE=1, vLLM loads only what the Hugging Face cache holds: fail as it does when it is not there."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on") or model.startswith("/"):
        return
    repo = os.path.join(os.environ.get("HF_HOME", "/root/.cache/huggingface"), "hub", "models--" + model.replace("/", "--"))
    if not glob(os.path.join(repo, "snapshots", "*", "config.json")):
        print(
            f"OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached "
            f"files ({repo}). Check your internet connection or see how to run the library in offline mode.",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)
    print(f"INFO stand-in: HF_HUB_OFFLINE=1, {model} found in the Hugging Face cache", flush=True)


def join_ray(tp: int, pp: int, model: str, args: dict[str, Any]) -> None:
    """Do what vLLM's Ray executor does: join the cluster, reserve the GPUs, start workers on them.

    One actor per pipeline stage holds that stage's TP GPUs (vLLM has one per GPU;
    one per stage keeps the stand-in light). Each builds its ranks' compile step on its
    own node, in the cache its Ray container mounts (:func:`build`); the driver logs one
    compile step for the start (cold when any node compiled). Healthy only once every
    actor runs; exit 1 when one dies, as vLLM does when a Ray worker is lost, so that
    systemd restarts the instance and its unit waits for the cluster again.
    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0)
    class Stage:
        def ping(self) -> str:
            return str(ray.get_runtime_context().get_node_id())

        def build(self, ranks: str) -> tuple[bool, float] | None:
            return build(model, args, ranks)

        def hold(self) -> None:
            """Answers only when the actor is gone (its answer is then the error): the driver waits on it, where a
            ping every 2 s kept every Stage and the driver busy for as long as the cluster served."""
            threading.Event().wait()

    ray.init(address="auto", logging_level="ERROR")
    nodes = [n for n in ray.nodes() if n["Alive"]]
    print(f"INFO stand-in joined Ray: {len(nodes)} nodes, {ray.cluster_resources().get('GPU', 0):g} GPUs; needs {tp * pp}", flush=True)
    group = placement_group([{"GPU": tp}] * pp, strategy="SPREAD")
    ray.get(group.ready())
    stages = [
        Stage.options(num_gpus=tp, scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)).remote()
        for i in range(pp)
    ]
    placed = ray.get([s.ping.remote() for s in stages])
    print(f"INFO stand-in placement group of {tp * pp} GPUs ready on {len(set(placed))} nodes", flush=True)
    # vLLM's ranks: the driver's node first, then the others by address (sort_by_driver_then_worker_ip).
    here, address = ray.get_runtime_context().get_node_id(), {n["NodeID"]: n["NodeManagerAddress"] for n in nodes}
    order = sorted(range(pp), key=lambda i: (placed[i] != here, address.get(placed[i], ""), i))
    first = {stage: position * tp for position, stage in enumerate(order)}
    built = [b for b in ray.get([s.build.remote(f"rank_{first[i]}_0") for i, s in enumerate(stages)]) if b is not None]
    log_build((all(hit for hit, _ in built), max(seconds for _, seconds in built)) if built else None)
    State.ready = True
    try:
        ray.get([s.hold.remote() for s in stages])
    except Exception as exc:  # RayActorError, ActorDiedError, ActorUnavailableError: a worker is gone
        print(f"ERROR stand-in: lost a Ray worker ({type(exc).__name__}); exiting like vLLM", flush=True)
    os._exit(1)


def compile_key(model: str, args: dict[str, Any]) -> str:
    """What this vLLM version's compile cache key covers, from its own source (the knowledge table): the model, the
    engine's settings from its argv (the server's own flags, TABLE["frontend"], aside: two hosts serving one model
    with one configuration on different ports share one cache) and the env vars its ``compile_factors`` hash
    (TABLE["compile_env"]; VLLM_CACHE_ROOT and VLLM_HOST_IP are not among them)."""
    frontend = set(TABLE["frontend"])
    engine = {k: v for k, v in args.items() if k not in frontend}
    hashed = set(TABLE["compile_env"])
    env = {k: v for k, v in os.environ.items() if k in hashed}
    return hashlib.sha256(json.dumps([model, engine, env], sort_keys=True).encode()).hexdigest()[:16]


def log_phase(phase: str, *values: object) -> None:
    """Print a start-up line as this vLLM version logs it (TABLE["startup_log"], the format strings of its source):
    a leading %s (a logger prefix) takes nothing, every other conversion the next value."""
    formats = TABLE.get("startup_log", {}).get(phase)
    if not formats:
        return
    fmt, queue = formats[-1], list(values)

    def fill(m: re.Match[str]) -> str:
        if m.start() == 0 and m.group() == "%s":
            return ""
        value = queue.pop(0) if queue else 0
        return m.group() % value if m.group() != "%s" else str(value)

    print("INFO " + re.sub(r"%(?:\.\d+)?[sdf]", fill, fmt), flush=True)


def build(model: str, args: dict[str, Any], ranks: str = "") -> tuple[bool, float] | None:
    """STANDIN_COMPILE_S: the compile step of a cold start (torch.compile, Triton, AITER's JIT modules), skipped when
    VLLM_CACHE_ROOT holds an entry for this configuration's key (and ``ranks``: a Ray node builds its own ranks'
    entries, under ``rank_<first>_0`` as vLLM keeps them), and written after it. Before it, an AITER build lock
    under AITER_JIT_DIR blocks the start while it exists, as AITER's FileBaton waits on a lock whose holder it
    cannot see (an old-format lock from another PID namespace: aiter#5266). (hit, seconds); None: no compile step."""
    seconds = float(os.environ.get("STANDIN_COMPILE_S", "0"))
    root, jit = os.environ.get("VLLM_CACHE_ROOT"), os.environ.get("AITER_JIT_DIR")
    if seconds <= 0 or not root:
        return None
    started = time.monotonic()
    for lock in sorted(glob(os.path.join(jit, "**", "lock"), recursive=True)) if jit else []:
        print(f"INFO stand-in waiting for baton release at {lock}", flush=True)
        while os.path.exists(lock):
            time.sleep(0.5)
    entry = os.path.join(root, "torch_compile_cache", compile_key(model, args), ranks, "done")
    if os.path.exists(entry):
        print(f"INFO stand-in compile cache hit: {os.path.dirname(entry)} (warm start)", flush=True)
        return True, time.monotonic() - started
    print(f"INFO stand-in compile cache miss: compiling for {seconds:g}s (cold start)", flush=True)
    time.sleep(seconds)
    os.makedirs(os.path.dirname(entry), exist_ok=True)
    with open(entry + ".tmp", "w") as handle:
        handle.write(f"compiled in {time.monotonic() - started:.1f}s\n")
    os.replace(entry + ".tmp", entry)
    return False, time.monotonic() - started


def log_build(result: tuple[bool, float] | None) -> None:
    """The start-up lines vLLM logs for its compile step: a cache hit or a miss, and how long it took."""
    if result is not None:
        hit, seconds = result
        log_phase("cache-hit" if hit else "cache-miss", "(1, 8192)", seconds)
        log_phase("compile", seconds)


def compile_or_reuse(model: str, args: dict[str, Any]) -> None:
    """A single-node start's compile step, in this process (a Ray cluster's nodes build theirs: join_ray)."""
    log_build(build(model, args))


def drain(timeout: float) -> None:
    """SIGTERM: with --shutdown-timeout, answer 503 on /health and wait for in-flight requests, as vLLM does."""
    State.draining = True
    end = time.monotonic() + timeout
    while State.inflight and time.monotonic() < end:
        time.sleep(0.1)
    print(f"INFO stand-in shutting down ({State.inflight} requests still in flight)", flush=True)
    sys.exit(0)


def main() -> None:
    if sys.argv[1:3] == ["bench", "serve"]:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_standin

        sys.exit(bench_standin.main(sys.argv[3:]))
    model, args = parse(sys.argv[1:])
    check_startup(model, args)
    check_devices(args)
    token_path = os.environ.get("HF_TOKEN_PATH")
    if token_path:
        with open(token_path) as handle:
            print(f"INFO Hugging Face token read from {token_path} ({len(handle.read().strip())} characters)", flush=True)
    check_offline_cache(model)
    State.model = model
    State.served = str(args.get("--served-model-name") or model)
    State.args = args
    ENGINE.append(Engine(args))
    signal.signal(signal.SIGTERM, lambda *_: drain(float(args.get("--shutdown-timeout", 0))))
    if args.get("--distributed-executor-backend") == "ray":
        tp, pp = int(args.get("--tensor-parallel-size", 1)), int(args.get("--pipeline-parallel-size", 1))
        State.ready = False
        threading.Thread(target=join_ray, args=(tp, pp, model, args), daemon=True).start()
    # A real server loads weights before it listens; keep a short, visible delay.
    loading = float(os.environ.get("STANDIN_STARTUP_SECONDS", "2"))
    time.sleep(loading)
    log_phase("weights", 0.52, loading)
    if args.get("--distributed-executor-backend") != "ray":
        compile_or_reuse(model, args)
    log_phase("graph-capture", 0, 0.1)
    if os.environ.get("STANDIN_CRASH_AT_START") == "1":
        print("ERROR stand-in: STANDIN_CRASH_AT_START=1, exiting as a broken configuration would", flush=True)
        sys.exit(1)
    refused = ENGINE[0].refuses()
    if refused is not None:  # after the weights load and the memory profile, as vLLM finds it
        print(f"ERROR {refused}", file=sys.stderr, flush=True)
        sys.exit(1)
    if os.environ.get("STANDIN_NEVER_HEALTHY") == "1":
        State.ready = False
        print("WARNING stand-in: STANDIN_NEVER_HEALTHY=1, /health will stay 503", flush=True)
    host = str(args.get("--host") or "0.0.0.0")
    port = int(args.get("--port", 8000))
    print(f"INFO stand-in vLLM serving {model} as {State.served!r} on {host}:{port} with {json.dumps(args, sort_keys=True)}", flush=True)
    Server((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main()
