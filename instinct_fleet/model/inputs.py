"""Input safety: no value can add a line, a directive or a command to what the deploy writes.

Every string that reaches a unit file, an env file, daemon.json, an nftables
ruleset or a shell comes from host data. The model in :mod:`instinct_fleet.model.defaults`
checks each value's own form; these rules refuse, before any connection, what a
single field cannot say: control characters anywhere, secrets that belong in
``hf_token_path``, env values vLLM would misread, Ray ports that collide, and
instance names or GPUs given twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from instinct_fleet.model.defaults import DEFAULTS
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.spec import HostSpec

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1 (NEL) and the Unicode line separators
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HUGGINGFACEHUB_API_TOKEN", "VLLM_API_KEY")
SECRET_FLAGS = ("hf-token", "api-key")

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
            home = "vllm_api_key_path" if key.endswith(("api-key", "VLLM_API_KEY")) else "hf_token_path"
            found.add(finding("secret-inline", spec.host, key, f"a secret in {where}; put it in the file {home} on each host"))
    return sorted(found, key=str)


def env_forms(spec: HostSpec) -> list[Finding]:
    """Env values vLLM would silently misread: a lower-case name, or a boolean it does not parse."""
    found: set[Finding] = set()
    for svc in spec.services:
        for name, value in svc.env.items():
            if name.upper().startswith(("VLLM_", "NCCL_", "RCCL_", "HIP_", "ROCM_")) and name != name.upper():
                found.add(
                    finding("env-unknown", spec.host, f"vllm_env.{name}", f"env names are case-sensitive: did you mean {name.upper()}?")
                )
            if BOOLEAN_ENV.match(name) and value not in BOOLEAN_VALUES:
                found.add(
                    finding(
                        "value-format",
                        spec.host,
                        f"vllm_env.{name}",
                        f"{value!r}: vLLM reads only 1/0 or true/false here, anything else leaves it off",
                    )
                )
    return sorted(found, key=str)


def ray_port_layout(spec: HostSpec) -> list[Finding]:
    """Ray's pinned ports: each distinct, none inside the worker range, and the range the right way round."""
    cluster = spec.cluster
    if cluster is None:
        return []
    found = []
    ports = cluster.ports
    if ports["min_worker"] >= ports["max_worker"]:
        found.append(
            finding(
                "ray-ports", spec.host, "ray_ports", f"min_worker ({ports['min_worker']}) must be below max_worker ({ports['max_worker']})"
            )
        )
    seen: dict[int, str] = {}
    for name, port in sorted((k, v) for k, v in ports.items() if k not in ("min_worker", "max_worker")):
        if port in seen:
            found.append(finding("ray-ports", spec.host, f"ray_ports.{name}", f"port {port} is also ray_ports.{seen[port]}"))
        elif ports["min_worker"] <= port <= ports["max_worker"]:
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
    return [*unsafe_values(spec), *secrets_inline(spec), *env_forms(spec), *ray_port_layout(spec), *unique_instances(spec)]
