"""Input safety: no value can add a line, a directive or a command to what the deploy writes.

Every string that reaches a unit file, an env file, daemon.json, an nftables
ruleset or a shell comes from host data; these rules refuse, before any
connection, the values that would change the grammar of those files, the
secrets that belong in ``hf_token_path``, and the values whose form the
receiving program (docker, the kernel, vLLM) would reject only after the deploy.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from typing import Any

from instinct_fleet.defaults import DEFAULTS
from instinct_fleet.rules import Finding, finding
from instinct_fleet.spec import HostSpec

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HUGGINGFACEHUB_API_TOKEN")
SECRET_FLAGS = ("hf-token",)
GPU_MODELS = ("MI300X", "MI325X", "MI350X", "MI355X")
MAX_GPUS = 64  # logical GPUs on one host: 8 x CPX is the most an MI300X node shows

# Docker's reference grammar (distribution/reference): domain, lower-case path, tag, digest.
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?/)"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
IMAGE = re.compile(
    rf"^{_DOMAIN}?{_PATH}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{{32,}})?$"
)
MODEL = re.compile(r"^(?:/|[A-Za-z0-9_])[A-Za-z0-9_./-]*$")
SHM = re.compile(r"^[1-9][0-9]*[bkmgBKMG]?$")
USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
NIC = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
REGISTRY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?$")
MIRROR = re.compile(r"^https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[^\s]*)?$")
IB_HCA = re.compile(r"^\^?=?[A-Za-z0-9_]+(?::[0-9]+)?(?:,[A-Za-z0-9_]+(?::[0-9]+)?)*$")
GDR_LEVELS = ("0", "1", "2", "3", "4", "5", "LOC", "PIX", "PXB", "PHB", "SYS")
BOOLEAN_ENV = re.compile(r"^VLLM_(?:ROCM_)?(?:USE|ENABLE|DISABLE)_")
BOOLEAN_VALUES = ("0", "1", "true", "false", "True", "False", "TRUE", "FALSE")


def _strings(value: Any, key: str) -> Iterator[tuple[str, str]]:
    """Every string inside ``value`` (keys included), with the key path that leads to it."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _strings(name, f"{key}.{name}" if isinstance(name, str) else key)
            yield from _strings(item, f"{key}.{name}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _strings(item, f"{key}[{index}]")


def unsafe_values(spec: HostSpec) -> list[Finding]:
    """Control characters (a newline above all) in any instinct-fleet value, wherever it is rendered."""
    found = []
    for name in sorted(DEFAULTS):
        for key, text in _strings(spec.data.get(name), name):
            if CONTROL.search(text):
                found.append(
                    finding(
                        "unsafe-value",
                        spec.host,
                        key,
                        f"{text!r} holds a control character; it would add a line or directive to a unit, env file or ruleset",
                    )
                )
    return found


def secrets_inline(spec: HostSpec) -> list[Finding]:
    """The token in the env (a file, docker inspect) or in argv (ps, the unit): it belongs in hf_token_path."""
    found = set()
    for svc in spec.services:
        inline = [(f"vllm_env.{n}", "the env lands in a file and in docker inspect") for n in SECRET_ENV if n in svc.env]
        inline += [(f"vllm_args.{f}", "argv shows in ps and in the unit") for f in SECRET_FLAGS if f in svc.args]
        for key, where in inline:
            found.add(finding("secret-inline", spec.host, key, f"a token in {where}; put it in the file hf_token_path on each host"))
    return sorted(found, key=str)


def _form(spec: HostSpec, key: str, value: str | None, pattern: re.Pattern[str], what: str) -> list[Finding]:
    if value is None or pattern.match(value):
        return []
    return [finding("value-format", spec.host, key, f"{value!r} is not {what}")]


def value_forms(spec: HostSpec) -> list[Finding]:
    """Values the receiving program would refuse after the deploy, refused before it."""
    settings = spec.settings
    found: list[Finding] = []
    for key, path in (("hf_cache_dir", settings.hf_cache_dir), ("hf_token_path", settings.hf_token_path)):
        if not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/") or path == "/":
            found.append(
                finding(
                    "value-format",
                    spec.host,
                    key,
                    f"{path!r} must be an absolute, normalised path (a relative one becomes a docker volume name)",
                )
            )
    for registry in settings.registry_ca_certs:
        found += _form(
            spec,
            f"docker_registry_ca_certs.{registry}",
            registry,
            REGISTRY,
            "a registry as host[:port] (it names a directory under /etc/docker/certs.d)",
        )
    for registry in settings.insecure_registries:
        found += _form(spec, "docker_insecure_registries", registry, REGISTRY, "a registry as host[:port]")
    for mirror in settings.registry_mirrors:
        found += _form(
            spec, "docker_registry_mirrors", mirror, MIRROR, "a mirror URL with http:// or https:// (dockerd refuses to start otherwise)"
        )
    found += _form(spec, "vllm_shm_size", settings.shm_size, SHM, "a size such as 16g")
    found += _form(spec, "service_user", settings.service_user, USER, "a user name (lower case, at most 32 characters)")
    if spec.services:
        found += _form(
            spec, "vllm_image", spec.services[0].image, IMAGE, "an image reference docker accepts (lower-case repository, tag, digest)"
        )
    for svc in spec.services:
        found += _form(spec, f"{svc.name}.model", svc.model, MODEL, "a model id such as org/name, or an absolute path")
        if ".." in svc.model.split("/"):
            found.append(finding("value-format", spec.host, f"{svc.name}.model", f"{svc.model!r} climbs out of a directory"))
        for name, value in svc.env.items():
            if name.upper().startswith(("VLLM_", "NCCL_", "RCCL_", "HIP_", "ROCM_")) and name != name.upper():
                found.append(
                    finding("env-unknown", spec.host, f"vllm_env.{name}", f"env names are case-sensitive: did you mean {name.upper()}?")
                )
            if BOOLEAN_ENV.match(name) and value not in BOOLEAN_VALUES:
                found.append(
                    finding(
                        "value-format",
                        spec.host,
                        f"vllm_env.{name}",
                        f"{value!r}: vLLM reads only 1/0 or true/false here, anything else leaves it off",
                    )
                )
    if spec.gpu_model not in GPU_MODELS:
        found.append(finding("value-format", spec.host, "gpu_model", f"{spec.gpu_model!r} is not one of {', '.join(GPU_MODELS)}"))
    cluster = settings.cluster
    if cluster is not None:
        found += _form(spec, "cluster_nic", cluster.nic, NIC, "an interface name (at most 15 characters)")
        found += _form(spec, "nccl_ib_hca", cluster.ib_hca, IB_HCA, "a list of RDMA devices such as mlx5_0,mlx5_1")
        if cluster.gdr_level is not None and cluster.gdr_level not in GDR_LEVELS:
            found.append(
                finding("value-format", spec.host, "nccl_net_gdr_level", f"{cluster.gdr_level!r} is not one of {', '.join(GDR_LEVELS)}")
            )
        if cluster.ib_gid_index is not None and not 0 <= cluster.ib_gid_index <= 255:
            found.append(finding("value-format", spec.host, "nccl_ib_gid_index", f"{cluster.ib_gid_index} is not a GID index (0-255)"))
        if cluster.min_nchannels is not None and not 1 <= cluster.min_nchannels <= 256:
            found.append(
                finding("value-format", spec.host, "nccl_min_nchannels", f"{cluster.min_nchannels} is not a channel count (1-256)")
            )
        single = {k: v for k, v in cluster.ports.items() if k not in ("min_worker", "max_worker")}
        seen: dict[int, str] = {}
        for name, port in sorted(single.items()):
            if port in seen:
                found.append(finding("ray-ports", spec.host, f"ray_ports.{name}", f"port {port} is also ray_ports.{seen[port]}"))
            elif cluster.ports["min_worker"] <= port <= cluster.ports["max_worker"]:
                found.append(finding("ray-ports", spec.host, f"ray_ports.{name}", f"port {port} lies in the worker port range"))
            seen.setdefault(port, name)
    return found


def unique_instances(spec: HostSpec) -> list[Finding]:
    found = []
    names = [svc.name for svc in spec.services]
    for name in sorted({n for n in names if names.count(n) > 1}):
        found.append(
            finding(
                "instance-unique",
                spec.host,
                "vllm_instances",
                f"two instances are named {name!r}; the second would overwrite vllm-{name}.service",
            )
        )
    for svc in spec.services:
        repeated = sorted({g for g in svc.gpus if svc.gpus.count(g) > 1})
        if repeated:
            found.append(finding("instance-unique", spec.host, f"{svc.name}.gpus", f"GPU {repeated} listed twice in one instance"))
    return found


def validate_inputs(spec: HostSpec) -> list[Finding]:
    return [*unsafe_values(spec), *secrets_inline(spec), *value_forms(spec), *unique_instances(spec)]
