#!/usr/bin/env python3
"""Extract what a vllm-router release accepts on its command line, and what its wheel holds, from the wheel itself.

Why: the router's settings are validated before any host is touched, and the
rules must be the router's own. Its CLI is one argparse parser built by
``RouterArgs.add_cli_args`` in ``vllm_router/router_args.py`` (standard library
only); this script loads that one file from the wheel, builds the parser, and
writes every option's name, kind, type, choices and default to
``instinct_fleet/model/knowledge/router-<version>.json``, with the wheel's
file name and sha256 (the controller refuses any other bytes) and the members a
host needs to run the Rust router (the extension module, its bundled libraries,
and the two Python modules ``vllm_router.router`` imports).

Usage, from the repository root (pip fetches the wheel from the package registry):

    python scripts/extract_router_knowledge.py 0.1.17
    python scripts/extract_router_knowledge.py path/to/vllm_router-0.1.17-...whl
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from instinct_fleet.converge import routerwheel

OUT_DIR = Path(__file__).resolve().parent.parent / "instinct_fleet" / "model" / "knowledge"
# What `from vllm_router.router import Router` loads: the Python side of the Rust router, without the
# launcher's process-title and MiniLB (debugging) imports, which pull in fastapi, uvicorn and aiohttp.
MODULES = ("vllm_router/__init__.py", "vllm_router/version.py", "vllm_router/router_args.py", "vllm_router/router.py")


def options(router_args_source: str) -> dict[str, dict[str, Any]]:
    """Every long option of the router's parser: kind (switch, value, list), type, choices and default."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "router_args.py"
        path.write_text(router_args_source)
        spec = importlib.util.spec_from_file_location("router_args", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    parser = argparse.ArgumentParser(add_help=False)
    module.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    table: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        name = next((o for o in action.option_strings if o.startswith("--")), None)
        if name is None:
            continue
        if isinstance(action, argparse._StoreTrueAction):
            kind = "switch"
        elif action.nargs in ("*", "+") or isinstance(action, argparse._AppendAction):
            kind = "list"
        else:
            kind = "value"
        entry: dict[str, Any] = {"kind": kind, "type": getattr(action.type, "__name__", "str") if kind != "switch" else "bool"}
        if action.choices:
            entry["choices"] = list(action.choices)
        if isinstance(action.default, (str, int, float, bool)) or action.default is None:
            entry["default"] = action.default
        table[name] = entry
    return dict(sorted(table.items()))


def wheel_for(version: str, into: Path) -> Path:
    routerwheel.download(version, into)  # the controller's own download: same platform, same pip invocation
    return next(into.glob("vllm_router-*.whl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("release", help="a vllm-router version (downloaded with pip) or a wheel file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = Path(args.release) if args.release.endswith(".whl") else wheel_for(args.release, Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            version = json.loads(json.dumps(zf.read("vllm_router/version.py").decode().split("=")[1].strip().strip("\"'")))
            members = [n for n in names if n in MODULES or (n.startswith("vllm_router.libs/") and not n.endswith("/"))]
            members += [n for n in names if n.startswith("vllm_router_rs") and n.endswith(".so")]
            table = {
                "version": version,
                "wheel": {"file": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()},
                "members": sorted(members),
                "options": options(zf.read("vllm_router/router_args.py").decode()),
            }
    out = OUT_DIR / f"router-{version}.json"
    out.write_text(json.dumps(table, indent=2) + "\n")
    print(f"wrote {out}: {len(table['options'])} options, {len(table['members'])} members")


if __name__ == "__main__":
    main()
