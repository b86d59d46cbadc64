"""templates/cache-spread.sh: a compile cache packed on the host that built it, and a copy checked and merged on another.

The scripts run as the roll runs them (beside cache-prepare.sh, which ``receive`` calls), with the
stand-in docker of test_cache_prepare.py answering the image id and the containers that mount a cache.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
from pathlib import Path

from instinct_fleet.converge import templating

from .test_cache_prepare import FAKE_DOCKER, IMAGE


def run(tmp_path: Path, *argv: str, image_id: str = "sha256:aaa") -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    scripts = tmp_path / "etc"
    scripts.mkdir(exist_ok=True)
    for name in ("cache-prepare.sh", "cache-spread.sh"):
        (scripts / name).write_bytes(templating.template_bytes(name))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "IMAGE_ID": image_id, "IN_USE": ""}
    return subprocess.run(["/bin/sh", str(scripts / "cache-spread.sh"), *argv], env=env, capture_output=True, text=True, timeout=30)


def built(cache: Path, key: str = "k1", image_id: str = "sha256:aaa") -> Path:
    """A cache as a unit's start leaves it: its image id, a torch.compile entry, an AITER module, a lock."""
    entry = cache / "vllm" / "torch_compile_cache" / key
    entry.mkdir(parents=True)
    (entry / "done").write_text(f"compiled {key}\n")
    (cache / "aiter" / "module_moe").mkdir(parents=True)
    (cache / "aiter" / "module_moe" / "module_moe.so").write_bytes(b"\x7fELF" + bytes(4096))
    (cache / "aiter" / "module_moe" / "lock").write_text("4242\nsim-gpu-1\n")
    (cache / "tunableop").mkdir()
    (cache / "IMAGE_ID").write_text(image_id + "\n")
    return cache


def pack(tmp_path: Path, cache: Path) -> tuple[Path, dict[str, str]]:
    out = cache.parent / ".spread" / "copy.tar"
    done = run(tmp_path, "pack", str(cache), str(out))
    assert done.returncode == 0, done.stderr
    return out, dict(line.split(" ", 1) for line in done.stdout.splitlines())


def test_a_packed_cache_leaves_its_build_locks_out_and_says_its_sum(tmp_path: Path) -> None:
    cache = built(tmp_path / "a" / "img")
    out, said = pack(tmp_path, cache)
    assert said["id"] == "sha256:aaa" and said["bytes"] == str(out.stat().st_size)
    assert said["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
    assert "vllm/torch_compile_cache/k1/done" in names and "aiter/module_moe/module_moe.so" in names
    assert not any(n.endswith("lock") for n in names)
    assert not list(out.parent.glob("*.part")) and not list(out.parent.glob("*.err"))


def test_a_cache_no_unit_started_on_is_not_packed(tmp_path: Path) -> None:
    (tmp_path / "a" / "img" / "vllm").mkdir(parents=True)
    done = run(tmp_path, "pack", str(tmp_path / "a" / "img"), str(tmp_path / "a" / ".spread" / "c.tar"))
    assert done.returncode == 3 and "no IMAGE_ID" in done.stderr and not (tmp_path / "a" / ".spread" / "c.tar").exists()


def test_a_received_copy_adds_what_the_host_lacks_and_keeps_what_it_has(tmp_path: Path) -> None:
    out, said = pack(tmp_path, built(tmp_path / "a" / "img"))
    mine = built(tmp_path / "b" / "img", key="k0")
    (mine / "aiter" / "module_moe" / "module_moe.so").write_bytes(b"mine")
    (mine / "aiter" / "module_moe" / "lock").unlink()
    bundle = mine.parent / ".spread" / "copy.tar"
    bundle.parent.mkdir()
    bundle.write_bytes(out.read_bytes())
    done = run(tmp_path, "receive", str(mine), IMAGE, "2", str(bundle), said["sha256"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "moved 1"  # the one new torch.compile entry, whole, in one rename
    assert (mine / "vllm" / "torch_compile_cache" / "k1" / "done").read_text() == "compiled k1\n"
    assert (mine / "vllm" / "torch_compile_cache" / "k0" / "done").is_file()
    assert (mine / "aiter" / "module_moe" / "module_moe.so").read_bytes() == b"mine"
    assert not (mine / "aiter" / "module_moe" / "lock").exists()  # the source's lock never travels
    assert (mine / "IMAGE_ID").read_text() == "sha256:aaa\n"
    assert not bundle.exists() and not list(bundle.parent.iterdir())  # the copy and its unpacked stage are gone


def test_a_partial_copy_is_refused_and_nothing_of_it_is_used(tmp_path: Path) -> None:
    out, said = pack(tmp_path, built(tmp_path / "a" / "img"))
    mine = tmp_path / "b" / "img"
    bundle = tmp_path / "b" / ".spread" / "copy.tar"
    bundle.parent.mkdir(parents=True)
    bundle.write_bytes(out.read_bytes()[: out.stat().st_size // 2])  # the upload stopped half way
    done = run(tmp_path, "receive", str(mine), IMAGE, "2", str(bundle), said["sha256"])
    assert done.returncode == 3 and "refused: the copy's sha256 is" in done.stderr and "partial or damaged" in done.stderr
    assert not mine.exists() and not list(bundle.parent.iterdir())


def test_a_copy_built_with_another_image_id_is_refused(tmp_path: Path) -> None:
    out, said = pack(tmp_path, built(tmp_path / "a" / "img"))
    mine = built(tmp_path / "b" / "img", key="k0", image_id="sha256:bbb")
    bundle = tmp_path / "b" / ".spread" / "copy.tar"
    bundle.parent.mkdir()
    bundle.write_bytes(out.read_bytes())
    done = run(tmp_path, "receive", str(mine), IMAGE, "2", str(bundle), said["sha256"], image_id="sha256:bbb")
    assert done.returncode == 3 and "built with image sha256:aaa" in done.stderr and "is sha256:bbb here" in done.stderr
    assert not (mine / "vllm" / "torch_compile_cache" / "k1").exists() and not bundle.exists()


def test_a_copy_for_a_tag_that_moved_here_empties_the_old_build_first(tmp_path: Path) -> None:
    """The receiver's cache was built with the tag's previous image: it is readied as a start would (emptied),
    so that the new entries never sit beside the old image's."""
    out, said = pack(tmp_path, built(tmp_path / "a" / "img"))
    mine = built(tmp_path / "b" / "img", key="old", image_id="sha256:old")
    bundle = tmp_path / "b" / ".spread" / "copy.tar"
    bundle.parent.mkdir()
    bundle.write_bytes(out.read_bytes())
    done = run(tmp_path, "receive", str(mine), IMAGE, "2", str(bundle), said["sha256"])
    assert done.returncode == 0 and "emptying the compile cache built with sha256:old" in done.stderr
    assert sorted(p.name for p in (mine / "vllm" / "torch_compile_cache").iterdir()) == ["k1"]
