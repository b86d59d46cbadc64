"""Rules where two features meet: checked on the whole host, not one feature at a time.

Why: each feature validating only its own values let a vLLM instance sit on the
exporter's port, a user's ``vllm_env`` silently fight a variable the deploy derives,
the weights store nest inside the cache it is copied into, and an allow-list entry
with host bits quietly become a whole network. Here every listening port of a host is
in one map, every derived setting names the variable that controls it, and every
security input is taken exactly as written or refused.
"""

from __future__ import annotations

import ipaddress
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

from instinct_fleet.model import render
from instinct_fleet.model.defaults import DEFAULTS, image_tag
from instinct_fleet.model.render import STOP_MARGIN_SECONDS
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.spec import HostSpec, canonical_arg


@dataclass(frozen=True)
class Listener:
    """One port range a feature listens on, and the variable that sets it."""

    kind: str  # "vllm", "ray", "exporter", "router" or "ssh": which rule a collision trips
    what: str  # how the message names it
    key: str  # the variable to change
    low: int
    high: int

    def overlaps(self, other: Listener) -> bool:
        return self.low <= other.high and other.low <= self.high


def listeners(spec: HostSpec) -> list[Listener]:
    """Every port a feature of this host listens on: vLLM instances, the exporter, Ray's ports and range, SSH.

    A Ray worker serves no vLLM endpoint (its head does), so its instance ports are not its own.
    """
    cluster = spec.cluster
    serves = spec.services if cluster is None or cluster.role != "worker" else ()
    found = [Listener("vllm", f"vLLM instance {s.name}", f"{s.name}.port", s.port, s.port) for s in serves]
    if spec.vars.watch and serves:
        found.append(Listener("watch", "the watch", "watch_port", spec.vars.watch_port, spec.vars.watch_port))
    if spec.vars.metrics_exporter:
        port = spec.vars.metrics_exporter_port
        found.append(Listener("exporter", "the device metrics exporter", "metrics_exporter_port", port, port))
    if cluster is not None:
        for name, port in sorted(cluster.ports.items()):
            if name not in ("min_worker", "max_worker"):
                found.append(Listener("ray", f"Ray's {name} port", f"ray_ports.{name}", port, port))
        low, high = cluster.ports["min_worker"], cluster.ports["max_worker"]
        found.append(Listener("ray", f"Ray's worker ports {low}-{high}", "ray_ports.min_worker", low, high))
    for pool in spec.pools:
        found.append(Listener("router", f"the router of {pool.model}", "router_port", pool.port, pool.port))
        found.append(Listener("router", f"the router metrics of {pool.model}", "router_metrics_port", pool.metrics_port, pool.metrics_port))
    found.append(Listener("ssh", "SSH", "ssh_port", spec.ssh_port, spec.ssh_port))
    return found


def _collision_rule(a: Listener, b: Listener) -> str | None:
    """The rule a collision trips; None for Ray against Ray, which ray-ports checks on ray_ports itself."""
    kinds = {a.kind, b.kind}
    if kinds == {"vllm"}:
        return "port-overlap"
    if kinds == {"ray"}:
        return None
    if kinds == {"vllm", "ray"}:
        return "ray-ports"
    return "port-conflict"


def port_map(spec: HostSpec, involving: str | None = None) -> list[Finding]:
    """Every listening port any feature configures is distinct on its host; ``involving``: only collisions with that kind
    (the router's ports are known once the inventory's pools are: :func:`instinct_fleet.model.inventory.plan_hosts`)."""
    found = []
    ports = listeners(spec)
    for i, a in enumerate(ports):
        for b in ports[i + 1 :]:
            rule = _collision_rule(a, b)
            if rule is None or not a.overlaps(b) or (involving is not None and involving not in (a.kind, b.kind)):
                continue
            where = f"port {a.low}" if a.low == a.high else f"ports {a.low}-{a.high}"
            if a.kind == "vllm" and b.kind == "vllm":
                message = f"{a.key.split('.')[0]} and {b.key.split('.')[0]} both use port {a.low}"
                found.append(finding(rule, spec.host, "vllm_instances", message))
            else:
                key = a.key if a.kind != "ssh" else b.key
                found.append(
                    finding(rule, spec.host, key, f"{where} of {a.what} is also {b.what}'s ({b.low}); give one of them another ({b.key})")
                )
    return found


# Env the deploy writes itself, with the variable that controls each: a user value would fight it.
DERIVED_ENV = {
    "HF_HOME": "hf_cache_dir (mounted at vLLM's default HF_HOME)",
    "HF_HUB_CACHE": "hf_cache_dir (mounted at vLLM's default HF_HOME)",
    "HF_TOKEN_PATH": "hf_token_path",
    "VLLM_HOST_IP": "cluster_nic (its address on each node)",
    "NCCL_SOCKET_IFNAME": "cluster_nic",
    "GLOO_SOCKET_IFNAME": "cluster_nic",
    "NCCL_IB_HCA": "nccl_ib_hca",
    "NCCL_IB_GID_INDEX": "nccl_ib_gid_index",
    "NCCL_NET_GDR_LEVEL": "nccl_net_gdr_level",
}


def derived_settings(spec: HostSpec) -> list[Finding]:
    """A user value for a setting the deploy derives is refused, naming the variable that controls it."""
    found = set()
    in_cluster = spec.cluster is not None
    for svc in spec.services:
        for name in svc.env:
            controller = DERIVED_ENV.get(name)
            if controller is None:
                continue
            if not name.startswith("HF_") and not in_cluster:
                continue  # only a cluster node gets the RCCL settings and VLLM_HOST_IP derived
            found.add(
                finding("derived-setting", spec.host, f"vllm_env.{name}", f"the deploy sets {name} from {controller}; set that instead")
            )
    return sorted(found, key=str)


def _inside(path: str, other: str) -> bool:
    path, other = posixpath.normpath(path), posixpath.normpath(other)
    return path == other or path.startswith(other.rstrip("/") + "/")


def separate_paths(spec: HostSpec) -> list[Finding]:
    """Paths that must stay apart: the weights store and the cache it is copied into, the token and either."""
    v = spec.vars
    pairs: list[tuple[str, str | None, str, str | None]] = [("weights_source", v.weights_source, "hf_cache_dir", v.hf_cache_dir)]
    pairs += [
        ("hf_token_path", v.hf_token_path, "hf_cache_dir", v.hf_cache_dir),
        ("hf_token_path", v.hf_token_path, "weights_source", v.weights_source),
    ]
    found = []
    for key, path, other_key, other in pairs:
        if path is None or other is None:
            continue
        if _inside(path, other) or _inside(other, path):
            found.append(
                finding(
                    "path-overlap",
                    spec.host,
                    key,
                    f"{path!r} and {other_key} {other!r} coincide or nest; "
                    + (
                        "the token would be copied and mounted with the cache"
                        if key == "hf_token_path"
                        else "staging would copy the store into itself"
                    ),
                )
            )
    return found


def allow_lists(spec: HostSpec) -> list[Finding]:
    """Allow-list entries are taken as written: host bits set are an error, and a list with the firewall off is too."""
    found = []
    for key in ("vllm_allow_from", "prometheus_allow_from"):
        entries = getattr(spec.vars, key)
        for index, entry in enumerate(entries or ()):
            try:
                ipaddress.ip_network(entry, strict=True)
            except ValueError:
                network = ipaddress.ip_network(entry, strict=False)
                found.append(
                    finding(
                        "allow-from",
                        spec.host,
                        f"{key}[{index}]",
                        f"{entry!r} has host bits set, so it would open the whole {network}; write {str(network)!r}, "
                        f"or {entry.split('/')[0]!r} for the one address",
                    )
                )
        if entries and not spec.vars.firewall:
            found.append(
                finding(
                    "firewall-off", spec.host, key, f"firewall is False, so {key} would not be enforced; set firewall = True or remove it"
                )
            )
    return found


def _timeouts(spec: HostSpec) -> Iterator[Finding]:
    """A restart waits the unit's drain plus docker's stop margin (its TimeoutStopSec, render.stop_seconds): it must
    end before the watchdog calls the host hung. The drain is an instance's own --shutdown-timeout where it sets one."""
    limit = spec.vars.command_timeout
    drains = [("rolling_drain_timeout", spec.vars.rolling_drain_timeout)]
    for svc in spec.services:
        if svc.args.get("shutdown-timeout") is not None:
            drains.append((_arg_key(spec, svc.name, "shutdown-timeout"), render.drain_seconds(svc, spec.vars.rolling_drain_timeout)))
    for key, drain in drains:
        if drain + STOP_MARGIN_SECONDS >= limit:
            yield finding(
                "timeouts",
                spec.host,
                key,
                f"{drain}s plus docker's {STOP_MARGIN_SECONDS}s stop margin is not below command_timeout ({limit}s): "
                "the hung-host watchdog would kill a normal restart; lower it or raise command_timeout",
            )


def _arg_key(spec: HostSpec, instance: str, flag: str) -> str:
    """Where the inventory sets an instance's flag: its own vllm_instances entry, else vllm_args."""
    return next((f"{key}.{flag}" for key, name, args in _arg_layers(spec) if name == instance and flag in args), f"vllm_args.{flag}")


def _arg_layers(spec: HostSpec) -> list[tuple[str, str | None, dict[str, object]]]:
    """Each place the inventory writes flags: (its key, the instance it is for or None for every one, its flags)."""
    layers: list[tuple[str, object, object]] = [("vllm_args", None, spec.data.get("vllm_args"))]
    instances = spec.data.get("vllm_instances")
    if isinstance(instances, list):
        layers += [
            (f"vllm_instances[{i}].args", item.get("name"), item.get("args")) for i, item in enumerate(instances) if isinstance(item, dict)
        ]
    return [(key, name if isinstance(name, str) else None, args) for key, name, args in layers if isinstance(args, dict)]


def duplicate_flags(spec: HostSpec) -> list[Finding]:
    """One flag given twice in one place under two spellings (``tp`` and ``tensor-parallel-size``): which one wins is an accident."""
    table = spec.table
    found = []
    for key, _, args in _arg_layers(spec):
        spellings: dict[str, list[str]] = {}
        for name in args:
            if isinstance(name, str):
                spellings.setdefault(canonical_arg(name, table), []).append(name)
        for flag, names in sorted(spellings.items()):
            if len(names) > 1:
                found.append(
                    finding("flag-twice", spec.host, f"{key}.{names[1]}", f"{' and '.join(names)} are both --{flag}; keep one spelling")
                )
    return found


def unpinned_image(host: str | None, key: str, image: str, example: str) -> list[Finding]:
    """A `latest` or missing tag pulls a different image each run: the vLLM image and the exporter's are pinned alike."""
    if image_tag(image) not in (None, "", "latest"):
        return []
    return [finding("image-unpinned", host, key, f"{image!r} has no pinned tag; use a version tag such as {example!r} or a digest")]


def member(spec: HostSpec) -> dict[str, object]:
    """What a Ray cluster member runs, from the objects the deploy renders it from: every node must agree on all of it.

    Ray places ranks on any node, and each node's Ray container carries its own
    image, env and ports, and stages its own model; a node that differs joins late,
    never joins, or serves a different model. The node's own address and role, and
    host paths each node mounts at the same place in its containers (the cache, the
    weights store), may differ.
    """
    cluster = spec.cluster
    svc = spec.services[0] if spec.services else None
    return {
        "gpu_model": spec.gpu_model,
        "gpu_count": spec.gpu_count,
        "vllm_image": svc.image if svc else None,
        "vllm_version": svc.version if svc else None,
        "vllm_model": svc.model if svc else None,
        "vllm_env": svc.env if svc else None,
        "vllm_args": svc.args if svc else None,
        "vllm_nodes": svc.nodes if svc else None,
        "ray_ports": cluster.ports if cluster else None,
        "ray_ready_timeout": cluster.ready_timeout if cluster else None,
        "infiniband": cluster.infiniband if cluster else None,
    }


def validate_crossings(spec: HostSpec) -> list[Finding]:
    """Every rule of this module for one host."""
    return [
        *port_map(spec),
        *derived_settings(spec),
        *separate_paths(spec),
        *allow_lists(spec),
        *_timeouts(spec),
        *duplicate_flags(spec),
        *(
            unpinned_image(spec.host, "metrics_exporter_image", spec.vars.metrics_exporter_image, DEFAULTS["metrics_exporter_image"])
            if spec.vars.metrics_exporter
            else []
        ),
    ]
