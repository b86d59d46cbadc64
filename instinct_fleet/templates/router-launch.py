"""Start vLLM's Rust router (managed by instinct-fleet) with the router's own parser.

Usage: launch.py RELEASE_DIR WORKERS_FILE [router options...]

Why not the wheel's ``vllm-router`` script: it imports the MiniLB debugging
balancer, which needs fastapi, uvicorn and aiohttp; this does what its main()
does for the Rust router (parse with RouterArgs, validate, start) from the
standard library alone. The pool comes from WORKERS_FILE, one URL per line, so
that the unit does not change when the pool does.
"""

import argparse
import sys

release, workers_file, options = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, release)

from vllm_router.router import Router  # noqa: E402
from vllm_router.router_args import RouterArgs  # noqa: E402

with open(workers_file) as handle:
    workers = [line.strip() for line in handle if line.strip()]
parser = argparse.ArgumentParser(prog="vllm-router")
RouterArgs.add_cli_args(parser, use_router_prefix=False)
args = RouterArgs.from_cli_args(parser.parse_args([*options, "--worker-urls", *workers]), use_router_prefix=False)
args._validate_router_args()
Router.from_args(args).start()
