"""The real programs that read what instinct-fleet renders, run on this machine against rendered files.

Why: a validator written by hand only refuses what its author thought of. These run
the reader itself: ``nft -c -f`` in a network namespace of its own (nothing is
loaded), ``systemd-analyze verify`` against a root that holds the executables the
units name, ``promtool check service-discovery`` on a file_sd file, and the
stand-in vLLM's parser and start-up checks on the argv. Each returns "" when the
reader accepts, else what it said.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
NETNS = "instinct-fleet-nft-check"
# The readers by their Debian paths (make unit-deps installs them), never whatever comes first on PATH.
IP, NFT, PROMTOOL, SYSTEMD_ANALYZE = "/sbin/ip", "/usr/sbin/nft", "/usr/bin/promtool", "/usr/bin/systemd-analyze"
STANDIN_VERSION = "0.22.0"  # tests/fleet/fleet.py STANDIN_VERSION


@cache
def _netns() -> str:
    """A network namespace of its own, so that ``nft -c`` parses against an empty ruleset and loads nothing here."""
    if NETNS not in subprocess.run([IP, "netns", "list"], capture_output=True, text=True, check=True).stdout:
        subprocess.run([IP, "netns", "add", NETNS], check=True)
    return NETNS


def nft_check(ruleset: Path) -> str:
    done = subprocess.run([IP, "netns", "exec", _netns(), NFT, "-c", "-f", str(ruleset)], capture_output=True, text=True)
    return "" if done.returncode == 0 else done.stderr.strip()


@cache
def _systemd_root() -> Path:
    """A root for ``systemd-analyze verify --root``: the system's own unit library, so the targets units name exist."""
    root = Path(tempfile.mkdtemp(prefix="instinct-fleet-units-"))
    atexit.register(shutil.rmtree, root, True)
    shutil.copytree("/usr/lib/systemd", root / "usr" / "lib" / "systemd", symlinks=True)
    return root


EXEC = re.compile(r"^Exec(?:Start|StartPre|StartPost|Stop|StopPost|Reload)=[-@:+!]*(/\S+)", re.M)


def units_check(units: dict[str, str]) -> str:
    """``systemd-analyze verify`` of unit files by their host paths, with a stub for every executable they start."""
    root = _systemd_root()
    written = []
    for path, text in units.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(path)
        for executable in EXEC.findall(text):
            stub = root / executable.lstrip("/")
            if not stub.exists():
                stub.parent.mkdir(parents=True, exist_ok=True)
                stub.write_text("#!/bin/sh\n")
                stub.chmod(0o755)
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", f"--root={root}", *written], capture_output=True, text=True)
    for path in written:
        (root / path.lstrip("/")).unlink()
    return "" if done.returncode == 0 and not done.stderr.strip() else (done.stderr or done.stdout).strip()


def targets_check(groups: list[dict[str, Any]]) -> str:
    """promtool reads the file_sd file as Prometheus does; each target must also make the URL Prometheus scrapes."""
    problems = []
    for group in groups:
        for target in group["targets"]:
            try:
                parts = urllib.parse.urlsplit(f"http://{target}/metrics")
                if parts.port is None or not parts.hostname:
                    problems.append(f"{target}: no host and port")
            except ValueError as exc:  # Prometheus's Go url.Parse refuses the same: "invalid port", "too many colons"
                problems.append(f"{target}: {exc}")
    with tempfile.TemporaryDirectory() as tmp:
        sd = Path(tmp) / "targets.json"
        sd.write_text(json.dumps(groups))
        config = Path(tmp) / "prometheus.yml"
        config.write_text(f"scrape_configs:\n  - job_name: fleet\n    file_sd_configs:\n      - files: [{sd}]\n")
        wanted = sum(len(g["targets"]) for g in groups)
        # promtool waits the whole --timeout for discovery: short first, and longer once where a loaded machine
        # (make test runs this beside the end-to-end fleets) had not read the file in time.
        for timeout in ("300ms", "5s"):
            done = subprocess.run(
                [PROMTOOL, "check", "service-discovery", f"--timeout={timeout}", str(config), "fleet"], capture_output=True, text=True
            )
            found = [] if "level=error" in done.stderr else json.loads(done.stdout or "[]")
            if "level=error" in done.stderr or len(found) == wanted:
                break
    if "level=error" in done.stderr:
        problems.append(done.stderr.strip())
    elif len(found) != wanted:
        problems.append(f"promtool discovered {len(found)} targets of {wanted}")
    return "; ".join(problems)


@cache
def standin(version: str = STANDIN_VERSION) -> ModuleType:
    """The stand-in vLLM as the fleet builds it: beside the generated table of ``version`` and the checkpoint table."""
    context = Path(tempfile.mkdtemp(prefix="instinct-fleet-standin-"))
    atexit.register(shutil.rmtree, context, True)
    shutil.copy(ROOT / "tests" / "fleet" / "standin" / "vllm" / "vllm_standin.py", context / "vllm_standin.py")
    shutil.copy(ROOT / "instinct_fleet" / "model" / "knowledge" / f"vllm-{version}.json", context / "vllm-knowledge.json")
    shutil.copy(ROOT / "instinct_fleet" / "model" / "knowledge" / "checkpoints.toml", context / "checkpoints.toml")
    spec = importlib.util.spec_from_file_location("vllm_standin", context / "vllm_standin.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def argv_check(model: str, argv: list[str], env: dict[str, str] | None = None, version: str = STANDIN_VERSION) -> str:
    """The stand-in's argparse-like parser and its start-up checks, on ``vllm serve MODEL ARGV`` in the instance's env."""
    module = standin(version)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), mock.patch.dict(os.environ, env or {}):
            parsed_model, args = module.parse(["serve", model, *argv])
            module.check_startup(parsed_model, args)
    except SystemExit as exc:
        return f"the stand-in exits {exc.code}: {said.getvalue().strip()}"
    return ""
