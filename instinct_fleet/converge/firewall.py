"""The firewall: its nftables ruleset for a host, made in one place from the host's plan, and the unit that loads it.

Ray has no authentication and its ports run code, so they accept only cluster members; vLLM ports accept only
loopback, members and ``vllm_allow_from``; ``prometheus_allow_from`` reaches the metrics; router ports accept
``router_allow_from`` and the serving hosts. ``nft`` itself reads every ruleset the tests make (test_render_host).
"""

from __future__ import annotations

import ipaddress

from instinct_fleet.converge import templating
from instinct_fleet.converge.hostfacts import HostFacts
from instinct_fleet.model import paths, router
from instinct_fleet.model.spec import ClusterSpec


def firewall_unit() -> str:
    return templating.template("firewall.service.j2", nft=paths.NFT, ruleset=paths.FIREWALL_FILE, table=paths.FIREWALL_TABLE)


def ray_ports(cluster: ClusterSpec) -> list[str]:
    """Ray's ports as nftables set elements: single ports and the worker range."""
    single = sorted({p for k, p in cluster.ports.items() if k not in ("min_worker", "max_worker")})
    return [*map(str, single), f"{cluster.ports['min_worker']}-{cluster.ports['max_worker']}"]


def _address_sets(name: str, networks: tuple[str, ...]) -> list[str]:
    """Two nftables sets, ``<name>_v4`` and ``<name>_v6``, of these addresses and networks.

    Overlapping entries are merged first (10.20.5.17 inside 10.20.0.0/16): ``nft -f``
    refuses an interval set whose elements overlap ("conflicting intervals").
    """
    nets = [ipaddress.ip_network(a, strict=False) for a in networks]
    lines = []
    for family, version in (("ipv4_addr", 4), ("ipv6_addr", 6)):
        same = [n for n in nets if n.version == version]
        chosen = [str(n) for n in ipaddress.collapse_addresses(same)]  # type: ignore[type-var]
        lines += [f"    set {name}_v{version} {{", f"        type {family}", "        flags interval"]
        lines += [f"        elements = {{ {', '.join(chosen)} }}"] if chosen else []
        lines += ["    }"]
    return lines


def firewall_ruleset(
    members: list[str],
    ray: list[str],
    vllm_ports: list[int],
    allow_from: tuple[str, ...] | None,
    scrapers: tuple[str, ...] | None = None,
    exporter_port: int | None = None,
    router_ports: tuple[list[int], list[int]] = ([], []),
    router_allowed: tuple[str, ...] | None = None,
) -> str:
    """The table ``inet instinct_fleet``, replaced atomically by ``nft -f`` and kept beside Docker's tables.

    Ray has no authentication and its ports run code, so they accept only cluster
    members; vLLM ports accept only loopback, members and ``vllm_allow_from``.
    ``prometheus_allow_from`` (``scrapers``) may reach the vLLM ports (their
    ``/metrics``) and the exporter's port, which then accepts nobody else.
    ``router_ports`` (client and worker-API ports, metrics ports) accept only
    ``router_allowed`` (``router_allow_from`` and the serving hosts, whose roll calls
    the worker API); the metrics ports accept the scrapers too.
    """
    lines = [
        "# Managed by instinct-fleet: loaded by instinct-fleet-firewall.service.",
        f"table {paths.FIREWALL_TABLE}",
        f"flush table {paths.FIREWALL_TABLE}",
        f"table {paths.FIREWALL_TABLE} {{",
    ]
    v4 = [m for m in members if ipaddress.ip_address(m).version == 4]
    lines += [
        "    set cluster_members {",
        "        type ipv4_addr",
        *([f"        elements = {{ {', '.join(v4)} }}"] if v4 else []),
        "    }",
    ]
    if allow_from is not None:
        lines += _address_sets("vllm_allowed", allow_from)
    if scrapers is not None:
        lines += _address_sets("scrapers", scrapers)
    routed = router_allowed is not None and bool(router_ports[0])
    if routed:
        lines += _address_sets("router_allowed", router_allowed or ())
    lines += ["    chain input {", "        type filter hook input priority filter - 10; policy accept;", '        iif "lo" accept']
    lines += ["        ip saddr @cluster_members accept"]
    if ray:
        lines += [f'        tcp dport {{ {", ".join(ray)} }} counter drop comment "Ray: cluster members only"']
    if scrapers is not None:
        scraped = ", ".join(map(str, sorted({*vllm_ports, *([exporter_port] if exporter_port else [])})))
        if scraped:
            lines += [
                f"        tcp dport {{ {scraped} }} ip saddr @scrapers_v4 accept",
                f"        tcp dport {{ {scraped} }} ip6 saddr @scrapers_v6 accept",
            ]
        if exporter_port:
            lines += [f'        tcp dport {exporter_port} counter drop comment "metrics exporter: prometheus_allow_from only"']
    if allow_from is not None and vllm_ports:
        ports = ", ".join(map(str, sorted(vllm_ports)))
        lines += [
            f"        tcp dport {{ {ports} }} ip saddr @vllm_allowed_v4 accept",
            f"        tcp dport {{ {ports} }} ip6 saddr @vllm_allowed_v6 accept",
            f'        tcp dport {{ {ports} }} counter drop comment "vLLM: vllm_allow_from only"',
        ]
    if routed:
        clients, metrics = router_ports
        every = ", ".join(map(str, sorted({*clients, *metrics})))
        if scrapers is not None and metrics:
            scraped = ", ".join(map(str, sorted(metrics)))
            lines += [
                f"        tcp dport {{ {scraped} }} ip saddr @scrapers_v4 accept",
                f"        tcp dport {{ {scraped} }} ip6 saddr @scrapers_v6 accept",
            ]
        lines += [
            f"        tcp dport {{ {every} }} ip saddr @router_allowed_v4 accept",
            f"        tcp dport {{ {every} }} ip6 saddr @router_allowed_v6 accept",
            f'        tcp dport {{ {every} }} counter drop comment "router: router_allow_from and the serving hosts only"',
        ]
    lines += ["    }", "}"]
    return "\n".join(lines) + "\n"


def firewall(plan: HostFacts) -> str | None:
    """The nftables ruleset for this host, or None when the firewall is not needed or switched off."""
    v, cluster = plan.spec.vars, plan.spec.cluster
    allow, scrapers = v.vllm_allow_from, v.prometheus_allow_from
    routed = router.allowed(plan.spec)
    if not v.firewall or (cluster is None and allow is None and scrapers is None and routed is None):
        return None
    members = list(plan.cluster.member_ips) if plan.cluster else []
    ray = ray_ports(cluster) if cluster else []
    exporter = v.metrics_exporter_port if v.metrics_exporter else None
    ports = [s.port for s in plan.serves]
    if v.watch and ports:  # the watch's /state and /metrics: exactly who may reach the instances' /metrics
        ports.append(v.watch_port)
    pools = plan.spec.pools
    return firewall_ruleset(
        members,
        ray,
        ports,
        None if allow is None else tuple(allow),
        None if scrapers is None else tuple(scrapers),
        exporter,
        ([p.port for p in pools], [p.metrics_port for p in pools]),
        routed,
    )
