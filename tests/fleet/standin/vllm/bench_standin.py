"""STAND-IN for ``vllm bench serve``, for the simulated fleet only. It is not vLLM.

It takes the flags ``instinct-fleet bench`` passes (the names of vLLM's
vllm/benchmarks/serve.py), sends real streaming HTTP load to the instance with
the requested dataset shape and concurrency, measures TTFT, TPOT, ITL and E2EL
on the wire as vLLM's benchmark does, prints vLLM's summary block and, with
``--save-result``, writes the JSON with vLLM's field names. A "token" is a word:
the stand-in server counts prompts and streams output the same way.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import traceback
from datetime import datetime
from typing import Any
from urllib.parse import urlparse


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm bench serve")
    p.add_argument("--backend", default="vllm", choices=["vllm", "openai", "openai-chat"])
    p.add_argument("--base-url")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--tokenizer")
    p.add_argument("--dataset-name", default="random", choices=["random", "sharegpt"])
    p.add_argument("--dataset-path")
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--sharegpt-output-len", type=int)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl")
    p.add_argument("--metric-percentiles", default="99")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--save-detailed", action="store_true")
    p.add_argument("--result-dir")
    p.add_argument("--result-filename")
    p.add_argument("--label")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trust-remote-code", action="store_true")
    return p.parse_args(argv)


def dataset(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(prompt, output tokens) per request."""
    rng = random.Random(args.seed)
    if args.dataset_name == "sharegpt":
        if not args.dataset_path or not os.path.isfile(args.dataset_path):
            sys.exit(f"vllm bench serve: error: --dataset-path {args.dataset_path!r} does not exist")
        with open(args.dataset_path) as handle:
            rows = json.load(handle)
        pairs = []
        for row in rows:
            turns = row.get("conversations", [])
            if len(turns) >= 2:
                pairs.append(
                    (str(turns[0].get("value", "")), args.sharegpt_output_len or max(1, len(str(turns[1].get("value", "")).split())))
                )
        rng.shuffle(pairs)
        return (pairs * (args.num_prompts // max(1, len(pairs)) + 1))[: args.num_prompts]
    low = max(1, int(args.random_input_len * (1 - args.random_range_ratio)))
    out_low = max(1, int(args.random_output_len * (1 - args.random_range_ratio)))
    return [
        (
            " ".join(f"w{rng.randrange(50000)}" for _ in range(rng.randint(low, args.random_input_len))),
            rng.randint(out_low, args.random_output_len),
        )
        for _ in range(args.num_prompts)
    ]


def one_request(url: str, model: str, prompt: str, output_len: int, ignore_eos: bool, chat: bool) -> dict[str, Any]:
    target = urlparse(url)
    body: dict[str, Any] = {"model": model, "max_tokens": output_len, "stream": True, "stream_options": {"include_usage": True}}
    body["ignore_eos"] = ignore_eos
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    start = time.perf_counter()
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
    result: dict[str, Any] = {"success": False, "ttft": 0.0, "itl": [], "latency": 0.0, "output_tokens": 0, "error": ""}
    try:
        headers = {"Content-Type": "application/json"}
        if os.environ.get("OPENAI_API_KEY"):  # as vllm bench serve sends it (vllm/benchmarks/lib/endpoint_request_func.py)
            headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
        conn.request("POST", target.path, json.dumps(body), headers)
        response = conn.getresponse()
        if response.status != 200:
            result["error"] = response.reason or ""  # as vLLM's request functions record it
            return result
        last = start
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                result["output_tokens"] = chunk["usage"]["completion_tokens"]
            if not chunk.get("choices"):
                continue
            now = time.perf_counter()
            if result["ttft"] == 0.0:
                result["ttft"] = now - start
            else:
                result["itl"].append(now - last)
            last = now
        result["latency"] = time.perf_counter() - start
        result["success"] = True
    except OSError as exc:  # vLLM keeps the whole traceback of a request that raised
        result["error"] = "".join(traceback.format_exception(exc))
    finally:
        conn.close()
    return result


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(ordered) - 1)
    return ordered[f] + (ordered[c] - ordered[f]) * (k - f)


def main(argv: list[str]) -> int:
    args = parse(argv)
    base = args.base_url or f"http://{args.host}:{args.port}"
    url = base.rstrip("/") + ("/v1/chat/completions" if args.backend == "openai-chat" else args.endpoint)
    model = args.served_model_name or args.model
    requests = dataset(args)
    concurrency = args.max_concurrency or len(requests)
    print(f"Starting initial single prompt test run... (stand-in vllm bench serve against {url})", flush=True)
    print(f"Traffic request rate: {args.request_rate}\nMaximum request concurrency: {args.max_concurrency}", flush=True)
    results: list[dict[str, Any]] = [{} for _ in requests]
    gate = threading.Semaphore(concurrency)
    done = [0]
    lock = threading.Lock()

    def worker(i: int, prompt: str, out_len: int) -> None:
        try:
            results[i] = one_request(url, model, prompt, out_len, args.ignore_eos, args.backend == "openai-chat")
        finally:
            gate.release()
            with lock:
                done[0] += 1
                if done[0] % max(1, len(requests) // 10) == 0 or done[0] == len(requests):
                    print(f"{done[0]}/{len(requests)} requests done", flush=True)

    started = time.perf_counter()
    threads = []
    for i, (prompt, out_len) in enumerate(requests):
        gate.acquire()
        thread = threading.Thread(target=worker, args=(i, prompt, out_len))
        thread.start()
        threads.append(thread)
        if args.request_rate != float("inf"):
            time.sleep(random.expovariate(args.request_rate))
    for thread in threads:
        thread.join()
    duration = time.perf_counter() - started

    ok = [r for r in results if r.get("success")]
    input_lens = [len(p.split()) for (p, _), r in zip(requests, results, strict=True) if r.get("success")]
    output_lens = [r["output_tokens"] or len(r["itl"]) + 1 for r in ok]
    ttfts = [r["ttft"] for r in ok]
    tpots = [(r["latency"] - r["ttft"]) / (n - 1) for r, n in zip(ok, output_lens, strict=True) if n > 1]
    itls = [x for r in ok for x in r["itl"]]
    e2els = [r["latency"] for r in ok]
    out: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": args.backend,
        "backend": args.backend,
        "label": args.label,
        "model_id": args.model,
        "tokenizer_id": args.tokenizer or args.model,
        "num_prompts": args.num_prompts,
        "request_rate": "inf" if args.request_rate == float("inf") else args.request_rate,
        "burstiness": 1.0,
        "max_concurrency": args.max_concurrency,
        "duration": duration,
        "completed": len(ok),
        "failed": len(requests) - len(ok),
        "total_input_tokens": sum(input_lens),
        "total_output_tokens": sum(output_lens),
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": sum(output_lens) / duration,
        "total_token_throughput": (sum(input_lens) + sum(output_lens)) / duration,
        # Per request, every request in order as vLLM records them (a failed one: 0, no ITLs, its error).
        "input_lens": [len(p.split()) if r.get("success") else 0 for (p, _), r in zip(requests, results, strict=True)],
        "output_lens": [(r["output_tokens"] or len(r["itl"]) + 1) if r.get("success") else 0 for r in results],
        "ttfts": [r.get("ttft", 0.0) if r.get("success") else 0.0 for r in results],
        "itls": [r.get("itl", []) if r.get("success") else [] for r in results],
        "errors": [r.get("error", "") for r in results],
    }
    percentiles = [float(p) for p in args.metric_percentiles.split(",")]
    series = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    print("============ Serving Benchmark Result ============")
    print(f"{'Successful requests:':<40}{len(ok):<10}")
    print(f"{'Benchmark duration (s):':<40}{duration:<10.2f}")
    print(f"{'Request throughput (req/s):':<40}{out['request_throughput']:<10.2f}")
    print(f"{'Output token throughput (tok/s):':<40}{out['output_throughput']:<10.2f}")
    print(f"{'Total Token throughput (tok/s):':<40}{out['total_token_throughput']:<10.2f}")
    for name in args.percentile_metrics.split(","):
        values = [v * 1000 for v in series[name]]
        out[f"mean_{name}_ms"] = statistics.fmean(values) if values else 0.0
        out[f"median_{name}_ms"] = statistics.median(values) if values else 0.0
        out[f"std_{name}_ms"] = statistics.pstdev(values) if values else 0.0
        print(f"{'Mean ' + name.upper() + ' (ms):':<40}{out[f'mean_{name}_ms']:<10.2f}")
        print(f"{'Median ' + name.upper() + ' (ms):':<40}{out[f'median_{name}_ms']:<10.2f}")
        for p in percentiles:
            key = f"p{int(p) if p.is_integer() else p}_{name}_ms"
            out[key] = percentile(values, p)
            print(f"{'P' + str(int(p) if p.is_integer() else p) + ' ' + name.upper() + ' (ms):':<40}{out[key]:<10.2f}")
    print("==================================================", flush=True)
    if not args.save_detailed:  # vLLM keeps the per-request records only with --save-detailed
        for key in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors", "start_times"):
            out.pop(key, None)
    if args.save_result:
        name = (
            args.result_filename
            or f"{args.backend}-{args.request_rate}qps-concurrency{args.max_concurrency}-{args.model.split('/')[-1]}-{out['date']}.json"
        )
        path = os.path.join(args.result_dir or ".", name)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as handle:
            json.dump(out, handle)
    return 0 if ok else 1
