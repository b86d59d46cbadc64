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
import tempfile
import zipfile
from functools import cache
from pathlib import Path

from instinct_fleet.model import router

PLATFORM = "manylinux_2_28_x86_64"  # the wheel's platform tag: glibc 2.28 or newer on x86_64


class WheelError(Exception):
    """The wheel cannot be had or is not the pinned one; the message says why and what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "instinct-fleet" / "wheels"


def download(version: str, into: Path) -> None:
    """pip download into a directory of its own, then one rename into the cache: two runs at once (two deploys, a
    deploy and a tune) never read each other's half-written wheel."""
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into) as scratch:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        argv += ["--platform", PLATFORM, "-d", scratch, f"vllm-router=={version}"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise WheelError(f"pip download vllm-router=={version} did not finish: {error}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise WheelError(f"pip download vllm-router=={version} failed ({last}); or set router_wheel to a copy of the wheel")
        for wheel in Path(scratch).glob("*.whl"):
            os.replace(wheel, into / wheel.name)


@cache
def members(version: str, wheel: str | None) -> dict[str, bytes]:
    """The router's files from the pinned wheel (``wheel``: a local copy, else the cache, filled by pip once).

    The members of a checked wheel are kept unpacked in the cache, with their sha256 in a file written last; a run
    without ``router_wheel`` reads them from there and checks each against it, a quarter of the cost of reading,
    checking and unpacking the wheel.
    """
    table = router.load(version)
    assert table is not None  # validation (router-version) refused the host otherwise
    unpacked = cache_dir() / f"vllm-router-{version}-{table.sha256[:16]}"
    kept = _unpacked(unpacked, table.members) if wheel is None else None  # a wheel named in router_wheel is always checked
    if kept is not None:
        return kept
    path = Path(wheel) if wheel is not None else cache_dir() / table.wheel_file
    if not path.is_file():
        if wheel is not None:
            raise WheelError(f"router_wheel {wheel} is not a file")
        download(version, path.parent)
        if not path.is_file():
            raise WheelError(f"pip downloaded no {table.wheel_file} into {path.parent}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != table.sha256:
        raise WheelError(
            f"{path} has sha256 {digest}, not vllm-router {version}'s {table.sha256}: remove it, or point router_wheel at the release's wheel"
        )
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        found = {name: zf.read(name) for name in table.members}
    _unpack(unpacked, found)
    return found


SUMS = "SHA256SUMS"  # written last: a directory without it was cut short and is unpacked again


def _unpacked(directory: Path, names: tuple[str, ...]) -> dict[str, bytes] | None:
    """The members kept in ``directory``, each matching the sum recorded when the checked wheel was unpacked; else None."""
    try:
        sums = dict(line.split("  ", 1)[::-1] for line in (directory / SUMS).read_text().splitlines())
        found = {name: (directory / name).read_bytes() for name in names}
    except (OSError, ValueError):
        return None
    if any(hashlib.sha256(data).hexdigest() != sums.get(name) for name, data in found.items()):
        return None
    return found


def _unpack(directory: Path, found: dict[str, bytes]) -> None:
    """Keep the members for the next run, each written aside and renamed into place (a run reading them at the same
    time sees the old bytes or the new, both checked); a cache that cannot be written only costs the next run the unpacking."""
    try:
        for name, data in found.items():
            target = directory / name
            target.parent.mkdir(parents=True, exist_ok=True)
            aside = target.with_name(f".{target.name}.{os.getpid()}")
            aside.write_bytes(data)
            os.replace(aside, target)
        (directory / SUMS).write_text("".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in sorted(found.items())))
    except OSError:
        return
