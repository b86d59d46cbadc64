"""How far a reader follows the converge path: modules, cross-module calls and returns, measured by tracing.

Run by hand from a checkout (any commit whose tests/unit/stages.py has ``plan`` and ``emitted``):

    .venv/bin/python benchmarks/converge_path.py

It traces two paths on the stage harness's fresh host (tests/unit/stages.py), counting only frames of the
project's own code (instinct_fleet/):

- **desired**: a host's desired state evaluated from its facts (``managed.desired``);
- **stages**: every stage of ``instinct_fleet.deploys`` in a first deploy emitting its operations, the plan already made;
  then each stage alone.

For each: the modules visited, the functions a reader must open, and the distinct calls that cross from
one function into another module (a loop over twenty entries is read once, so each caller-callee pair counts
once; a call inside one module is not counted: the reader stays in the file). The numbers describe one
concrete walk; they are for comparing two versions of the code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from instinct_fleet.converge import managed  # noqa: E402
from tests.unit import stages  # noqa: E402

STAGES = ("preflight", "tuning", "runtime", "weights", "cluster", "firewall", "exporter", "services", "health")
DATA: dict[str, Any] = {"vllm_allow_from": ["10.0.0.0/8"], "metrics_exporter": True}


def module_of(frame: FrameType) -> str | None:
    path = Path(frame.f_code.co_filename)
    try:
        relative = path.resolve().relative_to(ROOT)
    except ValueError:
        return None
    if relative.parts[0] not in ("instinct_fleet", "tasks"):
        return None
    return ".".join(relative.with_suffix("").parts)


def trace(work: Callable[[], object]) -> dict[str, int]:
    """Run ``work`` and count its walk through the project's modules."""
    stack: list[tuple[str, str] | None] = []  # per frame: (module, function) for the project's own, else None
    functions: set[tuple[str, str]] = set()
    crossings: set[tuple[tuple[str, str], tuple[str, str]]] = set()

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call":
            module = module_of(frame)
            here = None if module is None else (module, frame.f_code.co_qualname)
            if here is not None:
                functions.add(here)
                caller = next((f for f in reversed(stack) if f is not None), None)
                if caller is not None and caller[0] != here[0]:
                    crossings.add((caller, here))
            stack.append(here)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return {"modules": len({m for m, _ in functions}), "functions": len(functions), "crossings": len(crossings)}


def main() -> None:
    patch = pytest.MonkeyPatch()
    fresh = stages.plan(DATA, stages.SimHost())
    facts = getattr(fresh, "host", fresh)  # HostFacts where the plan carries them, else the plan itself
    desired = trace(lambda: managed.desired(facts))
    emitted = trace(lambda: [stages.emitted(patch, stage, fresh) for stage in STAGES])
    each = {stage: trace(lambda stage=stage: stages.emitted(patch, stage, fresh)) for stage in STAGES}
    patch.undo()
    for name, found in (("desired", desired), ("stages", emitted), *each.items()):
        print(f"{name:10} {found['modules']:3} modules {found['functions']:4} functions {found['crossings']:4} cross-module calls")


if __name__ == "__main__":
    main()
