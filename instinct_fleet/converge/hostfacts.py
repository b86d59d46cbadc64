"""What a host is, as far as rendering its files needs: its validated spec, its preflight facts and its cluster.

:mod:`instinct_fleet.converge.managed` renders a host's desired state from this alone,
before the host plan that carries that state exists; so the plan is made once,
whole (:mod:`instinct_fleet.converge.hostplan`), and nothing fills it in afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from instinct_fleet.converge import preflight
from instinct_fleet.converge.gpuhealth import Quarantine
from instinct_fleet.converge.preflight import HostReport
from instinct_fleet.model import render
from instinct_fleet.model.spec import HostSpec, ServiceSpec


@dataclass(frozen=True)
class ClusterView:
    """What one member needs to know of its cluster, read from every member's preflight facts."""

    node_ip: str
    head_ip: str
    member_ips: tuple[str, ...]


@dataclass(frozen=True)
class HostFacts:
    """A host's spec and facts; ``restoring``: the generation ``instinct-fleet rollback`` puts back
    (path -> content), whose files replace the rendered serving files; ``quarantine``: the units the GPU health
    verdict holds out in this run (converge/gpuhealth.py)."""

    spec: HostSpec
    report: HostReport
    cluster: ClusterView | None = None
    restoring: dict[str, bytes] | None = None
    quarantine: Quarantine | None = None

    def quarantined(self, unit: str) -> bool:
        return self.quarantine is not None and unit in self.quarantine.units

    @property
    def role(self) -> str | None:
        """``head``, ``worker`` or None for a single-node host."""
        return self.spec.cluster.role if self.spec.cluster else None

    @property
    def serves(self) -> tuple[ServiceSpec, ...]:
        return self.spec.serves

    @property
    def has_token(self) -> bool:
        """Whether the host holds a Hugging Face token once this run converges it: the deploy writes one
        (``hf_token_source``), or preflight found the one the operator placed."""
        return self.spec.vars.hf_token_source is not None or self.report.hf_token

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
        """The container env: the instance's, its image's compile cache, plus RCCL settings and VLLM_HOST_IP on a cluster node."""
        env = render.unit_env(self.spec, svc, cluster=self.cluster is not None)
        return env if self.spec.cluster is None or self.cluster is None else {**env, "VLLM_HOST_IP": self.cluster.node_ip}
