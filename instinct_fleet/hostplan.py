"""One host's plan for a deploy: its validated spec, its preflight facts and what follows.

``deploy.py`` and every file in ``tasks/`` call :func:`plan_for`, so validation
and the preflight fact run once per host and every stage reads the same answer.
Stages branch only on this plan, which does not change during a run.

A plan also holds the host's desired state for everything whose change restarts
a serving unit (unit files, env files, docker's settings), rendered once: the
deploy writes it, the verify module compares it, and :mod:`instinct_fleet.roll`
compares its hashes with the preflight fact to decide what rolls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from instinct_fleet import desired, paths, preflight, render
from instinct_fleet.desired import Weights
from instinct_fleet.inventory import HostData, hosts_of, plan_hosts
from instinct_fleet.paths import DAEMON_JSON, DOCKER_DROP_IN
from instinct_fleet.preflight import HostReport
from instinct_fleet.roll import Kind, Roll, ServingUnit, batch_size, batches, combine
from instinct_fleet.rules import Finding, finding
from instinct_fleet.spec import HostSpec, ServiceSpec

BASE_PACKAGES = {"curl": "curl"}  # command -> Debian package; curl runs the health checks
CPUPOWER_PACKAGES = {"debian": ("linux-cpupower",), "ubuntu": ("linux-tools-common", "linux-tools-generic")}


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

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def role(self) -> str | None:
        """``head``, ``worker`` or None for a single-node host."""
        cluster = self.spec.settings.cluster
        return cluster.role if cluster else None

    @property
    def serves(self) -> tuple[ServiceSpec, ...]:
        """The vLLM instances this host runs a unit for: none on a cluster worker."""
        return () if self.role == "worker" else self.spec.services

    @property
    def image(self) -> str:
        return self.spec.services[0].image

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
        cluster = self.spec.settings.cluster
        if cluster is None or self.cluster is None:
            return dict(svc.env)
        return {**svc.env, **cluster.rccl_env(), "VLLM_HOST_IP": self.cluster.node_ip}

    def env_text(self, svc: ServiceSpec) -> str:
        return render.env_file(self.env(svc), self.report.hf_token)

    def vllm_argv(self, svc: ServiceSpec) -> list[str]:
        cluster = self.spec.settings.cluster
        mounts = [f"{paths.RAY_TMP}:/tmp/ray"] if self.role == "head" else []
        drain = self.spec.settings.rolling.drain_timeout
        container = render.vllm_container(
            svc,
            self.devices(svc),
            drain,
            mounts,
            infiniband=cluster is not None and cluster.infiniband,
            api_key_path=self.spec.vars.vllm_api_key_path,
        )
        return render.docker_run(container, self.spec.settings, self.group_ids, self.report.hf_token)

    def ray_argv(self) -> list[str]:
        cluster = self.spec.settings.cluster
        assert cluster is not None and self.cluster is not None
        svc = self.spec.services[0]
        # --num-gpus from amd-smi; preflight has checked it equals gpu_count on every member.
        command = render.ray_start(cluster, self.cluster.node_ip, self.cluster.head_ip, len(self.report.gpus))
        container = render.Container(
            name=render.ray_unit(cluster.role),
            image=svc.image,
            entrypoint="ray",
            command=command,
            env_path=paths.RAY_ENV,
            devices=self.devices(svc),
            mounts=[f"{paths.RAY_TMP}:/tmp/ray"],
            infiniband=cluster.infiniband,
        )
        return render.docker_run(container, self.spec.settings, self.group_ids, self.report.hf_token)

    def unit_vars(self, svc: ServiceSpec) -> dict[str, Any]:
        """Everything templates/vllm.service.j2 reads; the deploy and the verify module both use it."""
        cluster = self.spec.settings.cluster
        ready = None
        if cluster is not None and self.role == "head":
            nodes, gpus = svc.nodes, svc.nodes * self.spec.gpu_count
            ready = render.exec_line(render.ray_ready_command(nodes, gpus, cluster.ready_timeout))
        return {
            "unit": render.unit_name(svc),
            "model": svc.model,
            "recipe": svc.recipe,
            "port": svc.port,
            "gpus": ",".join(map(str, svc.gpus)),
            "env_path": render.env_path(svc),
            "docker": paths.DOCKER,
            "exec_start": render.exec_line(self.vllm_argv(svc)),
            "stop_seconds": render.stop_seconds(svc, self.spec.settings.rolling.drain_timeout),
            "ray_unit": render.ray_unit("head") if ready else None,
            "ray_ready": ready,
            "start_timeout": (cluster.ready_timeout + 120) if ready and cluster else 120,
        }

    def ray_unit_vars(self) -> dict[str, Any]:
        cluster = self.spec.settings.cluster
        assert cluster is not None
        return {
            "unit": render.ray_unit(cluster.role),
            "role": cluster.role,
            "cluster": cluster.name,
            "docker": paths.DOCKER,
            "exec_start": render.exec_line(self.ray_argv()),
        }

    def docker_files(self) -> dict[str, str | None]:
        """daemon.json and dockerd's drop-in (None: must be absent). A change restarts dockerd and its containers."""
        memlock = render.memlock_systemd(self.spec.settings.tune_memlock)
        return {
            DAEMON_JSON: render.daemon_json(self.spec.settings),
            DOCKER_DROP_IN: render.template("docker-limits.conf.j2", memlock=memlock) if memlock else None,
        }

    def exporter_files(self) -> dict[str, str]:
        """The device metrics exporter's unit and config file, when ``metrics_exporter`` is on."""
        v = self.spec.vars
        if not v.metrics_exporter:
            return {}
        unit = render.template(
            "amd-metrics-exporter.service.j2",
            unit=paths.EXPORTER_UNIT,
            docker=paths.DOCKER,
            port=v.metrics_exporter_port,
            exec_start=render.exec_line(render.exporter_argv(v.metrics_exporter_image)),
        )
        return {
            render.unit_path(paths.EXPORTER_UNIT): unit,
            paths.EXPORTER_CONFIG: render.exporter_config(v.metrics_exporter_port, v.metrics_exporter_fields),
        }

    @cached_property
    def unit_files(self) -> dict[str, dict[str, str]]:
        """Per systemd unit this host runs (ray-* first): its unit file and env file, as the deploy writes them."""
        units: dict[str, dict[str, str]] = {}
        if self.role is not None:
            units[render.ray_unit(self.role)] = {
                render.unit_path(render.ray_unit(self.role)): render.template("ray.service.j2", **self.ray_unit_vars()),
                paths.RAY_ENV: self.env_text(self.spec.services[0]),
            }
        for svc in self.serves:
            units[render.unit_name(svc)] = {
                render.unit_path(render.unit_name(svc)): render.template("vllm.service.j2", **self.unit_vars(svc)),
                render.env_path(svc): self.env_text(svc),
            }
        return units

    def differs(self, path: str, content: str | None) -> bool:
        """Whether the host's file (hashed by the preflight fact) is not ``content``; None means absent."""
        have = self.report.file_hashes.get(path)
        if content is None:
            return have is not None
        return have != hashlib.sha256(content.encode()).hexdigest()

    @cached_property
    def docker_changed(self) -> bool:
        return any(self.differs(path, content) for path, content in self.docker_files().items())

    @cached_property
    def changed_units(self) -> set[str]:
        return {unit for unit, files in self.unit_files.items() if any(self.differs(p, c) for p, c in files.items())}

    @cached_property
    def kind(self) -> Kind:
        """``restart`` when a change would take down something serving now; ``start`` when nothing of it serves."""
        disrupted = self.changed_units | set(self.stale_units)
        if self.docker_changed:
            disrupted |= set(self.unit_files) | set(self.report.managed_units)
        if not disrupted:
            return "unchanged"
        return "restart" if disrupted & set(self.report.active_units) else "start"

    @cached_property
    def desired(self) -> desired.Desired:
        """Everything this host should have (instinct_fleet/desired.py): the stages act on what differs from it."""
        return desired.desired(self)

    def drifted(self, *paths: str) -> bool:
        """Whether any of these managed files or directories differs on the host from what it should be."""
        want = self.desired
        for path in paths:
            match = [f for f in want.files if f.path == path]
            if match and desired.file_drifts(match[0], self.report):
                return True
            directory = [d for d in want.directories if d.path == path]
            if directory and desired.directory_drifts(directory[0], self.report):
                return True
        return False

    def unit_drifted(self, name: str) -> bool:
        """Whether the unit is not enabled and running (or, for a stale one, not stopped and disabled) on the host."""
        return any(desired.unit_drifts(u, self.report) for u in self.desired.units if u.name == name)

    def user_drifted(self) -> bool:
        user = self.desired.user
        have = self.report.user
        groups_missing = any(g not in self.report.group_ids for g in self.desired.groups)
        return groups_missing or have is None or have[0] != user.home or have[1] != user.shell or not set(user.groups) <= set(have[2])

    def serving_in_place(self, unit: str) -> bool:
        """A unit whose files match, which is enabled and running, and whose instances answered at preflight."""
        files = self.unit_files.get(unit, {})
        if self.drifted(*files) or self.unit_drifted(f"{unit}.service"):
            return False
        return all(e.port in self.report.healthy_ports for e in self.desired.endpoints if e.unit == f"{unit}.service")

    def source_has(self, weights: Weights) -> bool:
        """Whether ``weights_source`` held a complete download of this model's revision at preflight."""
        complete = self.report.weights.get(weights.source, ("", ""))[0]
        return complete.split(" ")[0] == weights.revision

    def weights_staged(self, weights: Weights) -> bool:
        """Whether the host's HF cache holds the copy of exactly what the source holds."""
        complete, staged = self.report.weights.get(weights.source, ("", ""))
        return bool(staged) and staged == complete and self.source_has(weights)

    @property
    def defers_docker(self) -> bool:
        """New docker settings on a serving host wait for its batch: restarting dockerd stops every container."""
        return self.docker_changed and self.kind == "restart"

    def firewall(self) -> str | None:
        """The nftables ruleset for this host, or None when the firewall is not needed or switched off."""
        settings, scrapers = self.spec.settings, self.spec.vars.prometheus_allow_from
        if not settings.firewall or (settings.cluster is None and settings.allow_from is None and scrapers is None):
            return None
        members = list(self.cluster.member_ips) if self.cluster else []
        ray = render.ray_ports(settings.cluster) if settings.cluster else []
        exporter = self.spec.vars.metrics_exporter_port if self.spec.vars.metrics_exporter else None
        ports = [s.port for s in self.serves]
        return render.firewall_ruleset(members, ray, ports, settings.allow_from, None if scrapers is None else tuple(scrapers), exporter)

    @property
    def missing_packages(self) -> list[str]:
        missing = [] if self.report.docker_version else ["docker.io"]
        missing += [pkg for cmd, pkg in BASE_PACKAGES.items() if cmd not in self.report.commands]
        if self.firewall() is not None and "nft" not in self.report.commands:
            missing.append("nftables")
        if self.spec.settings.tune_cpu_idle and "cpupower" not in self.report.commands:
            missing += CPUPOWER_PACKAGES.get(self.report.os_id, CPUPOWER_PACKAGES["debian"])
        return missing

    @property
    def stale_units(self) -> list[str]:
        """vllm-* and ray-* units this tool wrote earlier for instances or a cluster role no longer in the inventory."""
        wanted = {render.unit_name(s) for s in self.serves} | ({render.ray_unit(self.role)} if self.role else set())
        return sorted(set(self.report.managed_units) - wanted)

    def summary(self) -> str:
        r = self.report
        gpus = r.gpus[0] if r.gpus else None
        model = gpus.model or gpus.market_name if gpus else "no GPU"
        role = f", Ray {self.role} of {self.spec.settings.cluster.name}" if self.spec.settings.cluster else ""
        return (
            f"{len(r.gpus)} x {model}, partition {r.compute_partition or '?'}/{r.memory_partition or '?'}, "
            f"amdgpu {r.amdgpu_version or '?'}, ROCm {r.rocm_version or '?'}, firmware {gpus.firmware if gpus else '?'}, "
            f"docker {r.docker_version or 'absent'}{role}"
        )


def build_plan(spec: HostSpec, findings: list[Finding], report: HostReport) -> HostPlan:
    """Validation findings and preflight problems for one host, each with its rule."""
    errors = [f for f in findings if f.severity == "error"]
    warnings = [f for f in findings if f.severity == "warning"]
    if not errors:
        errors += preflight.hard_problems(report, spec)
    settings, host = spec.settings, spec.host
    if settings.tune_kernel_cmdline and report.missing_kernel_args and not settings.tune_reboot:
        warnings.append(
            finding(
                "host-reboot-required",
                host,
                "tune_kernel_cmdline",
                f"kernel command line lacks {' '.join(report.missing_kernel_args)}: reboot required (or set tune_reboot = True)",
            )
        )
    if settings.tune_numa_balancing and report.numa_balancing is None:
        warnings.append(
            finding(
                "host-numa-balancing",
                host,
                "tune_numa_balancing",
                "kernel.numa_balancing does not exist (kernel without NUMA balancing): nothing to turn off",
            )
        )
    if not report.hf_token:
        warnings.append(
            finding(
                "host-hf-token",
                host,
                "hf_token_path",
                f"no Hugging Face token at {settings.hf_token_path}: gated models will fail to download",
            )
        )
    return HostPlan(spec, report, errors, warnings)


def join_cluster(plan: HostPlan, members: dict[str, HostPlan | None]) -> None:
    """Give a cluster member its node IP, the head's IP and every member's IP, all read from facts."""
    cluster = plan.spec.settings.cluster
    if cluster is None or cluster.nic is None:
        return
    ips: dict[str, str] = {}
    head_ip = None
    for name, member in sorted(members.items()):
        if member is None or not member.facts:
            plan.errors.append(
                finding(
                    "host-cluster-member",
                    plan.spec.host,
                    "ray_cluster",
                    f"cluster member {name} could not be reached for its preflight facts",
                )
            )
            continue
        ip = member.report.addresses.get(cluster.nic)
        if ip is None:
            plan.errors.append(
                finding(
                    "host-cluster-nic",
                    plan.spec.host,
                    "cluster_nic",
                    f"cluster member {name} has no IPv4 address on cluster_nic {cluster.nic}",
                )
            )
            continue
        ips[name] = ip
        if member.role == "head":
            head_ip = ip
    node_ip = ips.get(str(plan.spec.host))
    if node_ip is not None and head_ip is not None and not plan.errors:
        plan.cluster = ClusterView(node_ip, head_ip, tuple(sorted(set(ips.values()))))


Reader = Callable[[dict[str, HostSpec]], dict[str, HostReport | None]]


def plan_inventory(hosts: list[HostData], active: set[str], read_reports: Reader) -> dict[str, HostPlan]:
    """Plans for the ``active`` hosts and the members of their clusters (a member needs its peers' addresses).

    Specs and cross-host validation come from every host of the inventory; facts
    come from ``read_reports``, called once with the specs of the hosts needed
    (None for a host that cannot be reached).
    """
    planned = {str(spec.host): (spec, findings) for spec, findings in plan_hosts(hosts)}
    clusters: dict[str, list[str]] = {}
    for name, (spec, _) in planned.items():
        if spec.settings.cluster is not None:
            clusters.setdefault(spec.settings.cluster.name, []).append(name)
    needed = set(active) & set(planned)
    for names in clusters.values():
        if needed & set(names):
            needed |= set(names)
    reports = read_reports({name: planned[name][0] for name in sorted(needed)})
    plans: dict[str, HostPlan] = {}
    for name in sorted(needed):
        spec, findings = planned[name]
        report = reports.get(name)
        if report is None:
            timeout = spec.settings.command_timeout
            why = f"no preflight facts: the host could not be reached, or did not answer within command_timeout ({timeout}s)"
            plans[name] = HostPlan(
                spec, preflight.parse_report(""), [finding("host-unreachable", spec.host, "preflight", why)], [], facts=False
            )
        else:
            plans[name] = build_plan(spec, findings, report)
    for plan in plans.values():
        cluster = plan.spec.settings.cluster
        if cluster is not None:
            join_cluster(plan, {n: plans.get(n) for n in clusters[cluster.name]})
    return plans


def plan_roll(plans: dict[str, HostPlan]) -> Roll:
    """The run's serving units, their kind and their batches, from every planned host that passed preflight."""
    ready = {name: plan for name, plan in plans.items() if plan.ok and plan.unit_files}
    clusters: dict[str, list[HostPlan]] = {}
    units = []
    for name, plan in sorted(ready.items()):
        cluster = plan.spec.settings.cluster
        if cluster is None:
            units.append(ServingUnit(name, (name,), plan.kind))
        else:
            clusters.setdefault(cluster.name, []).append(plan)
    for cluster_name, members in sorted(clusters.items()):
        members.sort(key=lambda p: (p.role != "head", str(p.spec.host)))
        hosts = tuple(str(p.spec.host) for p in members)
        units.append(ServingUnit(f"cluster {cluster_name}", hosts, combine(p.kind for p in members)))
    if not ready:
        return Roll([], [[]], 0)
    # validate_rolling has checked that every host carries the same rolling settings.
    rolling = next(iter(ready.values())).spec.settings.rolling
    return Roll(units, batches(units, batch_size(rolling.batch, len(units))), rolling.max_failures)


@dataclass
class FleetPlan:
    """What one pyinfra run decided before executing anything: every host's plan and the roll."""

    plans: dict[str, HostPlan]
    roll: Roll

    @cached_property
    def image_seeds(self) -> set[str]:
        """Computed once per run; every host's runtime stage asks."""
        return image_seeds(self.plans)

    def seeds_image(self, host: str) -> bool:
        """Whether this host pulls its image before the others that lack it (see :func:`image_seeds`)."""
        return host in self.image_seeds

    @cached_property
    def weight_seeds(self) -> dict[str, str]:
        """Model repository in ``weights_source`` -> the one host that downloads it there (see :func:`weight_seeds`)."""
        return weight_seeds(self.plans)


def image_seeds(plans: dict[str, HostPlan]) -> set[str]:
    """One host per image that is missing somewhere: the first, by name, of those that need to pull it.

    A pull-through cache fetches a layer from upstream for every request it cannot answer yet,
    so N hosts pulling at once can cost N upstream fetches of a 20+ GB image. The seed pulls
    first and fills the cache; the rest pull after it, from the cache.
    """
    missing: dict[str, list[str]] = {}
    for name, plan in sorted(plans.items()):
        if plan.ok and plan.desired.image is not None and plan.report.image_id is None:
            missing.setdefault(plan.desired.image, []).append(name)
    return {hosts[0] for hosts in missing.values()}


def weight_seeds(plans: dict[str, HostPlan]) -> dict[str, str]:
    """For each model missing from ``weights_source``, the first host by name that needs it: that host
    downloads it into the source once, and every host copies it from there after a barrier."""
    seeds: dict[str, str] = {}
    for name, plan in sorted(plans.items()):
        if plan.ok:
            for w in plan.desired.weights:
                if not plan.source_has(w):
                    seeds.setdefault(w.source, name)
    return seeds


# One plan per pyinfra run, kept on the run's State itself, made by the first host that asks;
# pyinfra loads the deploy file for every host at once in greenlets, so the others wait for it.
_PLAN_ATTRIBUTE = "instinct_fleet_plan"


def _plan_run(state: Any) -> FleetPlan:
    """Plan the inventory: one preflight fact per host needed, all read at once."""
    import gevent
    from pyinfra.api.exceptions import ConnectError
    from pyinfra.context import ctx_host

    from instinct_fleet import watchdog
    from instinct_fleet.facts import HostReport as HostReportFact

    everyone = {h.name: h for h in state.inventory}
    data = hosts_of(state.inventory)
    active = {h.name for h in state.inventory.iter_activated_hosts()}

    def read(name: str, spec: HostSpec) -> HostReport | None:
        timeout = spec.settings.command_timeout
        timer = watchdog.guarded(everyone[name], timeout, "preflight", lambda _host, _why: None)
        with ctx_host.use(everyone[name]):
            try:
                report: HostReport | None = everyone[name].get_fact(
                    HostReportFact, token_path=spec.settings.hf_token_path, probe=desired.probe(spec), _timeout=timeout
                )
                return report
            except ConnectError:  # an unreachable member: its cluster peers fail with a message instead
                return None
            finally:
                timer.kill()

    def read_all(specs: dict[str, HostSpec]) -> dict[str, HostReport | None]:
        jobs = {name: gevent.spawn(read, name, spec) for name, spec in specs.items()}
        gevent.joinall(list(jobs.values()), raise_error=True)
        # A read the watchdog ended holds GreenletExit: no facts from that host.
        return {name: job.value if isinstance(job.value, HostReport) else None for name, job in jobs.items()}

    plans = plan_inventory(data, active, read_all)
    return FleetPlan(plans, plan_roll(plans))


def fleet_plan(state: Any) -> FleetPlan:
    """The plan of this pyinfra run (its State), made once."""
    from gevent.event import AsyncResult

    pending = getattr(state, _PLAN_ATTRIBUTE, None)
    if pending is None:
        from instinct_fleet.runreport import RollReporter
        from instinct_fleet.watchdog import ContainedPool, Watchdog

        pending = AsyncResult()
        setattr(state, _PLAN_ATTRIBUTE, pending)
        try:
            fleet = _plan_run(state)
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        state.add_callback_handler(RollReporter(state, fleet))
        state.add_callback_handler(Watchdog(fleet.roll.note))
        state.pool = ContainedPool(state.pool.size, fleet.roll.note)
        pending.set(fleet)
    result: FleetPlan = pending.get()
    return result


def plan_for(host: Any) -> HostPlan:
    """The plan of a pyinfra host in this run."""
    return fleet_plan(host.state).plans[host.name]
