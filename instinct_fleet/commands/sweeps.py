"""A tuning sweep's definition and its validation, before any host: what ``instinct-fleet tune`` varies, measures and requires.

A :class:`Sweep` is the instance, the ``--vary``/``--vary-env`` values, the
profile and the SLOs; :func:`grid` its points. :func:`check` validates every
point as a deploy validates it (the inventory with the point in the
instance's own ``args``/``env`` goes through
:func:`instinct_fleet.model.inventory.plan_hosts`): a point that fails is skipped
with its rule, never run. :func:`plan_text` is what the sweep prints first.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from instinct_fleet.model import paths, workload
from instinct_fleet.model.catalog import Catalog
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.rules import Finding
from instinct_fleet.model.spec import HostSpec

Value = bool | int | float | str

# vLLM's result fields (vllm/benchmarks/serve.py): the throughputs, and mean, median, std and each
# requested percentile of every requested latency, as bench asks for them (bench.vllm_bench_args).
THROUGHPUTS = ("output_throughput", "request_throughput", "total_token_throughput")
RESULT_FIELDS = THROUGHPUTS + tuple(
    f"{stat}_{metric}_ms"
    for metric in workload.PERCENTILE_METRICS
    for stat in ("mean", "median", "std", *(f"p{p}" for p in workload.METRIC_PERCENTILES))
)


class TuneError(Exception):
    """A sweep that cannot run as asked; the message says why, before any host is touched."""


@dataclass(frozen=True)
class Slo:
    """``--slo median_tpot_ms<=25``: a bound on one of vLLM's result fields."""

    metric: str
    op: str  # "<=" or ">="
    limit: float

    def met(self, figures: Mapping[str, Any]) -> bool:
        value = figures.get(self.metric)
        if not isinstance(value, int | float):
            return False
        return value <= self.limit if self.op == "<=" else value >= self.limit

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.limit:g}"


def parse_slo(text: str) -> Slo:
    match = re.fullmatch(r"\s*([a-z0-9_]+)\s*(<=|>=)\s*([0-9.eE+-]+)\s*", text)
    if match is None:
        raise TuneError(f"--slo takes METRIC<=VALUE or METRIC>=VALUE, such as median_tpot_ms<=25, got {text!r}")
    metric, op, number = match.groups()
    if metric not in RESULT_FIELDS:
        raise TuneError(f"--slo {text!r}: {metric} is not a field of vLLM's benchmark result; fields: {', '.join(RESULT_FIELDS)}")
    try:
        return Slo(metric, op, float(number))
    except ValueError:
        raise TuneError(f"--slo {text!r}: {number!r} is not a number") from None


def typed(text: str) -> Value:
    """A value as group_data would hold it: whole numbers, decimals, true/false; anything else a string."""
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    if re.fullmatch(r"-?[0-9]*\.[0-9]+([eE][-+]?[0-9]+)?", text):
        return float(text)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def parse_vary(text: str, env: bool) -> tuple[str, tuple[Value, ...]]:
    """``max-num-seqs=64,128`` (``--vary``) or ``VLLM_ROCM_USE_AITER=0,1`` (``--vary-env``)."""
    option = "--vary-env" if env else "--vary"
    name, sep, values = text.partition("=")
    name = name.strip() if env else name.strip().lstrip("-")
    if not sep or not name or not values.strip():
        raise TuneError(f"{option} takes NAME=V1,V2,..., got {text!r}")
    if env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise TuneError(f"{option} {text!r}: {name!r} is not an environment variable name")
    parts = [part.strip() for part in values.split(",")]
    if any(not part for part in parts):
        raise TuneError(f"{option} {text!r}: an empty value")
    if len(set(parts)) != len(parts):
        raise TuneError(f"{option} {text!r}: a value is listed twice")
    return name, tuple(parts if env else (typed(part) for part in parts))


@dataclass(frozen=True)
class Sweep:
    """What varies, how it is measured and judged, and on how many hosts at once."""

    instance: str
    vary: tuple[tuple[str, tuple[Value, ...]], ...] = ()
    vary_env: tuple[tuple[str, tuple[Value, ...]], ...] = ()
    profile: str = "latency"
    num_prompts: int | None = None
    concurrency: int | None = None
    slos: tuple[Slo, ...] = ()
    limit: str | None = None
    max_out: int = 1
    repeats: int | None = None  # measured runs per point (None: the host's canary_runs)
    warmup: int | None = None  # discarded requests before a point's runs (None: the host's canary_warmup)

    def __post_init__(self) -> None:
        if not self.vary and not self.vary_env:
            raise TuneError("nothing varies: give --vary FLAG=V1,V2 or --vary-env NAME=V1,V2 (or [vary] in the config file)")
        if self.max_out < 1:
            raise TuneError(f"--max-out must be 1 or more, got {self.max_out}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise TuneError(f"--num-prompts must be 1 or more, got {self.num_prompts}")
        if self.concurrency is not None and self.concurrency < 1:
            raise TuneError(f"--concurrency must be 1 or more, got {self.concurrency}")
        if self.repeats is not None and not 1 <= self.repeats <= 10:
            raise TuneError(f"--repeats must be 1 to 10, got {self.repeats}")
        if self.warmup is not None and self.warmup < 0:
            raise TuneError(f"--warmup must be 0 or more, got {self.warmup}")
        names = [name for name, _ in self.vary] + [name for name, _ in self.vary_env]
        if len(set(names)) != len(names):
            raise TuneError("a name is varied twice")

    def as_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["vary"] = {name: list(values) for name, values in self.vary}
        data["vary_env"] = {name: list(values) for name, values in self.vary_env}
        data["slos"] = [str(s) for s in self.slos]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sweep:
        """A sweep from ``sweep.json`` or a TOML file: the same keys (``slo`` or ``slos``, a list of strings)."""
        known = {f.name for f in dataclasses.fields(cls)} | {"slo"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TuneError(f"unknown key(s) {', '.join(unknown)}; keys: {', '.join(sorted(known))}")
        if "instance" not in data:
            raise TuneError("the sweep needs an instance (--instance NAME)")

        def table(key: str, env: bool) -> tuple[tuple[str, tuple[Value, ...]], ...]:
            raw = data.get(key) or {}
            if not isinstance(raw, Mapping):
                raise TuneError(f"{key} must be a table of NAME = [values]")
            out = []
            for name, values in raw.items():
                if not isinstance(values, list) or not values:
                    raise TuneError(f"{key}.{name} must be a non-empty list of values")
                out.append(parse_vary(f"{name}={','.join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)}", env))
            return tuple(out)

        slos = data.get("slos", data.get("slo", []))
        if not isinstance(slos, list):
            raise TuneError("slo must be a list of strings such as ['median_tpot_ms<=25']")
        try:
            return cls(
                instance=str(data["instance"]),
                vary=table("vary", False),
                vary_env=table("vary_env", True),
                profile=str(data.get("profile", "latency")),
                num_prompts=data.get("num_prompts"),
                concurrency=data.get("concurrency"),
                slos=tuple(parse_slo(str(s)) for s in slos),
                limit=data.get("limit"),
                max_out=int(data.get("max_out", 1)),
                repeats=None if data.get("repeats") is None else int(data["repeats"]),
                warmup=None if data.get("warmup") is None else int(data["warmup"]),
            )
        except (TypeError, ValueError) as exc:
            raise TuneError(f"the sweep's settings do not fit: {exc}") from None


def load_config(path: Path) -> dict[str, Any]:
    """A TOML file with the sweep's settings, for a sweep run often (the same keys as ``sweep.json``)."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise TuneError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TuneError(f"{path} is not valid TOML: {exc}") from None


@dataclass(frozen=True)
class Point:
    """One configuration: ``--flag`` -> value and ENV -> value; no settings and ``baseline``: as deployed."""

    settings: tuple[tuple[str, Value], ...]
    baseline: bool = False

    @property
    def key(self) -> str:
        return "deployed" if self.baseline else json.dumps(dict(self.settings), sort_keys=True)

    def done_key(self, host: str) -> str:
        """What a resumed sweep matches: a point measured on any host, a baseline on its own host."""
        return f"deployed@{host}" if self.baseline else self.key

    def label(self) -> str:
        if self.baseline:
            return "deployed"
        return " ".join(f"{name}={json.dumps(value) if isinstance(value, bool) else value}" for name, value in self.settings)

    def flags(self) -> dict[str, Value]:
        return {name[2:]: value for name, value in self.settings if name.startswith("--")}

    def env(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.settings if not name.startswith("--")}


BASELINE = Point((), baseline=True)


def grid(sweep: Sweep) -> list[Point]:
    """Every combination of the varied values, in the order given (the last name varies fastest)."""
    axes = [(f"--{name}", values) for name, values in sweep.vary] + list(sweep.vary_env)
    return [Point(tuple(zip([name for name, _ in axes], combo, strict=True))) for combo in itertools.product(*(v for _, v in axes))]


def instance_entries(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The host's ``vllm_instances`` as written (the default: one instance ``main``); validated as mappings before."""
    entries = data.get("vllm_instances")
    if entries is None:
        return [{"name": "main"}]
    return [dict(e) for e in entries]


def with_point(data: Mapping[str, Any], instance: str, point: Point) -> dict[str, Any]:
    """The host's data with the point's flags and env in the instance's own ``args`` and ``env`` (the last layer)."""
    out = copy.deepcopy(dict(data))
    entries = instance_entries(out)
    for entry in entries:
        if entry.get("name") == instance:
            entry["args"] = {**(entry.get("args") or {}), **point.flags()}
            entry["env"] = {**(entry.get("env") or {}), **point.env()}
    out["vllm_instances"] = entries
    return out


@dataclass(frozen=True)
class Checked:
    """The validated sweep: the hosts that run it, the points to run and the points skipped with their finding."""

    hosts: tuple[str, ...]  # at most max_out, by name
    idle: tuple[tuple[str, str], ...]  # hosts of --limit that do not run it, and why
    points: tuple[Point, ...]
    skipped: tuple[tuple[Point, Finding], ...]
    floor: float  # the smallest throughput gain (tok/s) that counts: the hosts' canary_floors.output_throughput
    alpha: float  # how often a harmless best point may be named: the hosts' canary_alpha, split over the points
    catalog: Catalog = dataclasses.field(default_factory=Catalog)  # the project's recipes and tables, as validated


def check(hosts: list[HostData], chosen: set[str], sweep: Sweep, catalog: Catalog | None = None) -> Checked:
    """Validate every point as a deploy would (with the project's ``catalog``), for every host that would run it; no host
    is contacted."""
    catalog = catalog or Catalog()
    planned = {str(spec.host): spec for spec, _ in plan_hosts(hosts, catalog)}
    able, idle = [], []
    for name in sorted(chosen):
        spec = planned[name]
        if not any(svc.name == sweep.instance for svc in spec.services):
            idle.append((name, f"has no instance {sweep.instance!r}"))
        elif spec.cluster is not None:
            idle.append((name, "its instance spans a Ray cluster; tune sweeps single-node instances"))
        else:
            able.append(name)
    if not able:
        why = "; ".join(f"{name} {reason}" for name, reason in idle)
        raise TuneError(f"no host of --limit can tune instance {sweep.instance!r}: {why}")
    used = able[: sweep.max_out]
    idle += [
        (name, f"--max-out {sweep.max_out}: at most {sweep.max_out} host(s) leave their deployed configuration")
        for name in able[sweep.max_out :]
    ]
    for name in used:  # the profile must fit the deployed instance (its --max-model-len)
        svc = next(s for s in planned[name].services if s.name == sweep.instance)
        try:
            jobs = workload.jobs(planned[name], svc, sweep.profile, sweep.num_prompts, [sweep.concurrency] if sweep.concurrency else None)
        except workload.BenchRequestError as exc:
            raise TuneError(str(exc)) from None
        if len(jobs) != 1:
            raise TuneError(f"profile {sweep.profile!r} runs {len(jobs)} concurrencies; a trial measures one: give --concurrency N")
    points, skipped = [], []
    # The hosts that run the sweep are single-node, so a point changes nothing another host's rules read:
    # planning them alone is what the deploy's plan says of them, at a cost that does not grow with the fleet.
    tuned = [h for h in hosts if h.name in used]
    for point in grid(sweep):
        changed = [dataclasses.replace(h, data=with_point(h.data, sweep.instance, point)) for h in tuned]
        errors = [f for _, findings in plan_hosts(changed, catalog) for f in findings if f.severity == "error"]
        if errors:
            skipped.append((point, errors[0]))
        else:
            points.append(point)
    if not points:  # a sweep of baselines alone measures nothing that tune could choose between
        why = "; ".join(f"{point.label()}: [{found.rule}] {found.key}: {found.message}" for point, found in skipped)
        raise TuneError(f"every point of the sweep is invalid, so there is nothing to measure ({len(skipped)} skipped: {why})")
    first = planned[used[0]].vars  # validation keeps the canary's variables one value for the fleet
    return Checked(
        tuple(used), tuple(idle), tuple(points), tuple(skipped), first.canary_floors.output_throughput, first.canary_alpha, catalog
    )


def assign(points: list[Point], hosts: tuple[str, ...]) -> dict[str, list[Point]]:
    """Each host's queue: its baseline first, then the points round-robin in grid order."""
    queues: dict[str, list[Point]] = {host: [BASELINE] for host in hosts}
    for index, point in enumerate(points):
        queues[hosts[index % len(hosts)]].append(point)
    return queues


def plan_text(checked: Checked, sweep: Sweep, specs: dict[str, HostSpec], done: set[str]) -> str:
    """The whole plan, printed before any host is touched: the points, who runs which, and the time it may take."""
    lines = [
        f"tune {paths.vllm_unit(sweep.instance)}: {len(checked.points)} point(s) to measure, {len(checked.skipped)} skipped as invalid, "
        f"profile {sweep.profile}" + (f", SLOs {', '.join(map(str, sweep.slos))}" if sweep.slos else "")
    ]
    for point, found in checked.skipped:
        lines.append(f"  skipped {point.label()}: [{found.rule}] {found.key}: {found.message}")
    queues = assign(list(checked.points), checked.hosts)
    for host, queue in queues.items():
        shown = [p.label() + (" (measured earlier)" if p.done_key(host) in done else "") for p in queue]
        lines.append(f"  {host}: " + "; ".join(shown))
    for host, why in checked.idle:
        lines.append(f"  {host}: not used: {why}")
    rounds = max(len(q) - 1 for q in queues.values())
    bound = max(s.vars.health_timeout + s.vars.command_timeout * workload.RUN_LIMIT_FACTOR for s in specs.values())
    lines.append(
        f"  {len(checked.hosts)} host(s) at once, never more than --max-out {sweep.max_out} away from their deployed configuration; "
        f"{rounds} restart round(s) plus the baselines and a restore: each round takes one start-up, health gate and benchmark "
        f"(at most {math.ceil(bound / 60)} min a round by health_timeout and the benchmark limit)"
    )
    return "\n".join(lines)
