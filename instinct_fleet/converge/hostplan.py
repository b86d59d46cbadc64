"""One host's plan for a run: its facts (spec, preflight facts, cluster), its findings and its desired state.

:mod:`instinct_fleet.roll.run` makes one plan per host and run, whole, after every
cluster member's facts are in (a member's files name its peers):
:mod:`instinct_fleet.converge.managed` evaluates the desired state from the host's facts
before the plan exists, and the plan never changes afterwards. Every stage then
reads the same answer: the questions below only compare that desired state with
what the preflight fact read, which does not change during a run.
"""

from __future__ import annotations

from dataclasses import dataclass

from instinct_fleet.converge import generations, state
from instinct_fleet.converge.generations import GenerationPlan
from instinct_fleet.converge.hostfacts import HostFacts
from instinct_fleet.converge.state import Desired, Weights
from instinct_fleet.model.rules import Finding


@dataclass(frozen=True, kw_only=True)
class HostPlan(HostFacts):
    """One host's plan: its facts, its findings and its desired state, made once (:func:`instinct_fleet.roll.plan.plan_inventory`).

    ``reached`` is False when the preflight fact could not be read: the plan then only carries that error.
    """

    errors: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    desired: Desired
    reached: bool = True
    health: tuple[Finding, ...] = ()  # the GPU health verdict's errors: what the quarantine holds out, or a GPU no instance uses

    @property
    def ok(self) -> bool:
        return not self.errors

    # What differs on the host from its desired state, as the preflight fact read it.

    def drifted(self, *paths: str) -> bool:
        """Whether any of these managed files or directories differs on the host from what it should be."""
        files = [f for f in self.desired.files if f.path in paths]
        directories = [d for d in self.desired.directories if d.path in paths]
        return any(state.file_drifts(f, self.report) for f in files) or any(state.directory_drifts(d, self.report) for d in directories)

    def unit_drifted(self, name: str) -> bool:
        """Whether the unit is not enabled and running (or, for a stale one, not stopped and disabled) on the host."""
        return any(state.unit_drifts(u, self.report) for u in self.desired.units if u.name == name)

    @property
    def pulls_image(self) -> bool:
        """Whether the host lacks its serving image (the runtime stage pulls it, one seed host first)."""
        return any(state.image_drifts(i, self.report) for i in self.desired.images if i.stage == "pull")

    def serving_in_place(self, unit: str) -> bool:
        """A unit whose files match, which is enabled and running, and whose instances answered at preflight (never a
        quarantined one: it is stopped on purpose)."""
        if self.quarantined(unit):
            return False
        if self.drifted(*self.desired.unit_files(unit)) or self.unit_drifted(unit):
            return False
        return all(e.port in self.report.healthy_ports for e in self.desired.endpoints if e.unit == unit)

    @property
    def generations(self) -> GenerationPlan:
        """Which generation this run keeps before the serving files change, and where a rollback goes back to."""
        answered = all(e.port in self.report.healthy_ports for e in self.desired.endpoints)
        return generations.plan(self.report.generations, generations.serving_hashes(self.report.file_hashes), answered)

    def source_has(self, weights: Weights) -> bool:
        """Whether ``weights_source`` held a complete download of this model's revision at preflight."""
        return state.source_has(weights, self.report)

    def summary(self) -> str:
        r = self.report
        gpus = r.gpus[0] if r.gpus else None
        model = gpus.model or gpus.market_name if gpus else "no GPU"
        role = f", Ray {self.role} of {self.spec.cluster.name}" if self.spec.cluster else ""
        return (
            f"{len(r.gpus)} x {model}, partition {r.compute_partition or '?'}/{r.memory_partition or '?'}, "
            f"amdgpu {r.amdgpu_version or '?'}, ROCm {r.rocm_version or '?'}, firmware {gpus.firmware if gpus else '?'}, "
            f"docker {r.docker_version or 'absent'}{role}"
        )
