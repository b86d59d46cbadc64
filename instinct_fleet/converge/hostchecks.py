"""The preflight policy: what a host's facts mean for what its spec asks, each finding with its ``host-*`` rule.

:func:`hard_problems` says why a host cannot serve and how to fix it;
:func:`host_findings` warns about what does not stop it; :func:`restore_problems`
says why ``instinct-fleet rollback`` cannot put a generation back. All are pure,
run on a :class:`~instinct_fleet.converge.preflight.HostReport`.
"""

from __future__ import annotations

from instinct_fleet.converge.preflight import HostReport
from instinct_fleet.model import paths
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.spec import HostSpec


def host_findings(report: HostReport, spec: HostSpec) -> list[Finding]:
    """Warnings about this host that do not stop it serving (host-* rules), each with how to act on it."""
    v, host = spec.vars, spec.host
    warnings = []
    if v.tune_kernel_cmdline and report.missing_kernel_args and not v.tune_reboot:
        warnings.append(
            finding(
                "host-reboot-required",
                host,
                "tune_kernel_cmdline",
                f"kernel command line lacks {' '.join(report.missing_kernel_args)}: reboot required (or set tune_reboot = True)",
            )
        )
    if v.tune_numa_balancing and report.numa_balancing is None:
        warnings.append(
            finding(
                "host-numa-balancing",
                host,
                "tune_numa_balancing",
                "kernel.numa_balancing does not exist (kernel without NUMA balancing): nothing to turn off",
            )
        )
    if not report.hf_token and v.hf_token_source is None:  # a managed token is written by this run
        warnings.append(
            finding(
                "host-hf-token",
                host,
                "hf_token_path",
                f"no Hugging Face token at {v.hf_token_path}: gated models will fail to download",
            )
        )
    return warnings


def restore_problems(report: HostReport, spec: HostSpec, restore: str) -> list[Finding]:
    """Why ``instinct-fleet rollback`` cannot put back generation ``restore`` on this host; empty when it can."""
    found = report.generations
    have = " ".join(map(str, found.numbers)) or "none"
    if found.restore is None and restore == "previous":
        # Nothing older passed the gate here: the change did not touch this host (a Ray worker whose files
        # stayed the same), or it is the first generation. The host keeps what it runs.
        return []
    if found.restore is None:
        why = f"no generation {restore} on this host (generations: {have}; healthy: {found.healthy})"
        return [finding("host-generation", spec.host, "--to", why)]
    wanted = {p for unit in spec.serving_units for p in (paths.unit_path(unit), paths.unit_env_path(unit))}
    if set(found.restore_files) != wanted:
        kept = sorted(p.rsplit("/", 1)[-1] for p in found.restore_files)
        why = f"generation {found.restore} holds {', '.join(kept) or 'nothing'}, the inventory's serving units need {', '.join(sorted(p.rsplit('/', 1)[-1] for p in wanted))}"
        return [finding("host-generation", spec.host, "--to", f"{why}: deploy an inventory with those instances instead")]
    return []


def hard_problems(report: HostReport, spec: HostSpec) -> list[Finding]:
    """Why this host cannot serve its instances, each with its rule and how to fix it. Empty when it can."""
    host = spec.host
    problems = []
    if not report.is_debian_family:
        problems.append(
            finding(
                "host-os",
                host,
                "preflight.os",
                f"the host runs {report.os_id or 'an unknown OS'}; instinct-fleet installs packages and regenerates GRUB on Debian and Ubuntu only",
            )
        )
    if report.smi is None:
        problems.append(
            finding(
                "host-gpu",
                host,
                "preflight.smi",
                "no AMD GPU found: neither amd-smi nor rocm-smi is installed. Install ROCm (amdgpu-install --usecase=rocm) "
                "or remove the host from the inventory",
            )
        )
    elif report.smi_error:
        problems.append(finding("host-gpu", host, "preflight.smi", report.smi_error))
    elif not report.gpus:
        problems.append(
            finding(
                "host-gpu",
                host,
                "preflight.smi",
                f"{report.smi} lists no GPU: check that the amdgpu driver is loaded (dmesg | grep amdgpu)",
            )
        )
    if not report.kfd:
        problems.append(
            finding(
                "host-driver",
                host,
                "preflight./dev/kfd",
                "/dev/kfd is missing: the amdgpu kernel driver is not loaded. Install amdgpu-dkms or load the module (modprobe amdgpu)",
            )
        )
    if report.smi is not None and not report.amdgpu_loaded:
        problems.append(
            finding(
                "host-driver",
                host,
                "preflight.amdgpu",
                "the amdgpu module is not live (/sys/module/amdgpu/initstate): modprobe amdgpu, then check dmesg",
            )
        )
    if problems:
        return problems
    models = sorted({g.model or g.market_name for g in report.gpus})
    if models != [spec.gpu_model]:
        problems.append(
            finding(
                "host-gpu-model",
                host,
                "gpu_model",
                f"gpu_model is {spec.gpu_model} but {report.smi} reports {', '.join(models)}: set gpu_model for this host or group",
            )
        )
    needed = max([g + 1 for svc in spec.services for g in svc.gpus] or [0])
    if len(report.gpus) < max(needed, spec.gpu_count):
        problems.append(
            finding(
                "host-gpu-count",
                host,
                "gpu_count",
                f"{len(report.gpus)} GPUs visible, but gpu_count is {spec.gpu_count} and the instances use GPU indices up to {needed - 1}. "
                f"Check the partition mode (compute {report.compute_partition or 'unknown'}) with amd-smi static --partition, or lower gpu_count",
            )
        )
    cluster = spec.cluster
    if cluster is not None and len(report.gpus) > spec.gpu_count:
        problems.append(
            finding(
                "host-gpu-count",
                host,
                "gpu_count",
                f"{len(report.gpus)} GPUs visible but gpu_count is {spec.gpu_count}: Ray would offer them all to the cluster; "
                "set gpu_count to the GPUs of each node",
            )
        )
    if cluster is not None and cluster.nic is not None and cluster.nic not in report.addresses:
        have = ", ".join(sorted(report.addresses)) or "none with IPv4"
        problems.append(
            finding(
                "host-cluster-nic",
                host,
                "cluster_nic",
                f"cluster_nic {cluster.nic} has no IPv4 address on this host (interfaces: {have}): set cluster_nic for this host or group",
            )
        )
    if cluster is not None and cluster.infiniband and not report.infiniband:
        problems.append(
            finding(
                "host-driver",
                host,
                "infiniband",
                "infiniband is True but /dev/infiniband is missing: install the RDMA drivers (rdma-core) or set infiniband = False",
            )
        )
    problems += api_key_problems(spec, report)
    used = range(spec.gpu_count) if cluster is not None else sorted({g for svc in spec.services for g in svc.gpus})
    missing = sorted({g for g in used if g < len(report.gpus) and report.gpus[g].render_node is None})
    if missing:
        problems.append(
            finding(
                "host-driver",
                host,
                "preflight./dev/dri",
                f"no /dev/dri render node found for GPUs {missing}: check /dev/dri/by-path and the udev rules of the amdgpu driver",
            )
        )
    return problems


def api_key_problems(spec: HostSpec, report: HostReport) -> list[Finding]:
    """``vllm_api_key_path`` must be a non-empty file that only root can read: it holds the key every client needs."""
    path = spec.vars.vllm_api_key_path
    if path is None:
        return []
    fields = (report.api_key or "").split("|")
    if len(fields) != 3:
        return [
            finding("host-api-key", spec.host, "vllm_api_key_path", f"{path} does not exist: write the key there (umask 077), one line")
        ]
    mode, owner, size = fields
    if owner != "root" or int(mode, 8) & 0o077:
        return [
            finding(
                "host-api-key",
                spec.host,
                "vllm_api_key_path",
                f"{path} is mode {mode}, owner {owner}: only root may read it (chown root {path}; chmod 600 {path})",
            )
        ]
    if size == "0":
        return [finding("host-api-key", spec.host, "vllm_api_key_path", f"{path} is empty: write the key there, one line")]
    return []
