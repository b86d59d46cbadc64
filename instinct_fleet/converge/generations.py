"""Generations: the serving files a host ran, kept on the host, so that a failed roll can put them back.

A *generation* is a copy of a host's serving files (every vLLM and Ray unit file
and env file this tool writes, ``paths.SERVING_FILES``) in a numbered directory
under ``paths.GENERATIONS_DIR``. The file ``healthy`` there names the last
generation that passed the health gate. The unit files name the image, and the
deploy never removes an image, so a generation's image stays on the host.

The state lives on the host, not on the control machine: any machine that runs
the deploy (a laptop, CI, plain ``pyinfra``) sees the same history. The preflight
fact reads it (:func:`probe_command`), :func:`plan` decides from the fact alone
which generation a roll keeps and which a rollback restores, and the roll runs
:func:`save_script` and, after a failed batch, :func:`instinct_fleet.converge.apply.restore`
(instinct_fleet/roll/serving.py).

- Before a host's serving files change, the files it runs now are kept, unless
  they already are the healthy generation. They count as healthy when every
  instance answered at preflight; otherwise the older healthy one stays the
  rollback target.
- After the new files pass the gate, they are kept as the next generation and
  marked healthy.
- ``rolling_keep_generations`` generations are kept, plus the healthy one.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field

from instinct_fleet.model.paths import GENERATIONS_DIR, SERVING_FILES

HEALTHY = f"{GENERATIONS_DIR}/healthy"
PASSED = "passed"  # in a generation's directory: it passed the health gate
_NUMBERS = f"ls -1 {GENERATIONS_DIR} 2>/dev/null | grep -E '^[0-9]+$' | sort -n"


@dataclass(frozen=True)
class Generations:
    """What the preflight fact found: the generations on the host, the healthy one and its files' sha256."""

    numbers: tuple[int, ...] = ()
    healthy: int | None = None
    files: dict[str, str] = field(default_factory=dict)
    # Asked for by ``instinct-fleet rollback``: the generation to go back to and its files' content.
    restore: int | None = None
    restore_files: dict[str, bytes] = field(default_factory=dict)

    @property
    def newest(self) -> int:
        return max(self.numbers, default=0)


@dataclass(frozen=True)
class GenerationPlan:
    """One host's generations in this run, decided before anything runs.

    ``keep``: the generation the files running now are saved as before they change
    (None: they already are the healthy one, or there are none); ``keep_healthy``: whether
    that one counts as healthy; ``target``: what a rollback restores (None: nothing to go
    back to); ``after``: the generation the new files become once they pass the gate;
    ``target_files``: the sha256 of the target's files by path, as the preflight fact read them.
    """

    keep: int | None
    keep_healthy: bool
    target: int | None
    after: int
    target_files: Mapping[str, str] = field(default_factory=dict)


def probe_command(restore: str | None = None) -> str:
    """The fact's part: ``numbers:`` and ``healthy:`` lines, then ``sha256  path`` of the healthy one's files.

    ``restore`` (``instinct-fleet rollback``): a generation number, or ``previous``, the newest generation
    older than the healthy one that passed the gate; a ``restore:`` line names it, and ``file:`` lines
    followed by their base64 give its files.
    """
    files = f"{GENERATIONS_DIR}/$h/files"
    # The shell's own glob and read, where ls, grep, sort and cat took four processes on every run: parse sorts.
    command = (
        f'echo numbers: {GENERATIONS_DIR}/[0-9]*; h=; read -r h 2>/dev/null <{HEALTHY}; echo "healthy: $h"; '
        f'[ -n "$h" ] && [ -d {files} ] && (cd {files} && find . -type f -exec sha256sum {{}} + 2>/dev/null); '
    )
    if restore is None:
        return command + "true"
    if restore == "previous":
        pick = f'for n in $({_NUMBERS}); do if [ "$n" -lt "${{h:-0}}" ] && [ -e {GENERATIONS_DIR}/$n/{PASSED} ]; then t=$n; fi; done; '
    else:
        pick = f"t={int(restore)}; "
    source = f"{GENERATIONS_DIR}/$t/files"
    return command + (
        f"t=''; {pick}"
        f'if [ -n "$t" ] && [ -d {source} ]; then echo "restore: $t"; '
        f'(cd {source} && find . -type f | while read -r f; do echo "file: ${{f#.}}"; base64 -w0 "$f"; echo; done); fi; true'
    )


def parse(text: str) -> Generations:
    numbers: tuple[int, ...] = ()
    healthy_line = restore_line = ""
    files: dict[str, str] = {}
    restore_files: dict[str, bytes] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("numbers:"):  # generation directories (a glob that matched nothing stays as it is)
            numbers = tuple(sorted(int(n) for n in (p.rsplit("/", 1)[-1] for p in line.split()[1:]) if n.isdigit()))
        elif line.startswith("healthy:"):
            healthy_line = line.removeprefix("healthy:").strip()
        elif line.startswith("restore:"):
            restore_line = line.removeprefix("restore:").strip()
        elif line.startswith("file: /"):
            try:
                restore_files[line.removeprefix("file: ")] = base64.b64decode(next(lines, ""), validate=True)
            except binascii.Error:
                continue  # a file cut short: not restorable, and the plan says which is missing
        else:
            digest, _, path = line.partition("  ")
            if path.startswith("./"):
                files[path[1:]] = digest
    healthy = int(healthy_line) if healthy_line.isdigit() and int(healthy_line) in numbers else None
    restore = int(restore_line) if restore_line.isdigit() else None
    return Generations(numbers, healthy, files if healthy is not None else {}, restore, restore_files if restore is not None else {})


def serving_hashes(file_hashes: Mapping[str, str]) -> dict[str, str]:
    """The host's serving files (sha256 by path) out of everything the fact hashed."""
    return {path: digest for path, digest in file_hashes.items() if any(fnmatch.fnmatch(path, g) for g in SERVING_FILES)}


def plan(found: Generations, running: Mapping[str, str], answered: bool) -> GenerationPlan:
    """What this run keeps and where a rollback goes: ``running``, the serving files on the host now;
    ``answered``, whether every instance on the host passed the health check at preflight."""
    newest = found.newest
    healthy = dict(found.files) if found.healthy is not None else {}
    if found.healthy is not None and found.files == dict(running):
        return GenerationPlan(keep=None, keep_healthy=False, target=found.healthy, after=newest + 1, target_files=healthy)
    if not running:  # a fresh host: nothing runs, nothing to go back to
        return GenerationPlan(keep=None, keep_healthy=False, target=found.healthy, after=newest + 1, target_files=healthy)
    keep = newest + 1
    if answered:
        return GenerationPlan(keep=keep, keep_healthy=True, target=keep, after=keep + 1, target_files=dict(running))
    return GenerationPlan(keep=keep, keep_healthy=False, target=found.healthy, after=keep + 1, target_files=healthy)


def save_script(number: int, keep: int, healthy: bool) -> str:
    """Copy the serving files into generation ``number`` (atomically: a cut copy is never a generation), mark
    it healthy when asked, and remove all but the newest ``keep`` generations and the healthy one."""
    d = GENERATIONS_DIR
    tmp = f"{d}/.{number}.tmp"
    globs = " ".join(SERVING_FILES)
    mark = f": > {d}/{number}/{PASSED}; printf '%s\\n' {number} > {HEALTHY}.tmp && mv -f {HEALTHY}.tmp {HEALTHY}; " if healthy else ""
    return (
        f"set -e; mkdir -p {d} && chmod 700 {d}; rm -rf {tmp}; mkdir -p {tmp}/files; "
        f'for f in {globs}; do if [ -e "$f" ]; then mkdir -p "{tmp}/files${{f%/*}}"; cp -p "$f" "{tmp}/files$f"; fi; done; '
        f"rm -rf {d}/{number}; mv {tmp} {d}/{number}; {mark}"
        f"h=$(cat {HEALTHY} 2>/dev/null || true); "
        f'for n in $({_NUMBERS} | head -n -{int(keep)}); do if [ "$n" != "$h" ]; then rm -rf {d}/"$n"; fi; done'
    )
