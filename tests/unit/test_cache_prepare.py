"""templates/cache-prepare.sh, the serving units' ExecStartPre for their image's compile cache, run as systemd runs it.

docker is a stand-in on PATH that answers the two questions the script asks: the image's id
(``docker image inspect``) and which running containers mount a directory (``docker ps --filter volume=``).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from pathlib import Path

from instinct_fleet.converge import templating

IMAGE = "registry.example.com/vllm-openai-rocm:v0.22.0"
FAKE_DOCKER = """#!/bin/sh
case "$1 $2" in
    "image inspect") [ -n "$IMAGE_ID" ] && echo "$IMAGE_ID" && exit 0; exit 1 ;;
    "ps --quiet") for mounted in $IN_USE; do [ "$4" = "volume=$mounted" ] && echo c0ffee; done; exit 0 ;;
esac
exit 2
"""


def prepare(tmp_path: Path, cache: Path, image_id: str = "sha256:aaa", in_use: tuple[Path, ...] = (), keep: int = 2) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    script = tmp_path / "cache-prepare.sh"
    script.write_bytes(templating.template_bytes("cache-prepare.sh"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IMAGE_ID": image_id, "IN_USE": " ".join(map(str, in_use))}
    done = subprocess.run(["/bin/sh", str(script), str(cache), IMAGE, str(keep)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_first_start_makes_the_directories_and_records_the_image(tmp_path: Path) -> None:
    cache = tmp_path / "root" / "vllm-openai-rocm_v0.22.0_0123"
    assert prepare(tmp_path, cache) == ""
    assert sorted(p.name for p in cache.iterdir()) == ["IMAGE_ID", "aiter", "tunableop", "vllm"]
    assert (cache / "IMAGE_ID").read_text() == "sha256:aaa\n"


def test_a_tag_that_moved_to_another_image_empties_the_cache_first(tmp_path: Path) -> None:
    cache = tmp_path / "root" / "img"
    prepare(tmp_path, cache)
    (cache / "vllm" / "torch_compile_cache").mkdir()
    assert prepare(tmp_path, cache).strip() == ""  # the same image: kept
    assert (cache / "vllm" / "torch_compile_cache").is_dir()
    said = prepare(tmp_path, cache, image_id="sha256:bbb")
    assert "emptying the compile cache built with sha256:aaa" in said
    assert not (cache / "vllm" / "torch_compile_cache").exists() and (cache / "IMAGE_ID").read_text() == "sha256:bbb\n"


def test_an_old_format_lock_is_stale_only_when_no_container_uses_the_cache(tmp_path: Path) -> None:
    """pid and host only: under --network host it looks alive forever from another PID namespace (aiter#5266)."""
    cache = tmp_path / "root" / "img"
    prepare(tmp_path, cache)
    lock = cache / "aiter" / "module_moe" / "lock"
    lock.parent.mkdir()
    lock.write_text("1\nsim-gpu-1\n")  # pid 1 is alive on every host: exactly the lock that never looks dead
    prepare(tmp_path, cache, in_use=(cache,))
    assert lock.exists()  # another unit's container shares the cache and may be building
    said = prepare(tmp_path, cache)
    assert "removing stale build lock" in said and not lock.exists()


def test_a_lock_naming_a_pid_namespace_is_stale_once_nothing_runs_in_it(tmp_path: Path) -> None:
    cache = tmp_path / "root" / "img"
    prepare(tmp_path, cache)
    lock = cache / "aiter" / "lock"
    ours = os.readlink("/proc/self/ns/pid")
    lock.write_text(f"1\nsim-gpu-1\n{ours}\n0\n")
    prepare(tmp_path, cache)
    assert lock.exists()  # processes of that namespace run: its builder may be one
    lock.write_text("1\nsim-gpu-1\npid:[1]\n0\n")  # a namespace no process is in: a container that is gone
    prepare(tmp_path, cache, in_use=(cache,))
    assert not lock.exists()


def test_a_flock_lock_stays_while_its_holder_lives(tmp_path: Path) -> None:
    cache = tmp_path / "root" / "img"
    prepare(tmp_path, cache)
    lock = cache / "vllm" / "build.lock"
    lock.write_text(f"{os.getpid()}\nhost\npid:[4026531836]\n123\nflock\n")
    with lock.open() as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a live builder holds its lifetime lock
        prepare(tmp_path, cache)
        assert lock.exists()
    prepare(tmp_path, cache)  # the holder is gone: the kernel released it
    assert not lock.exists()


def test_only_the_most_recently_started_images_are_kept_and_none_in_use(tmp_path: Path) -> None:
    root = tmp_path / "root"
    old, older, current = root / "old", root / "older", root / "current"
    for n, cache in enumerate((older, old)):
        prepare(tmp_path, cache)
        stamp = time.time() - 100 * (2 - n)
        os.utime(cache / "IMAGE_ID", (stamp, stamp))
    said = prepare(tmp_path, current, keep=2, in_use=(older,))
    assert sorted(p.name for p in root.iterdir()) == ["current", "old", "older"]  # older is mounted: kept
    assert "removing" not in said
    said = prepare(tmp_path, current, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["current"] and said.count("removing the compile cache") == 2
