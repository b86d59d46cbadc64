"""One host's plan for a run: its validated spec, its preflight facts, its findings and its desired state.

:mod:`instinct_fleet.run` makes one plan per host and run (after every cluster
member's facts are in, since a member's files name its peers), and
:mod:`instinct_fleet.managed` evaluates its desired state once. Every stage then
reads the same answer: the questions below only compare that desired state with
what the preflight fact read, which does not change during a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from instinct_fleet import generations, preflight, state
from instinct_fleet.generations import GenerationPlan
from instinct_fleet.preflight import HostReport
from instinct_fleet.rules import Finding
from instinct_fleet.spec import HostSpec, ServiceSpec
from instinct_fleet.state import Desired, Weights


@dataclass(frozen=True)
class ClusterView:
    """What one member needs to know of its cluster, read from every member's preflight facts."""

    node_ip: str
    head_ip: str
    member_ips: tuple[str, ...]


@dataclass
class HostPlan:
    spec: HostSpec
    report: HostReport
    errors: list[Finding]
    warnings: list[Finding]
    cluster: ClusterView | None = None
    facts: bool = True  # False when the preflight fact could not be read: the plan only carries that error
    # instinct-fleet rollback: the generation's serving files (path -> content), which replace the rendered ones.
    restoring: dict[str, bytes] | None = None
    desired: Desired = field(init=False)  # set by run.plan_inventory, once the cluster is known

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def role(self) -> str | None:
        """``head``, ``worker`` or None for a single-node host."""
        return self.spec.cluster.role if self.spec.cluster else None

    @property
    def serves(self) -> tuple[ServiceSpec, ...]:
        return self.spec.serves

    @property
    def image(self) -> str:
        return self.spec.services[0].image

    @property
    def stale_units(self) -> list[str]:
        """vllm-* and ray-* units this tool wrote earlier for instances or a cluster role no longer in the inventory."""
        return sorted(set(self.report.managed_units) - set(self.spec.serving_units))

    def devices(self, svc: ServiceSpec) -> list[str]:
        if self.role is not None:  # a cluster node gives Ray every GPU of the node
            return preflight.render_nodes(self.report, tuple(range(self.spec.gpu_count)))
        return preflight.render_nodes(self.report, svc.gpus)

    @property
    def group_ids(self) -> list[int]:
        """GIDs that own /dev/kfd and /dev/dri on the host, added to the container numerically."""
        return [self.report.group_ids[g] for g in ("video", "render") if g in self.report.group_ids]

    def env(self, svc: ServiceSpec) -> dict[str, str]:
        """The container env: the instance's, plus RCCL settings and VLLM_HOST_IP on a cluster node."""
        cluster = self.spec.cluster
        if cluster is None or self.cluster is None:
            return dict(svc.env)
        return {**svc.env, **cluster.rccl_env(), "VLLM_HOST_IP": self.cluster.node_ip}

    # What differs on the host from its desired state, as the preflight fact read it.

    def drifted(self, *paths: str) -> bool:
        """Whether any of these managed files or directories differs on the host from what it should be."""
        files = [f for f in self.desired.files if f.path in paths]
        directories = [d for d in self.desired.directories if d.path in paths]
        return any(state.file_drifts(f, self.report) for f in files) or any(state.directory_drifts(d, self.report) for d in directories)

    def unit_drifted(self, name: str) -> bool:
        """Whether the unit is not enabled and running (or, for a stale one, not stopped and disabled) on the host."""
        return any(state.unit_drifts(u, self.report) for u in self.desired.units if u.name == name)

    def user_drifted(self) -> bool:
        return state.user_drifts(self.desired, self.report)

    def serving_in_place(self, unit: str) -> bool:
        """A unit whose files match, which is enabled and running, and whose instances answered at preflight."""
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
        complete = self.report.weights.get(weights.source, ("", ""))[0]
        return complete.split(" ")[0] == weights.revision

    def weights_staged(self, weights: Weights) -> bool:
        """Whether the host's HF cache holds the copy of exactly what the source holds."""
        complete, staged = self.report.weights.get(weights.source, ("", ""))
        return bool(staged) and staged == complete and self.source_has(weights)

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
