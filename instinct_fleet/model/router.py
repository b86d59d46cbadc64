"""vLLM's router in front of the serving instances: the pinned router's CLI, its pools from the inventory, and the rules on both.

Why here, in the model: a router's pool is every serving instance of its model in
the whole inventory, so it follows from every host's spec at once, as a cluster's
members do; it is computed once (:func:`attach`), before any host is touched, and
both sides read the answer: the router host renders its units and worker lists from
``HostSpec.pools``, a serving host drains through ``HostSpec.memberships``.

What the router accepts comes from the router itself: ``knowledge/router-<version>.json``
is generated from the release's wheel (``scripts/extract_router_knowledge.py`` builds its
argparse parser), with the wheel's sha256 and the files a host needs.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from instinct_fleet.model import paths
from instinct_fleet.model.pools import Membership, Pool, Worker
from instinct_fleet.model.render import served_model
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.spec import HostSpec

# The router options a variable sets (or the pool does): router_flags may not set them too.
MANAGED = {
    "--host": "the router listens on every address",
    "--port": "router_admin_port (clients reach router_port, where the front passes on the OpenAI routes alone)",
    "--worker-urls": "the pool, from the inventory",
    "--policy": "router_policy",
    "--prometheus-port": "router_metrics_port",
    "--prometheus-host": "the metrics listen on every address",
    "--health-check-interval-secs": "router_health_check_interval",
    "--health-failure-threshold": "router_health_failure_threshold",
    "--health-success-threshold": "router_health_success_threshold",
    "--retry-max-retries": "router_retries",
    "--request-timeout-secs": "router_request_timeout",
    "--api-key": "nothing: the router passes a client's Authorization header on to the instances",
    "--worker-startup-timeout-secs": "the pool's start (STARTUP: a down instance must not hold the router back)",
    "--worker-startup-check-interval": "the pool's start (STARTUP)",
}
# Options that put the router in another mode than one pool of regular workers behind it.
OTHER_MODES = ("--vllm-pd-disaggregation", "--service-discovery", "--mini-lb", "--enable-igw", "--prefill", "--decode")
# Start-up: how long the router waits for its listed workers before it serves (the roll and the
# sync add an instance only once it answers, so a down instance must not hold the router back).
STARTUP = ["--worker-startup-timeout-secs", "5", "--worker-startup-check-interval", "1"]


@dataclass(frozen=True)
class Option:
    """One option of the router's CLI: ``switch`` (store_true), ``value`` or ``list``; ``type`` int, float or str."""

    name: str
    kind: str
    type: str
    choices: tuple[str, ...] = ()

    def problem(self, value: Any) -> str | None:
        """Why the router's parser would refuse ``value`` for this option, or None."""
        if self.kind == "switch":
            return None if isinstance(value, bool) else f"is a switch: write True (or leave it out), not {value!r}"
        values = value if self.kind == "list" and isinstance(value, list) else [value]
        for one in values:
            if isinstance(one, bool) or not isinstance(one, (str, int, float)):
                return f"takes a {self.type}, not {one!r}"
            try:
                {"int": int, "float": float}.get(self.type, str)(str(one))
            except ValueError:
                return f"takes a {self.type}, not {one!r}"
            if self.choices and str(one) not in self.choices:
                return f"{one!r} is not one of {', '.join(self.choices)}"
        return None


@dataclass(frozen=True)
class RouterKnowledge:
    """What one vllm-router release accepts and ships."""

    version: str
    wheel_file: str
    sha256: str
    members: tuple[str, ...]
    options: dict[str, Option]


def supported_versions() -> list[str]:
    names = [p.name for p in resources.files("instinct_fleet.model").joinpath("knowledge").iterdir()]
    return sorted(n.removeprefix("router-").removesuffix(".json") for n in names if n.startswith("router-"))


@cache
def load(version: str) -> RouterKnowledge | None:
    """The release's table, or None for a version it has none for."""
    if version not in supported_versions():
        return None
    raw = json.loads(resources.files("instinct_fleet.model").joinpath("knowledge", f"router-{version}.json").read_text())
    options = {n: Option(n, o["kind"], o["type"], tuple(o.get("choices", ()))) for n, o in raw["options"].items()}
    return RouterKnowledge(raw["version"], raw["wheel"]["file"], raw["wheel"]["sha256"], tuple(raw["members"]), options)


def _url(spec: HostSpec, port: int) -> str:
    return f"http://{paths.host_port(spec.reach, port)}"


def worker_url(spec: HostSpec, port: int) -> str:
    """The URL a router reaches an instance of this host at: the address its inventory gives (``scrape_address``,
    ``ssh_hostname`` or its name)."""
    return _url(spec, port)


def without(spec: HostSpec, out: frozenset[str], joining: frozenset[str] = frozenset()) -> HostSpec:
    """This router host's spec with its pools less the workers ``out`` names (instances that must not serve in this
    run), and with the listed workers that are ``joining`` (their unit was not running at preflight: only their own
    roll adds them, after its gate); the same spec when neither touches its pools."""
    if not any(w.url in out or w.url in joining for pool in spec.pools for w in pool.workers):
        return spec
    pools = tuple(
        dataclasses.replace(
            p,
            workers=tuple(w for w in p.workers if w.url not in out),
            joining=frozenset(w.url for w in p.workers if w.url in joining and w.url not in out),
        )
        for p in spec.pools
    )
    return dataclasses.replace(spec, pools=pools)


def pool_models(spec: HostSpec, served: Mapping[str, object]) -> list[str]:
    """The models this router host has a pool for, in port order."""
    return list(spec.vars.router_models) if spec.vars.router_models is not None else sorted(served)


def attach(specs: list[HostSpec]) -> tuple[list[HostSpec], list[Finding]]:
    """Every router host's pools and every serving host's memberships, from the whole inventory; and what is wrong with them."""
    served: dict[str, list[Worker]] = {}
    for spec in specs:
        for svc in spec.serves:
            watch = f"{_url(spec, spec.vars.watch_port)}/state" if spec.vars.watch else None
            worker = Worker(str(spec.host), paths.vllm_unit(svc.name), worker_url(spec, svc.port), watch)
            served.setdefault(served_model(svc), []).append(worker)
    found: list[Finding] = []
    pools: dict[str, tuple[Pool, ...]] = {}
    members: dict[str, list[Membership]] = {}
    for spec in specs:
        v = spec.vars
        if not v.router:
            continue
        models = pool_models(spec, served)
        if not models:
            found.append(finding("router-pool", spec.host, "router", "no host of the inventory serves a model, so the router has no pool"))
        mine = []
        for i, model in enumerate(models):
            workers = tuple(served.get(model, ()))
            if not workers:
                known = ", ".join(sorted(served)) or "none"
                why = f"no instance in the inventory serves {model!r} (served model names: {known}), so its pool would be empty"
                found.append(finding("router-pool", spec.host, "router_models", why))
                continue
            seen: dict[str, Worker] = {}
            for w in workers:
                if w.url in seen:
                    why = f"{seen[w.url].host} ({seen[w.url].unit}) and {w.host} ({w.unit}) are both reached at {w.url}: give each host its own scrape_address"
                    found.append(finding("router-pool", spec.host, "router_models", why))
                seen.setdefault(w.url, w)
            pool = Pool(model, v.router_port + i, v.router_metrics_port + i, tuple(seen.values()), v.router_admin_port + i)
            mine.append(pool)
            for w in workers:
                members.setdefault(w.host, []).append(Membership(str(spec.host), _url(spec, pool.admin_port), w.unit, w.url))
        pools[str(spec.host)] = tuple(mine)
    attached = [dataclasses.replace(s, pools=pools.get(str(s.host), ()), memberships=tuple(members.get(str(s.host), ()))) for s in specs]
    for spec in attached:
        found += option_findings(spec)
    return attached, found + api_key_findings(attached) + keyless_findings(attached) + reach_findings(attached)


def _ip(url: str) -> str | None:
    host = url.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def allowed(spec: HostSpec) -> tuple[str, ...] | None:
    """Who may reach this router host's client and metrics ports: ``router_allow_from``; None: it is not set, clients
    come from anywhere (the front passes on the OpenAI routes alone)."""
    if spec.vars.router_allow_from is None or not spec.pools:
        return None
    return tuple(sorted(set(spec.vars.router_allow_from)))


def admin_allowed(spec: HostSpec) -> tuple[str, ...]:
    """Who may reach the routers' own ports (``router_admin_port``: the worker API), besides loopback and the host's
    own addresses: every serving host of its pools (their roll and watch take an instance out and put it back) and
    ``router_admin_from``. Never a client."""
    workers = {ip for pool in spec.pools for w in pool.workers if (ip := _ip(w.url)) is not None}
    return tuple(sorted({*spec.vars.router_admin_from, *workers}))


def keyed_routers(spec: HostSpec) -> tuple[str, ...] | None:
    """The routers alone may reach a serving host whose instances take a key and stand in pools, when it sets no
    ``vllm_allow_from``: vLLM checks the key on its /v1 routes only, and /tokenize, /pooling, /score, /invocations and
    the rest of its routes answer anyone. Their addresses; None when the rule does not apply (no key, no pool, or
    ``vllm_allow_from`` says who)."""
    if spec.vars.vllm_api_key_path is None or spec.vars.vllm_allow_from is not None or not spec.memberships:
        return None
    return tuple(sorted({ip for m in spec.memberships if (ip := _ip(m.api)) is not None}))


def reach_findings(specs: list[HostSpec]) -> list[Finding]:
    """Firewalls that would cut a pool: a router host whose firewall cannot admit a serving host reached at a name to
    its worker API (its drain calls would be refused), and a serving host whose vllm_allow_from leaves out its router."""
    found = []
    by_host = {str(s.host): s for s in specs}
    for spec in specs:
        for pool in spec.pools:
            for w in pool.workers:
                if spec.vars.firewall and _ip(w.url) is None and w.host != str(spec.host):
                    why = (
                        f"{w.host} is reached at a name ({w.url}), which the firewall cannot admit to the worker API on "
                        f"router_admin_port: give {w.host} its IP as scrape_address, or its roll cannot take {w.unit} out of the pool"
                    )
                    found.append(finding("router-reach", spec.host, "router_models", why))
                serving = by_host.get(w.host)
                keyed = serving is not None and serving.vars.firewall and keyed_routers(serving) is not None
                if keyed and _ip(_url(spec, 1)) is None and w.host != str(spec.host):
                    why = (
                        f"the router on {spec.host} is reached at a name ({spec.reach}), which the firewall of {w.host} cannot admit: "
                        "its instances take a key and answer their routers alone; set the router's scrape_address to its IP, or vllm_allow_from"
                    )
                    found.append(finding("router-reach", w.host, "vllm_allow_from", why))
                allow = serving.vars.vllm_allow_from if serving is not None and serving.vars.firewall else None
                ip = _ip(f"http://{paths.host_port(spec.reach, 1)}")
                if allow is None:
                    continue
                if ip is None:
                    why = f"the router on {spec.host} is reached at a name ({spec.reach}), which vllm_allow_from cannot admit: set its scrape_address to its IP"
                    found.append(finding("router-reach", w.host, "vllm_allow_from", why))
                elif not any(ipaddress.ip_address(ip) in ipaddress.ip_network(a, strict=False) for a in allow):
                    why = f"the router on {spec.host} ({ip}) is not in vllm_allow_from, so it cannot reach {w.unit} here: add its address"
                    found.append(finding("router-reach", w.host, "vllm_allow_from", why))
    return found


def argv(spec: HostSpec, pool: Pool) -> list[str]:
    """The router's arguments for one pool (without the workers: the launcher reads them from the pool's file). It
    listens on the pool's admin port; its front has the clients' port."""
    v = spec.vars
    args = ["--host", "0.0.0.0", "--port", str(pool.admin_port), "--policy", v.router_policy]
    args += ["--prometheus-host", "0.0.0.0", "--prometheus-port", str(pool.metrics_port)]
    args += ["--health-check-interval-secs", str(v.router_health_check_interval)]
    args += ["--health-failure-threshold", str(v.router_health_failure_threshold)]
    args += ["--health-success-threshold", str(v.router_health_success_threshold)]
    args += ["--retry-max-retries", str(v.router_retries), "--request-timeout-secs", str(v.router_request_timeout)]
    args += STARTUP
    for name, value in sorted(v.router_flags.items()):
        if value is True:
            args.append(name)
        elif isinstance(value, list):
            args += [name, *(str(x) for x in value)]
        elif value is not False and value is not None:
            args += [name, str(value)]
    return args


def option_findings(spec: HostSpec) -> list[Finding]:
    """The router's settings against the pinned router's CLI, and the rules of a router in front of this fleet."""
    v = spec.vars
    if not v.router:
        return []
    table = load(v.router_version)
    if table is None:
        why = f"no table for vllm-router {v.router_version} (supported: {', '.join(supported_versions())}); generate it with scripts/extract_router_knowledge.py"
        return [finding("router-version", spec.host, "router_version", why)]
    found = []
    policy = table.options["--policy"]
    if (problem := policy.problem(v.router_policy)) is not None:
        found.append(finding("router-flag", spec.host, "router_policy", f"vllm-router {v.router_version} --policy: {problem}"))
    for name, value in sorted(v.router_flags.items()):
        key = f"router_flags.{name}"
        if name == "--api-key":
            why = "an inline key sits in the unit and in ps, and no key is needed: the router passes each client's Authorization header on to the instances"
            found.append(finding("router-api-key-inline", spec.host, key, why))
        elif name in MANAGED:
            found.append(finding("router-flag", spec.host, key, f"set by {MANAGED[name]}, not here"))
        elif name in OTHER_MODES:
            found.append(finding("router-flag", spec.host, key, "instinct-fleet runs the router with one pool of regular workers per unit"))
        elif name not in table.options:
            found.append(finding("router-flag", spec.host, key, f"vllm-router {v.router_version} has no such option"))
        elif (problem := table.options[name].problem(value)) is not None:
            found.append(finding("router-flag", spec.host, key, problem))
    return found


NOTABLE_KEYLESS = ("/tokenize", "/invocations", "/pooling", "/score", "/pause", "/scale_elastic_ep", "/collective_rpc")


def keyless_findings(specs: list[HostSpec]) -> list[Finding]:
    """A keyed host whose vLLM port is open beyond its routers: the routes vLLM serves without the key (read from the
    pinned version's source, ``VllmKnowledge.keyless_routes``) answer whoever the firewall lets in. Only its routers
    are let in when it stands in a pool and sets no ``vllm_allow_from`` (:func:`keyed_routers`)."""
    found = []
    for spec in specs:
        v = spec.vars
        if v.vllm_api_key_path is None or not spec.serves or keyed_routers(spec) is not None:
            continue
        table = spec.serves[0].table
        routes = table.keyless_routes if table is not None else ()
        if not routes:
            continue
        who = f"vllm_allow_from ({', '.join(v.vllm_allow_from)})" if v.vllm_allow_from is not None else "anyone"
        if v.vllm_allow_from is None and not v.firewall:
            who = "anyone (firewall = False)"
        # The ones that do harm first: reading the model's tokenizer, serving it, and pausing or reshaping the engine.
        first = [r for r in NOTABLE_KEYLESS if r in routes]
        rest = len(routes) - len(first)
        shown = ", ".join(first or routes[:8]) + (f" and {rest} more routes" if first and rest else "")
        why = (
            f"vLLM {table.version if table else ''} checks the key on {', '.join(table.guarded_prefixes) if table else '/v1'} only: "
            f"{shown} answer {who} without it. Put the host's instances behind a router and leave vllm_allow_from unset "
            "(the firewall then opens the port to its routers alone), or narrow vllm_allow_from to who may use them"
        )
        found.append(finding("api-key-keyless-routes", spec.host, "vllm_api_key_path", why))
    return found


def api_key_findings(specs: list[HostSpec]) -> list[Finding]:
    """A pool whose instances disagree on an API key refuses a client's request on some and serves it on others."""
    keyed = {str(s.host) for s in specs if s.vars.vllm_api_key_path is not None}
    found = []
    for spec in specs:
        for pool in spec.pools:
            hosts = {w.host for w in pool.workers}
            if hosts & keyed and hosts - keyed:
                why = (
                    f"the pool of {pool.model!r} mixes instances with vllm_api_key_path ({', '.join(sorted(hosts & keyed))}) and without "
                    f"({', '.join(sorted(hosts - keyed))}): clients must send the key; or set it on every host that serves the model"
                )
                found.append(finding("router-api-key", spec.host, "router_models", why))
    return found
