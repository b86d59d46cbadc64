"""The pinned vllm-router wheel on the controller: fetched once, checked, and read for the files a router host needs.

Why the controller: router hosts need no package index (as hosts need none for
model weights with ``weights_source``). The controller downloads the wheel once
into its cache, or reads ``router_wheel``, refuses any bytes whose sha256 is not
the one in the router's table, and the deploy copies the wheel's members to each
router host as managed files, so that every one of them is probed, verified and
repaired like any other file.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path

from instinct_fleet.model import router

PLATFORM = "manylinux_2_28_x86_64"  # the wheel's platform tag: glibc 2.28 or newer on x86_64


class WheelError(Exception):
    """The wheel cannot be had or is not the pinned one; the message says why and what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "instinct-fleet" / "wheels"


def _download(version: str, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    argv += ["--platform", PLATFORM, "-d", str(into), f"vllm-router=={version}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise WheelError(f"pip download vllm-router=={version} did not finish: {error}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise WheelError(f"pip download vllm-router=={version} failed ({last}); or set router_wheel to a copy of the wheel")


@cache
def members(version: str, wheel: str | None) -> dict[str, bytes]:
    """The router's files from the pinned wheel (``wheel``: a local copy, else the cache, filled by pip once)."""
    table = router.load(version)
    assert table is not None  # validation (router-version) refused the host otherwise
    path = Path(wheel) if wheel is not None else cache_dir() / table.wheel_file
    if not path.is_file():
        if wheel is not None:
            raise WheelError(f"router_wheel {wheel} is not a file")
        _download(version, path.parent)
        if not path.is_file():
            raise WheelError(f"pip downloaded no {table.wheel_file} into {path.parent}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != table.sha256:
        raise WheelError(
            f"{path} has sha256 {digest}, not vllm-router {version}'s {table.sha256}: remove it, or point router_wheel at the release's wheel"
        )
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {name: zf.read(name) for name in table.members}
