"""Wait until the Ray cluster shows every node and GPU (run by the head's vLLM unit, in the ray-head container).

Managed by instinct-fleet. Arguments: NODES GPUS TIMEOUT_SECONDS. Exit 1 with the
shortfall after the timeout, so that the unit fails with a reason in its journal.
"""

import os
import sys
import time

import ray

nodes, gpus, timeout = (int(a) for a in sys.argv[1:4])
deadline = time.time() + timeout
while True:  # the container runs before Ray in it answers
    try:
        ray.init(address="auto", logging_level="ERROR")
        break
    except ConnectionError as exc:
        if time.time() > deadline:
            print(f"ray head not answering after {timeout}s: {exc}", file=sys.stderr)
            sys.exit(1)
        time.sleep(3)
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    have = sum(n["Resources"].get("GPU", 0) for n in alive)
    if len(alive) >= nodes and have >= gpus:
        print(f"ray cluster ready: {len(alive)} nodes, {have:g} GPUs", flush=True)
        os._exit(0)  # skip Ray's exit hooks, which race its log thread
    if time.time() > deadline:
        print(f"ray cluster not ready after {timeout}s: {len(alive)}/{nodes} nodes, {have:g}/{gpus} GPUs", file=sys.stderr, flush=True)
        os._exit(1)
    time.sleep(3)
