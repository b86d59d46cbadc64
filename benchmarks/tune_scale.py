"""How long `instinct-fleet tune` takes to validate its grid before any host, by fleet and grid size (run by hand).

    .venv/bin/python benchmarks/tune_scale.py [HOSTS ...]

The inventory is benchmarks/plan_scale.py's (8 x TP1 gpt-oss-120b per host, a Ray
cluster in every eighth pair); the sweep varies --max-num-seqs, --max-num-batched-tokens
(and, in the larger grid, one AITER switch) of instance gpt-oss-0 on 4 hosts at once (--max-out 4). Prints
hosts, points and seconds for ``sweeps.check`` (inventory planning and every point).
"""

from __future__ import annotations

import sys
import time

from plan_scale import inventory

from instinct_fleet.commands import sweeps


def main() -> None:
    grids = [
        ({"max-num-seqs": [64, 128, 256], "max-num-batched-tokens": [8192, 16384, 32768]}, {}),
        (
            {"max-num-seqs": [32, 64, 128, 256, 512], "max-num-batched-tokens": [8192, 16384, 32768, 65536, 131072]},
            {"VLLM_ROCM_USE_AITER_MHA": ["0", "1"]},
        ),
    ]
    for size in [int(a) for a in sys.argv[1:]] or [10, 100, 1000]:
        hosts = inventory(size)
        for vary, env in grids:
            sweep = sweeps.Sweep.from_json({"instance": "gpt-oss-0", "vary": vary, "vary_env": env, "max_out": 4})
            started = time.perf_counter()
            checked = sweeps.check(hosts, {h.name for h in hosts}, sweep)
            elapsed = time.perf_counter() - started
            print(f"{size:5d} hosts  {len(sweeps.grid(sweep)):4d} points  {elapsed:6.2f} s  {len(checked.skipped)} skipped")


if __name__ == "__main__":
    main()
