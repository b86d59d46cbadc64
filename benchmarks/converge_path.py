"""How far a reader follows the converge path: modules, calls and returns, measured by tracing.

Run by hand from a checkout:

    .venv/bin/python benchmarks/converge_path.py

It traces, on the stage harness's fresh host (tests/unit/stages.py), counting only frames of the project's own code
(instinct_fleet/):

- **each stage**: the body of one deploy function of ``instinct_fleet.deploys`` emitting its operations, the fleet
  plan already made (the run makes it once, before any stage, so it is not part of a stage's path);
- **stages**: all of them, in a first deploy's order;
- **desired**: a host's desired state evaluated from its facts (``evaluate.desired``), the plan-time half.

It also follows two values from a host's data to the operation that puts them on the host, through the whole
path (the host's data, its spec and validation, the plan, every stage): a serving flag (``vllm_args``'
``max-num-seqs``, set to a number found nowhere else) and the NUMA sysctl (``kernel.numa_balancing``, which
``tune_numa_balancing`` sets). A module counts where one of its functions holds the value: in a local or its return
value, as a string, bytes, number, or inside a list, dict or one of the converge layer's small records (a file, a
sysctl, a step), three levels deep. The whole spec, facts and plan are not searched, so a function that merely
passes them on does not count; the modules are listed in the order the value first reaches them.

The walk is the one a reader takes: open the stage function, then each function it calls, once per distinct call
(a loop over twenty entries is read once). A comprehension or a nested function is read with the function around
it. A function that pyinfra calls back (an ``_if`` condition, evaluated when the operation runs) is opened, but its
call is not one the code makes, so it is not followed as one. Counted: the **modules** the walk visits, the **functions** it opens, the distinct **calls** it follows (within
a module or across), the **cross**-module ones among them, and its **returns**: the cross-module calls into a module
the walk had already visited and left. The numbers describe one concrete walk; they are for comparing two
versions of the code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from instinct_fleet.converge import evaluate  # noqa: E402
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


def function_of(frame: FrameType) -> tuple[str, str] | None:
    """The module and the function a reader opens for this frame: a comprehension, lambda or nested function is
    read inside the function that holds it."""
    module = module_of(frame)
    return None if module is None else (module, frame.f_code.co_qualname.split(".<locals>.")[0])


def trace(work: Callable[[], object]) -> dict[str, int]:
    """Run ``work`` and count its walk through the project's modules."""
    stack: list[tuple[str, str] | None] = []  # per frame: (module, function) for the project's own, else None
    opened: list[tuple[str, str]] = []  # functions in the order the walk first opens them
    calls: list[tuple[tuple[str, str], tuple[str, str]]] = []  # distinct calls in the order first followed

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call":
            here = function_of(frame)
            if here is not None:
                caller = stack[-1] if stack else None  # a callback pyinfra (or the harness) calls is no call in the code
                if caller is not None and caller != here and (caller, here) not in calls:
                    calls.append((caller, here))
                if here not in opened:
                    opened.append(here)
            stack.append(here)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    cross = [(a, b) for a, b in calls if a[0] != b[0]]
    visited: set[str] = {opened[0][0]} if opened else set()
    returns = 0
    for _, (module, _function) in cross:
        returns += module in visited
        visited.add(module)
    return {
        "modules": len({m for m, _ in opened}),
        "functions": len(opened),
        "calls": len(calls),
        "cross": len(cross),
        "returns": returns,
    }


# The records a value is searched inside: small ones, whose fields are the value's own (a file's content, a step's
# file); the spec, facts and plans carry every value of the host, so a function that hands them on holds none.
OPAQUE = {"HostSpec", "ServiceSpec", "ClusterSpec", "FleetVars", "HostFacts", "HostPlan", "HostReport", "Desired", "FleetPlan"}


def holds(value: object, marker: str, depth: int = 3) -> bool:
    """Whether ``value`` holds ``marker`` (as text, bytes or a number's digits)."""
    if isinstance(value, str | bytes):
        text = value if isinstance(value, str) else value.decode(errors="replace")
        return re.search(rf"(?<![\w.]){re.escape(marker)}(?![\w.])", text) is not None if marker.isdigit() else marker in text
    if isinstance(value, bool) or depth == 0:
        return False
    if isinstance(value, int | float):
        return str(value) == marker
    if isinstance(value, dict):
        return any(holds(k, marker, depth - 1) or holds(v, marker, depth - 1) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(holds(v, marker, depth - 1) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value).__name__ not in OPAQUE:
        return any(holds(getattr(value, f.name), marker, depth - 1) for f in dataclasses.fields(value))
    return False


def follow(marker: str, work: Callable[[], object]) -> list[str]:
    """The project's modules whose functions hold ``marker`` while ``work`` runs, in the order it first reaches them."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "return":
            return
        module = module_of(frame)
        if module is None or module in seen:
            return
        if holds(arg, marker) or any(holds(v, marker) for v in frame.f_locals.values()):
            seen.append(module)

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return seen


def whole_path(patch: pytest.MonkeyPatch, data: dict[str, Any]) -> Callable[[], object]:
    """The host's data planned (spec, validation, facts, desired state), then every stage of a first deploy."""

    def work() -> None:
        plan = stages.plan(data, stages.SimHost())
        with contextlib.ExitStack() as stack:
            bodies = [stack.enter_context(stages.staged(patch, stage, plan))[0] for stage in STAGES]
            for body in bodies:
                body()

    return work


FLAG = "7919"  # max-num-seqs: a number no other value of this host has (checked: the NUMA run does not find it)


def stage_alone(patch: pytest.MonkeyPatch, stage: str, plan: Any) -> dict[str, int]:
    """The walk of one stage's body; the fleet plan is made before the trace starts."""
    with stages.staged(patch, stage, plan) as (body, _ops):
        return trace(body)


def all_stages(patch: pytest.MonkeyPatch, plan: Any) -> dict[str, int]:
    """The walk of every stage in order, each one's fleet plan made outside the trace."""
    with contextlib.ExitStack() as stack:
        bodies = [stack.enter_context(stages.staged(patch, stage, plan))[0] for stage in STAGES]
        return trace(lambda: [body() for body in bodies])


def main() -> None:
    patch = pytest.MonkeyPatch()
    fresh = stages.plan(DATA, stages.SimHost())
    rows = {stage: stage_alone(patch, stage, fresh) for stage in STAGES}
    rows["stages"] = all_stages(patch, fresh)
    rows["desired"] = trace(lambda: evaluate.desired(fresh))
    flag = follow(FLAG, whole_path(patch, {**DATA, "vllm_args": {"max-num-seqs": int(FLAG)}}))
    assert follow(FLAG, whole_path(patch, DATA)) == [], "the flag's marker is found where the flag is not set"
    numa = follow("numa_balancing", whole_path(patch, {**DATA, "tune_numa_balancing": True}))
    patch.undo()
    print(f"{'path':10} {'modules':>7} {'functions':>9} {'calls':>5} {'cross':>5} {'returns':>7}")
    for name, found in rows.items():
        print(f"{name:10} {found['modules']:7} {found['functions']:9} {found['calls']:5} {found['cross']:5} {found['returns']:7}")
    for name, modules in (("serving flag (--max-num-seqs)", flag), ("NUMA sysctl (kernel.numa_balancing)", numa)):
        print(f"{name}: {len(modules)} modules: {' -> '.join(m.removeprefix('instinct_fleet.') for m in modules)}")


if __name__ == "__main__":
    main()
