"""The firewall: its nftables ruleset for a host, made in one place from the host's plan, and the unit that loads it.

Deny by default: only the ports the host serves are open, each to who needs it (:func:`firewall_ruleset`).
Ray has no authentication and its ports run code, so they accept only cluster members; vLLM ports accept only
loopback, members and ``vllm_allow_from``; ``prometheus_allow_from`` reaches the metrics; a router's client and
metrics ports accept ``router_allow_from``, and the router itself (its worker API, on ``router_admin_port``) only the
host, its pools' serving hosts and ``router_admin_from``. ``nft`` itself reads every ruleset the tests make (test_render_host).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from instinct_fleet.converge import templating
from instinct_fleet.converge.hostfacts import HostFacts
from instinct_fleet.model import paths, router
from instinct_fleet.model.spec import ClusterSpec, HostSpec


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


@dataclass(frozen=True)
class Opening:
    """Ports a host serves and who may reach them: the sets ``sources`` (``<name>_v4`` and ``_v6``), and the host's own
    addresses with ``local``; anyone when ``sources`` is None. ``setting`` names who says so. One list of these makes
    both the ruleset and what ``plan`` states, so the two cannot disagree."""

    what: str
    ports: str  # nftables' form: "8000, 9401"
    sources: tuple[str, ...] | None
    setting: str
    local: bool = False

    def rules(self) -> list[str]:
        if self.sources is None:
            return [f'        tcp dport {{ {self.ports} }} accept comment "{self.what}: anyone"']
        found = [f"        tcp dport {{ {self.ports} }} fib saddr type local accept"] if self.local else []
        for name in self.sources:
            found += [
                f"        tcp dport {{ {self.ports} }} ip saddr @{name}_v4 accept",
                f"        tcp dport {{ {self.ports} }} ip6 saddr @{name}_v6 accept",
            ]
        return [*found, f'        tcp dport {{ {self.ports} }} counter drop comment "{self.what}: {self.setting} only"']

    def sentence(self) -> str:
        """Who may reach these ports, in words (``plan``)."""
        return f"{self.what} (port {self.ports}): " + ("anyone" if self.sources is None else self.setting)


def _joined(ports: Iterable[int]) -> str:
    return ", ".join(map(str, sorted(set(ports))))


def openings(
    vllm_ports: list[int],
    allow_from: tuple[str, ...] | None,
    routers: tuple[str, ...] | None = None,
    scrapers: tuple[str, ...] | None = None,
    exporter_port: int | None = None,
    router_ports: tuple[list[int], list[int]] = ([], []),
    router_allowed: tuple[str, ...] | None = None,
    admin_ports: list[int] | None = None,
    ssh_ports: tuple[int, ...] = (22,),
    ssh_allowed: tuple[str, ...] | None = None,
) -> list[Opening]:
    """Every port the host serves, in the ruleset's order, with who may reach it (:func:`firewall_ruleset`)."""
    found = [Opening("SSH", _joined(ssh_ports), None if ssh_allowed is None else ("ssh_allowed",), "ssh_allow_from")]
    if admin_ports:
        found.append(
            Opening(
                "router worker API", _joined(admin_ports), ("router_admin",), "its pools' serving hosts and router_admin_from", local=True
            )
        )
    if exporter_port:
        found.append(Opening("metrics exporter", str(exporter_port), None if scrapers is None else ("scrapers",), "prometheus_allow_from"))
    scraped, also = (("scrapers",), " and prometheus_allow_from") if scrapers is not None else ((), "")
    if vllm_ports and allow_from is None and routers is not None:  # keyed, behind routers: vLLM checks the key on /v1 only
        found.append(Opening("vLLM", _joined(vllm_ports), ("routers", *scraped), "its routers (vllm_api_key_path)" + also))
    elif vllm_ports:
        sources = None if allow_from is None else ("vllm_allowed", *scraped)
        found.append(Opening("vLLM", _joined(vllm_ports), sources, "vllm_allow_from" + also))
    clients, metrics = router_ports
    if clients:
        routed = router_allowed is not None
        found.append(Opening("router clients", _joined(clients), ("router_allowed",) if routed else None, "router_allow_from"))
        found.append(
            Opening("router metrics", _joined(metrics), ("router_allowed", *scraped) if routed else None, "router_allow_from" + also)
        )
    return found


def firewall_ruleset(
    members: list[str],
    ray: list[str],
    vllm_ports: list[int],
    allow_from: tuple[str, ...] | None,
    scrapers: tuple[str, ...] | None = None,
    exporter_port: int | None = None,
    router_ports: tuple[list[int], list[int]] = ([], []),
    router_allowed: tuple[str, ...] | None = None,
    admin_ports: list[int] | None = None,
    admin_allowed: tuple[str, ...] = (),
    routers: tuple[str, ...] | None = None,
    ssh_ports: tuple[int, ...] = (22,),
    ssh_allowed: tuple[str, ...] | None = None,
) -> str:
    """The table ``inet instinct_fleet``, replaced atomically by ``nft -f`` and kept beside Docker's tables.

    Deny by default: the input chain's policy drops, and a packet is let in only as an answer (established or
    related), from loopback, as ICMP or a DHCP answer, from a cluster member (Ray, RCCL, Gloo and torch.distributed
    open their ports at run time; Ray has no authentication and its ports run code, so they accept nobody else), or
    to a port this host serves, from who needs it (:func:`openings`):

    - SSH (``ssh_ports``, the port sshd answered the deploy on): ``ssh_allowed`` (``ssh_allow_from``), else anyone.
    - the routers themselves (``admin_ports``: their worker API): only the host's own addresses and ``admin_allowed``
      (the pools' serving hosts and ``router_admin_from``), always.
    - the exporter's port: the scrapers (``prometheus_allow_from``), else anyone.
    - vLLM ports and the watch's: ``vllm_allow_from`` and the scrapers (their ``/metrics``); else, on a host whose
      instances take a key (``vllm_api_key_path``) and stand behind routers, those routers (``routers``) and the
      scrapers, as vLLM checks the key on its /v1 routes only; else anyone.
    - ``router_ports`` (client ports, metrics ports): ``router_allowed`` (``router_allow_from``; the metrics ports
      the scrapers too), else anyone.
    - any other port, one a process opens at run time included: nobody.
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
    opened = openings(
        vllm_ports, allow_from, routers, scrapers, exporter_port, router_ports, router_allowed, admin_ports, ssh_ports, ssh_allowed
    )
    named = {
        "ssh_allowed": ssh_allowed,
        "router_admin": admin_allowed,
        "scrapers": scrapers,
        "vllm_allowed": allow_from,
        "routers": routers,
        "router_allowed": router_allowed,
    }
    for name in dict.fromkeys(n for o in opened for n in o.sources or ()):
        lines += _address_sets(name, named[name] or ())
    lines += [
        "    chain input {",
        "        type filter hook input priority filter - 10; policy drop;",
        '        iif "lo" accept',
        "        ct state established,related accept",
        '        meta l4proto { icmp, ipv6-icmp } accept comment "ping, path MTU, IPv6 neighbours"',
        '        udp sport 67 udp dport 68 accept comment "DHCP answers"',
        '        udp sport 547 udp dport 546 accept comment "DHCPv6 answers"',
        "        ip saddr @cluster_members accept",
    ]
    if ray:
        lines += [f'        tcp dport {{ {", ".join(ray)} }} counter drop comment "Ray: cluster members only"']
    for opening in opened:
        lines += opening.rules()
    lines += ['        counter comment "dropped by the policy: no port this host serves"', "    }", "}"]
    return "\n".join(lines) + "\n"


def _served(spec: HostSpec, ssh_port: int) -> dict[str, Any]:
    """What the host serves and who may reach it, as :func:`openings` takes it: from the spec alone (and the port sshd
    answers on), so that ``plan`` states, before any connection, what the deploy's ruleset will open."""
    v = spec.vars
    ports = [s.port for s in spec.serves]
    if v.watch and ports:  # the watch's /state and /metrics: exactly who may reach the instances' /metrics
        ports.append(v.watch_port)
    return {
        "vllm_ports": ports,
        "allow_from": None if v.vllm_allow_from is None else tuple(v.vllm_allow_from),
        "routers": router.keyed_routers(spec),
        "scrapers": None if v.prometheus_allow_from is None else tuple(v.prometheus_allow_from),
        "exporter_port": v.metrics_exporter_port if v.metrics_exporter else None,
        "router_ports": ([p.port for p in spec.pools], [p.metrics_port for p in spec.pools]),
        "router_allowed": router.allowed(spec),
        "admin_ports": [p.admin_port for p in spec.pools],
        "ssh_ports": (ssh_port,),
        "ssh_allowed": None if v.ssh_allow_from is None else tuple(v.ssh_allow_from),
    }


def exposure(spec: HostSpec) -> list[str]:
    """What the host's firewall opens to whom, a sentence per port set (``plan``); empty with the firewall off.
    SSH is named at the inventory's port: the deploy opens the one sshd answers on."""
    if not spec.vars.firewall:
        return []
    found = [o.sentence() for o in openings(**_served(spec, spec.ssh_port))]
    if spec.cluster is not None:
        found.insert(1, "Ray, RCCL, Gloo, torch.distributed (every port): the members of its cluster")
    return [*found, "any other port, one opened at run time included: nobody"]


def firewall(plan: HostFacts) -> str | None:
    """The nftables ruleset for this host, or None when the firewall is switched off."""
    spec = plan.spec
    if not spec.vars.firewall:
        return None
    members = list(plan.cluster.member_ips) if plan.cluster else []
    ray = ray_ports(spec.cluster) if spec.cluster else []
    served = _served(spec, plan.report.ssh_port or spec.ssh_port)
    return firewall_ruleset(members, ray, admin_allowed=router.admin_allowed(spec), **served)
