"""The canary inside the roll, as pyinfra runs it: one ``vllm bench serve`` run as a fact, and the operation that
measures a canary's instances before the change and after its gate (instinct_fleet/live/canary.py decides)."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api.facts import FactBase
from pyinfra.api.operation import operation
from pyinfra.context import host

from instinct_fleet.converge.operations import failure
from instinct_fleet.live import accuracy, bench, canary, report
from instinct_fleet.model import workload
from instinct_fleet.model.probe import Item


class BenchRun(FactBase[tuple[dict[str, Any] | None, str]]):
    """One ``vllm bench serve`` run (bench.command): vLLM's result JSON, or None and the output's last lines.

    ``run`` tells repeats of the same command apart in pyinfra's log.
    """

    def command(self, script: str, run: int) -> str:
        return f": run {int(run)}; ( {script} ) 2>&1; true"  # a subshell: the script's own exit ends only it

    def process(self, output: list[str]) -> tuple[dict[str, Any] | None, str]:
        return bench.result_of("\n".join(output)), " | ".join(line for line in output[-3:] if line.strip())


def compared(job: workload.Job, runs: Sequence[tuple[workload.Job, int]]) -> str:
    """What one canary comparison is named: its instance, and its concurrency when the profile has several (a job at
    concurrency 1 and one at 64 measure different things: pooled, a slowdown of one hides in the spread of both)."""
    levels = {j.concurrency for j, _ in runs if j.svc.name == job.svc.name}
    return job.svc.name if len(levels) == 1 else f"{job.svc.name} at concurrency {job.concurrency}"


@operation(is_idempotent=False)
def canary_measured(
    phase: str,
    runs: list[tuple[workload.Job, int]],
    measure: Callable[[str, str, str, list[dict[str, Any]], int], str | None],
    hold: Callable[[str, str], None] | None = None,
    asks: Sequence[tuple[str, str]] = (),
    items: Sequence[Item] = (),
    probe: Callable[[str, str, str, Sequence[Item], list[accuracy.Answer], int], str | None] | None = None,
    source: str = "",
    max_tokens: int = 0,
) -> Generator[str, None, None]:
    """Benchmark the canary's instances (``phase``: "before" the stop, "after" the gate), then ask each the accuracy
    probe (``asks``: its name and accuracy.command, ``items``), store the runs and the answers under results/ as
    ``bench`` does, and hand them to ``measure`` and ``probe``. Whatever stops the canary from passing (a
    benchmark or a probe that failed, requests that failed, a regression of speed or answers) is held for the
    rollback (``hold``: after the change, with rolling_on_failure rollback) or fails the host. Changes nothing,
    so it never counts as a change."""
    if not host.state.is_executing:
        return
    folder = Path(host.state.cwd or os.getcwd()) / canary.RESULTS / canary.stamp(phase)
    by_instance: dict[str, list[dict[str, Any]]] = {}
    problem = None
    for index, (job, repeat) in enumerate(runs):
        # The warm-up (canary_warmup discarded requests) comes before each instance's first run of a job.
        warmup = job.spec.vars.canary_warmup if repeat == 0 else 0
        data, tail = host.get_fact(BenchRun, script=bench.command(job, folder.name, None, warmup), run=index)
        if data is None:
            problem = f"canary: vllm bench serve failed {phase} the change ({job.label()}): {tail or 'no output'}"
            break
        canary.store(folder, job, repeat, data)
        failed = report.failed_requests(data)
        if failed is not None:  # its figures count only the requests that succeeded: they measure nothing
            problem = f"canary: {failed} {phase} the change ({job.label()}; the run is kept in {folder})"
            break
        by_instance.setdefault(compared(job, runs), []).append(data)
    if problem is None:
        count = len(by_instance)  # every instance, and every job of a multi-concurrency profile, judged on its own
        found = [p for name, runs_of in by_instance.items() if (p := measure(host.name, phase, name, runs_of, count)) is not None]
        problem = "; ".join(found) or None
    for instance, script in asks if problem is None and probe is not None else ():
        answers, tail = host.get_fact(ProbeRun, script=script, expected=len(items))
        if answers is None or len(answers) != len(items):
            problem = f"canary: {instance}: the accuracy probe's client failed {phase} the change: {tail or 'no output'}"
            break
        saved = accuracy.save(folder / host.name / instance, accuracy.record(items, answers, source, max_tokens))
        wrong = accuracy.failed(answers)
        if wrong is not None:
            problem = f"canary: {instance}: {wrong} {phase} the change (the answers are kept in {saved})"
            break
        assert probe is not None
        problem = probe(host.name, phase, instance, items, answers, len(asks))
        if problem is not None:
            break
    if problem is None:
        host.noop(f"canary measured {phase} the change: {folder}")
    elif hold is not None:
        hold(host.name, problem)
        logger.error(f"{host.print_prefix}{problem}")
        host.noop("canary failed: its batch rolls back")
    else:
        yield failure(problem)


class ProbeRun(FactBase[tuple[list[accuracy.Answer] | None, str]]):
    """The accuracy probe asked of one instance (accuracy.command): its answers, or None and the output's last lines."""

    def command(self, script: str, expected: int) -> str:
        return f": probe of {int(expected)} items; ( {script} ) 2>&1; true"

    def process(self, output: list[str]) -> tuple[list[accuracy.Answer] | None, str]:
        return accuracy.answers_of("\n".join(output)), " | ".join(line for line in output[-3:] if line.strip())
