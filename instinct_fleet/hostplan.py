"""One host's plan for a deploy: its validated spec, its preflight facts and what follows.

``deploy.py`` and every file in ``tasks/`` call :func:`plan_for`, so validation
and the preflight fact run once per host and every stage reads the same answer.
Stages branch only on this plan, which does not change during a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from instinct_fleet import preflight, render
from instinct_fleet.defaults import DEFAULTS
from instinct_fleet.inventory import HostData, plan_hosts
from instinct_fleet.preflight import HostReport
from instinct_fleet.spec import HostSpec, ServiceSpec

BASE_PACKAGES = {"curl": "curl"}  # command -> Debian package; curl runs the health checks
CPUPOWER_PACKAGES = {"debian": ("linux-cpupower",), "ubuntu": ("linux-tools-common", "linux-tools-generic")}


@dataclass
class HostPlan:
    spec: HostSpec
    report: HostReport
    errors: list[str]
    warnings: list[str]
    # Operation results later stages key restarts on (for example the image pull).
    changes: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def devices(self, svc: ServiceSpec) -> list[str]:
        return preflight.render_nodes(self.report, svc.gpus)

    @property
    def group_ids(self) -> list[int]:
        """GIDs that own /dev/kfd and /dev/dri on the host, added to the container numerically."""
        return [self.report.group_ids[g] for g in ("video", "render") if g in self.report.group_ids]

    def docker_run(self, svc: ServiceSpec) -> list[str]:
        return render.docker_run(svc, self.spec.settings, self.devices(svc), self.group_ids, self.report.hf_token)

    def unit_vars(self, svc: ServiceSpec) -> dict[str, Any]:
        """Everything templates/vllm.service.j2 reads; the deploy and the verify module both use it."""
        return {
            "unit": render.unit_name(svc),
            "model": svc.model,
            "recipe": svc.recipe,
            "port": svc.port,
            "gpus": ",".join(map(str, svc.gpus)),
            "env_path": render.env_path(svc),
            "docker": render.DOCKER,
            "exec_start": render.exec_line(self.docker_run(svc)),
            "stop_seconds": render.stop_seconds(svc),
        }

    @property
    def missing_packages(self) -> list[str]:
        missing = [] if self.report.docker_version else ["docker.io"]
        missing += [pkg for cmd, pkg in BASE_PACKAGES.items() if cmd not in self.report.commands]
        if self.spec.settings.tune_cpu_idle and "cpupower" not in self.report.commands:
            missing += CPUPOWER_PACKAGES.get(self.report.os_id, CPUPOWER_PACKAGES["debian"])
        return missing

    @property
    def stale_units(self) -> list[str]:
        """vllm-* units this tool wrote earlier for instances no longer in the inventory."""
        wanted = {render.unit_name(s) for s in self.spec.services}
        return sorted(set(self.report.managed_units) - wanted)

    def summary(self) -> str:
        r = self.report
        gpus = r.gpus[0] if r.gpus else None
        model = gpus.model or gpus.market_name if gpus else "no GPU"
        return (
            f"{len(r.gpus)} x {model}, partition {r.compute_partition or '?'}/{r.memory_partition or '?'}, "
            f"amdgpu {r.amdgpu_version or '?'}, ROCm {r.rocm_version or '?'}, firmware {gpus.firmware if gpus else '?'}, "
            f"docker {r.docker_version or 'absent'}"
        )


def build_plan(name: str, groups: tuple[str, ...], data: dict[str, Any], report: HostReport) -> HostPlan:
    """Validation findings and preflight problems for one host, as messages."""
    [(spec, findings)] = plan_hosts([HostData(name, groups, data)])
    errors = [f"{f.key}: {f.message} [{f.rule}]" for f in findings if f.severity == "error"]
    warnings = [f"{f.key}: {f.message} [{f.rule}]" for f in findings if f.severity == "warning"]
    if not errors:
        errors += preflight.hard_problems(report, spec)
    settings = spec.settings
    if settings.tune_kernel_cmdline and report.missing_kernel_args and not settings.tune_reboot:
        warnings.append(f"kernel command line lacks {' '.join(report.missing_kernel_args)}: reboot required (or set tune_reboot = True)")
    if settings.tune_numa_balancing and report.numa_balancing is None:
        warnings.append("kernel.numa_balancing does not exist (kernel without NUMA balancing): nothing to turn off")
    if not report.hf_token:
        warnings.append(f"no Hugging Face token at {settings.hf_token_path}: gated models will fail to download")
    return HostPlan(spec, report, errors, warnings)


_PLANS: dict[str, HostPlan] = {}


def plan_for(host: Any) -> HostPlan:
    """The plan of a pyinfra host, built on first use (one preflight fact per host and run)."""
    if host.name not in _PLANS:
        from instinct_fleet.facts import HostReport as HostReportFact

        data = host.data.dict()
        token_path = str(data.get("hf_token_path", DEFAULTS["hf_token_path"]))
        report = host.get_fact(HostReportFact, token_path=token_path)
        _PLANS[host.name] = build_plan(host.name, tuple(g for g in host.groups), data, report)
    return _PLANS[host.name]
