"""``instinct-fleet tune``: sweep one instance's settings over some hosts at once, and find what serves best.

Each seed says "try these values of --max-num-seqs, --max-num-batched-tokens,
the AITER switches... and measure". A sweep does that on a staging group:

- **Before any host is touched**, every point of the grid (the product of the
  ``--vary`` and ``--vary-env`` values) is validated as a deploy validates it:
  the inventory with the point applied to the instance goes through
  :func:`instinct_fleet.inventory.plan_hosts`. A point that fails is skipped
  with its rule, never run.
- **Trials run in parallel**, one point per host at a time, on at most
  ``max_out`` hosts: only those hosts are ever away from their deployed
  configuration, so the fleet loses at most ``max_out`` hosts' capacity. Points
  go round-robin over them; each host first measures its deployed configuration
  as it runs (the baseline, no restart).
- **A trial** renders the instance's unit and env file through the deploy's own
  path (:func:`instinct_fleet.run.plan_inventory` with the host's preflight
  fact), restarts the unit, waits behind the deploy's health gate (one token
  generated, :mod:`instinct_fleet.health`) and benchmarks it as ``bench`` does.
  A trial whose unit fails is recorded as failed, with its journal; the sweep
  goes on.
- **Restore is guaranteed**: a host gets back the files its deploy wrote (the
  same render with the inventory's own settings), behind the same gate, when its
  points are done, on a failure, and on SIGINT or SIGTERM (ignored while the
  restore runs). A deploy of the same inventory then changes nothing.
- **Results** go to ``trials.json`` after each trial, so ``--resume DIR`` skips
  what was measured; ``tune.md``, ``pareto.png`` and ``best.py`` are written from
  it at the end (and after an interrupt, from what there is).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import pprint
import re
import shlex
import signal
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from instinct_fleet import apply, bench, canary, health, managed, paths, preflight, probe, remote, render, report
from instinct_fleet.hostplan import HostPlan
from instinct_fleet.inventory import HostData, plan_hosts
from instinct_fleet.rules import Finding
from instinct_fleet.spec import HostSpec, ServiceSpec

Value = bool | int | float | str

# vLLM's result fields (vllm/benchmarks/serve.py): the throughputs, and mean, median, std and each
# requested percentile of every requested latency, as bench asks for them (bench.vllm_bench_args).
THROUGHPUTS = ("output_throughput", "request_throughput", "total_token_throughput")
RESULT_FIELDS = THROUGHPUTS + tuple(
    f"{stat}_{metric}_ms"
    for metric in bench.PERCENTILE_METRICS
    for stat in ("mean", "median", "std", *(f"p{p}" for p in bench.METRIC_PERCENTILES))
)
# What tune.md and trials.json show of each trial; the Pareto front is output throughput against median TPOT.
SHOWN = ("output_throughput", "median_tpot_ms", "median_ttft_ms", "p99_ttft_ms", "p99_tpot_ms")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


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

    def __post_init__(self) -> None:
        if not self.vary and not self.vary_env:
            raise TuneError("nothing varies: give --vary FLAG=V1,V2 or --vary-env NAME=V1,V2 (or [vary] in the config file)")
        if self.max_out < 1:
            raise TuneError(f"--max-out must be 1 or more, got {self.max_out}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise TuneError(f"--num-prompts must be 1 or more, got {self.num_prompts}")
        if self.concurrency is not None and self.concurrency < 1:
            raise TuneError(f"--concurrency must be 1 or more, got {self.concurrency}")
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


def check(hosts: list[HostData], chosen: set[str], sweep: Sweep) -> Checked:
    """Validate every point as a deploy would, for every host that would run it; no host is contacted."""
    planned = {str(spec.host): spec for spec, _ in plan_hosts(hosts)}
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
            jobs = bench.jobs(planned[name], svc, sweep.profile, sweep.num_prompts, [sweep.concurrency] if sweep.concurrency else None)
        except bench.BenchRequestError as exc:
            raise TuneError(str(exc)) from None
        if len(jobs) != 1:
            raise TuneError(f"profile {sweep.profile!r} runs {len(jobs)} concurrencies; a trial measures one: give --concurrency N")
    points, skipped = [], []
    # The hosts that run the sweep are single-node, so a point changes nothing another host's rules read:
    # planning them alone is what the deploy's plan says of them, at a cost that does not grow with the fleet.
    tuned = [h for h in hosts if h.name in used]
    for point in grid(sweep):
        changed = [dataclasses.replace(h, data=with_point(h.data, sweep.instance, point)) for h in tuned]
        errors = [f for _, findings in plan_hosts(changed) for f in findings if f.severity == "error"]
        if errors:
            skipped.append((point, errors[0]))
        else:
            points.append(point)
    return Checked(tuple(used), tuple(idle), tuple(points), tuple(skipped))


def assign(points: list[Point], hosts: tuple[str, ...]) -> dict[str, list[Point]]:
    """Each host's queue: its baseline first, then the points round-robin in grid order."""
    queues: dict[str, list[Point]] = {host: [BASELINE] for host in hosts}
    for index, point in enumerate(points):
        queues[hosts[index % len(hosts)]].append(point)
    return queues


# Trials, their results and what they mean.


@dataclass
class Trial:
    """One point measured (or not) on one host; as it appears in trials.json."""

    settings: dict[str, Value]
    host: str
    status: str  # measured, failed or skipped
    baseline: bool = False
    figures: dict[str, float] = dataclasses.field(default_factory=dict)
    meets_slo: bool | None = None
    why: str | None = None
    journal: list[str] = dataclasses.field(default_factory=list)
    started: str | None = None
    seconds: float | None = None

    @property
    def point(self) -> Point:
        return Point(tuple(self.settings.items()), self.baseline)

    @property
    def key(self) -> str:
        return self.point.key

    def label(self) -> str:
        return self.point.label()


def judge(figures: Mapping[str, Any], slos: tuple[Slo, ...]) -> bool:
    return all(slo.met(figures) for slo in slos)


def dominates(a: Trial, b: Trial, y: str) -> bool:
    ax, bx, ay, by = a.figures["output_throughput"], b.figures["output_throughput"], a.figures[y], b.figures[y]
    return ax >= bx and ay <= by and (ax > bx or ay < by)


def pareto(trials: list[Trial], y: str = "median_tpot_ms") -> list[Trial]:
    """The measured trials no other beats on both output throughput (higher) and ``y`` (lower), by throughput."""
    measured = [t for t in trials if t.status == "measured" and "output_throughput" in t.figures and y in t.figures]
    front = [t for t in measured if not any(dominates(other, t, y) for other in measured if other is not t)]
    return sorted(front, key=lambda t: -t.figures["output_throughput"])


def best(trials: list[Trial]) -> Trial | None:
    """The highest output throughput among the measured trials that meet every SLO."""
    ok = [t for t in trials if t.status == "measured" and t.meets_slo and "output_throughput" in t.figures]
    return max(ok, key=lambda t: t.figures["output_throughput"], default=None)


def baseline_for(trials: list[Trial], host: str) -> Trial | None:
    """The deployed configuration's trial on ``host``, else on any host."""
    bases = [t for t in trials if t.baseline and t.status == "measured"]
    return next((t for t in bases if t.host == host), bases[0] if bases else None)


class Results:
    """The sweep's directory: sweep.json, trials.json (rewritten after each trial), the runs, and the report."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.trials: list[Trial] = []
        path = directory / "trials.json"
        if path.is_file():
            try:
                raw = json.loads(path.read_text())
                self.trials = [Trial(**item) for item in raw]
            except (ValueError, TypeError) as exc:
                raise TuneError(f"{path} cannot be read back ({exc}); start a new sweep in another directory") from None

    @staticmethod
    def sweep_of(directory: Path) -> Sweep:
        path = directory / "sweep.json"
        if not path.is_file():
            raise TuneError(f"{directory} holds no sweep.json: --resume takes the directory of an earlier sweep")
        try:
            return Sweep.from_json(json.loads(path.read_text()))
        except ValueError as exc:
            raise TuneError(f"{path} cannot be read back ({exc})") from None

    def start(self, sweep: Sweep) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "sweep.json").write_text(json.dumps(sweep.as_json(), indent=2) + "\n")

    def done(self) -> set[str]:
        """Points already measured or failed (on any host, the baseline per host) that a resumed sweep skips."""
        return {t.point.done_key(t.host) for t in self.trials if t.status in ("measured", "failed")}

    def record(self, trial: Trial) -> None:
        replaced = trial.point.done_key(trial.host)
        self.trials = [t for t in self.trials if t.point.done_key(t.host) != replaced]
        self.trials.append(trial)
        self.save()

    def save(self) -> None:
        tmp = self.dir / "trials.json.tmp"
        tmp.write_text(json.dumps([dataclasses.asdict(t) for t in self.trials], indent=2) + "\n")
        tmp.replace(self.dir / "trials.json")

    def run_dir(self, point: Point, host: str) -> Path:
        name = "deployed" if point.baseline else re.sub(r"[^A-Za-z0-9_.=-]+", "_", point.label().replace(" ", "_"))
        return self.dir / "runs" / name / host


# The work on a host.


class HostTuner:
    """One host's trials: its preflight fact read once, each point rendered through the deploy's plan.

    The host is planned alone: it is single-node (:func:`check`), so no other host's data enters its
    plan, and a trial costs the same in a fleet of ten hosts or a thousand.
    """

    def __init__(self, runner: remote.Hosts, host: HostData, sweep: Sweep, results: Results) -> None:
        self.runner = runner
        self.host = host
        self.name = host.name
        self.sweep = sweep
        self.results = results
        self.report: preflight.HostReport | None = None
        self.deployed: HostPlan | None = None
        self.away = False  # the instance may run something else than its deploy wrote

    @property
    def unit(self) -> str:
        return paths.vllm_unit(self.sweep.instance)

    def plan(self, point: Point) -> HostPlan:
        """The host's plan with the point applied: the deploy's render, from the facts read at :meth:`prepare`."""
        from instinct_fleet.run import plan_inventory

        data = dataclasses.replace(self.host, data=with_point(self.host.data, self.sweep.instance, point))
        report = self.report
        plans = plan_inventory([data], {self.name}, lambda specs: {n: report for n in specs})
        return plans[self.name]

    def service(self, plan: HostPlan) -> ServiceSpec:
        return next(s for s in plan.serves if s.name == self.sweep.instance)

    def prepare(self) -> str | None:
        """Read the host's facts; refuse a host that cannot serve, or whose instance is not as its deploy left it."""
        ((spec, _),) = plan_hosts([self.host])
        done = self.runner.run(self.name, probe.script(spec.vars.hf_token_path, managed.probe(spec)), spec.vars.command_timeout)
        if done.error is not None:
            return done.error
        self.report = preflight.parse_report(done.stdout)
        plan = self.plan(BASELINE)
        if not plan.ok:
            return "; ".join(str(f) for f in plan.errors)
        if not plan.serving_in_place(self.unit):
            return f"{self.unit} is not as its deploy left it (files, state or health): deploy the inventory first, then tune"
        marker = self.runner.run(self.name, f"cat {paths.ROLL_MARKER} 2>/dev/null || true", 30)
        if marker.stdout.strip():
            return f"a roll or another sweep is in progress ({marker.stdout.strip()}); wait for it, or deploy again if it failed"
        self.deployed = plan
        return None

    def install(self, plan: HostPlan, why: str) -> tuple[str | None, list[str]]:
        """Write the instance's unit and env file, restart it, and wait behind the health gate: (problem, journal)."""
        q = shlex.quote
        files = [plan.desired.file(path) for path in plan.desired.unit_files(self.unit)]
        marker = f"mkdir -p {q(str(Path(paths.ROLL_MARKER).parent))} && printf '%s\\n' {q(why)} > {paths.ROLL_MARKER}"
        svc = self.service(plan)
        v = plan.spec.vars
        restart = f"{marker} && {apply.script(files)}"
        self.away = True
        done = self.runner.run(
            self.name, restart, v.command_timeout + render.start_seconds(None, False) + render.stop_seconds(svc, v.rolling_drain_timeout)
        )
        if done.error is not None or not done.ok:
            return f"restart failed: {done.error or (done.stderr or done.stdout).strip()[-500:]}", []
        waited = self.runner.run(
            self.name,
            health.wait_script(
                paths.service(self.unit), svc.port, render.served_model(svc), v.health_timeout, v.vllm_api_key_path, render.generates(svc)
            ),
            v.health_timeout + 60,
        )
        if waited.error is not None:
            return f"health gate: {waited.error}", []
        result = health.parse(waited.stdout)
        problem = health.verdict(self.unit, svc.port, render.served_model(svc), result)
        return problem, list(result.journal)

    def measure(self, point: Point) -> Trial:
        """One trial: the point installed behind the gate (not for the baseline), then benchmarked."""
        started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        begun = time.monotonic()
        trial = Trial(dict(point.settings), self.name, "failed", baseline=point.baseline, started=started)
        plan = self.deployed if point.baseline else self.plan(point)
        assert plan is not None, "prepare() comes first"
        if not plan.ok:  # validated before the sweep; the host's facts can still refuse (too few GPUs for a TP)
            trial.why = "; ".join(str(f) for f in plan.errors)
        else:
            problem, journal = (None, []) if point.baseline else self.install(plan, f"tune sweep {self.results.dir.name}: {point.label()}")
            if problem is not None:
                trial.why, trial.journal = problem, journal
            else:
                self.bench(plan, point, trial)
        trial.seconds = round(time.monotonic() - begun, 1)
        return trial

    def bench(self, plan: HostPlan, point: Point, trial: Trial) -> None:
        svc = self.service(plan)
        concurrency = [self.sweep.concurrency] if self.sweep.concurrency else None
        (job,) = bench.jobs(plan.spec, svc, self.sweep.profile, self.sweep.num_prompts, concurrency)
        stamp = f"tune-{self.results.dir.name}"
        done = self.runner.run(self.name, bench.command(job, stamp, None), bench.time_limit([job]))
        data = bench.result_of(done.stdout) if done.ok else None
        if data is None:
            trial.why = f"vllm bench serve failed: {done.error or (done.stderr or done.stdout).strip()[-500:]}"
            return
        canary.store(self.results.run_dir(point, self.name), job, 0, data)
        failed = report.failed_requests(data)
        if failed is not None:  # the figures of the requests left over would flatter the point
            trial.why = f"vllm bench serve: {failed}; its result is kept under runs/, not compared"
            return
        trial.status = "measured"
        trial.figures = {k: float(data[k]) for k in RESULT_FIELDS if isinstance(data.get(k), int | float)}
        trial.meets_slo = judge(trial.figures, self.sweep.slos)

    def restore(self) -> str | None:
        """The files the deploy wrote, back behind the gate, and the marker gone; None when the host serves as deployed."""
        if not self.away or self.deployed is None:
            return None
        problem, _ = self.install(self.deployed, f"tune sweep {self.results.dir.name}: restoring the deployed configuration")
        if problem is None:
            cleared = self.runner.run(self.name, f"rm -f {paths.ROLL_MARKER}", 30)
            problem = None if cleared.ok else f"cannot remove {paths.ROLL_MARKER}: {cleared.error or cleared.stderr}"
        if problem is None:
            self.away = False
        return problem


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM (a CI runner cancelling the job) stops the sweep as Ctrl-C does."""

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = {number: signal.signal(number, stop) for number in SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """While hosts are restored: a second Ctrl-C must not leave one half-way."""
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@dataclass(frozen=True)
class Outcome:
    ran: list[Trial]  # the trials this run measured or saw fail, in the order they ended
    interrupted: bool
    unprepared: dict[str, str]  # host -> why it ran nothing
    not_restored: dict[str, str]  # host -> why its restore failed


def run(
    runner: remote.Hosts,
    hosts: list[HostData],
    checked: Checked,
    sweep: Sweep,
    results: Results,
    say: Callable[[str], None],
) -> Outcome:
    """Run every host's queue at once; restore each host when its queue ends, and every host on an interrupt."""
    import gevent

    done = results.done()
    queues = {
        host: [p for p in queue if p.done_key(host) not in done] for host, queue in assign(list(checked.points), checked.hosts).items()
    }
    by_name = {h.name: h for h in hosts}
    tuners = {host: HostTuner(runner, by_name[host], sweep, results) for host in checked.hosts}
    unprepared: dict[str, str] = {}
    not_restored: dict[str, str] = {}
    ran: list[Trial] = []
    total = sum(len(q) for q in queues.values())
    counter = [0]

    def work(host: str, queue: list[Point]) -> None:
        tuner = tuners[host]
        if not queue:
            return
        problem = tuner.prepare()
        if problem is not None:
            unprepared[host] = problem
            say(f"{host}: runs nothing: {problem}")
            return
        for point in queue:
            counter[0] += 1
            say(f"[{counter[0]}/{total}] {host}: {point.label()}: started")
            trial = tuner.measure(point)
            results.record(trial)
            ran.append(trial)
            shown = ", ".join(f"{k} {trial.figures[k]:.1f}" for k in SHOWN[:3] if k in trial.figures)
            say(f"    {host}: {point.label()}: {trial.status} in {trial.seconds:.0f}s" + (f": {shown}" if shown else f": {trial.why}"))
        restore(host)

    def restore(host: str) -> None:
        if not tuners[host].away:
            return
        say(f"{host}: restoring the deployed {tuners[host].unit}")
        problem = tuners[host].restore()
        if problem is not None:
            not_restored[host] = problem
            say(f"{host}: NOT restored: {problem}")
        else:
            not_restored.pop(host, None)
            say(f"{host}: restored, healthy")

    interrupted = False
    workers = [gevent.spawn(work, host, queue) for host, queue in queues.items()]
    try:
        with signals_raise():
            gevent.joinall(workers, raise_error=True)
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: restoring every host that left its deployed configuration (further Ctrl-C is ignored until done)")
    finally:
        with signals_ignored():
            gevent.killall(workers)
            away = [host for host, tuner in tuners.items() if tuner.away]
            gevent.joinall([gevent.spawn(restore, host) for host in away])
    return Outcome(ran, interrupted, unprepared, not_restored)


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
    bound = max(s.vars.health_timeout + s.vars.command_timeout * bench.RUN_LIMIT_FACTOR for s in specs.values())
    lines.append(
        f"  {len(checked.hosts)} host(s) at once, never more than --max-out {sweep.max_out} away from their deployed configuration; "
        f"{rounds} restart round(s) plus the baselines and a restore: each round takes one start-up, health gate and benchmark "
        f"(at most {math.ceil(bound / 60)} min a round by health_timeout and the benchmark limit)"
    )
    return "\n".join(lines)


def best_fragment(hosts: list[HostData], host: str, sweep: Sweep, winner: Trial) -> str:
    """group_data text: the host's ``vllm_instances`` with the winner's flags and env in the instance's entry."""
    data = next(h.data for h in hosts if h.name == host)
    entries = with_point(data, sweep.instance, winner.point)["vllm_instances"]
    head = (
        f'"""instinct-fleet tune: the best point for instance {sweep.instance!r}, {winner.label()},\n'
        f"measured on {winner.host} with profile {sweep.profile!r}. Copy into group_data/<your group>.py, then deploy\n"
        'with canary_profile set, so that the canary proves the gain on production before the rest rolls."""\n\n'
    )
    return head + "vllm_instances = " + pprint.pformat(entries, sort_dicts=False, width=100) + "\n"


def markdown(trials: list[Trial], sweep: Sweep, skipped: tuple[tuple[Point, Finding], ...], speed: str) -> str:
    """tune.md: the table by throughput, the Pareto fronts, the best point within the SLOs and its gain."""
    measured = sorted((t for t in trials if t.status == "measured"), key=lambda t: -t.figures.get("output_throughput", 0))
    front = {id(t) for t in pareto(trials)}
    front_ttft = {id(t) for t in pareto(trials, "median_ttft_ms")}
    lines = [f"# Tuning {paths.vllm_unit(sweep.instance)}: profile {sweep.profile}", ""]
    lines.append(f"SLOs: {', '.join(map(str, sweep.slos)) or 'none'}. {speed}")
    lines += ["", "| settings | host | output tok/s | median TPOT ms | median TTFT ms | p99 TTFT ms | SLO | Pareto (TPOT / TTFT) |"]
    lines.append("|---|---|---:|---:|---:|---:|---|---|")
    for t in measured:
        f = t.figures
        marks = " / ".join("yes" if id(t) in s else "-" for s in (front, front_ttft))
        lines.append(
            f"| {t.label()} | {t.host} | {f.get('output_throughput', 0):.1f} | {f.get('median_tpot_ms', 0):.2f} | "
            f"{f.get('median_ttft_ms', 0):.1f} | {f.get('p99_ttft_ms', 0):.1f} | {'met' if t.meets_slo else 'missed'} | {marks} |"
        )
    lines += ["", "## Pareto front: output throughput against median TPOT", ""]
    lines += [
        f"- {t.label()} on {t.host}: {t.figures['output_throughput']:.1f} tok/s, {t.figures['median_tpot_ms']:.2f} ms"
        for t in pareto(trials)
    ]
    lines += ["", "## Pareto front: output throughput against median TTFT", ""]
    lines += [
        f"- {t.label()} on {t.host}: {t.figures['output_throughput']:.1f} tok/s, {t.figures['median_ttft_ms']:.1f} ms"
        for t in pareto(trials, "median_ttft_ms")
    ]
    winner = best(trials)
    lines += ["", "## Best point within the SLOs", ""]
    if winner is None:
        lines.append("No measured point meets every SLO.")
    else:
        lines.append(f"**{winner.label()}** on {winner.host}: {winner.figures['output_throughput']:.1f} output tok/s.")
        base = baseline_for(trials, winner.host)
        if base is not None and not winner.baseline:
            parts = [
                f"{label} {canary.change(base.figures[key], winner.figures[key]):+.1f}% ({base.figures[key]:.1f} -> {winner.figures[key]:.1f} {unit})"
                for key, label, unit, _ in canary.METRICS
                if key in base.figures and key in winner.figures
            ]
            lines.append(f"Against the deployed configuration measured in this sweep on {base.host}: {', '.join(parts)}.")
        lines.append("`best.py` holds it as group_data.")
    failed = [t for t in trials if t.status == "failed"]
    if failed:
        lines += ["", "## Failed trials", ""]
        for t in failed:
            lines.append(f"- {t.label()} on {t.host}: {t.why}")
    if skipped:
        lines += ["", "## Skipped as invalid (never run)", ""]
        lines += [f"- {p.label()}: [{f.rule}] {f.key}: {f.message}" for p, f in skipped]
    return "\n".join(lines) + "\n"


def plot(trials: list[Trial], path: Path) -> None:
    """pareto.png: every measured trial, output throughput against median TPOT, the front joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [t for t in trials if t.status == "measured" and "median_tpot_ms" in t.figures]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([t.figures["median_tpot_ms"] for t in measured], [t.figures["output_throughput"] for t in measured], color="grey")
    for t in measured:
        ax.annotate(t.label(), (t.figures["median_tpot_ms"], t.figures["output_throughput"]), fontsize=7)
    front = sorted(pareto(trials), key=lambda t: t.figures["median_tpot_ms"])
    ax.plot([t.figures["median_tpot_ms"] for t in front], [t.figures["output_throughput"] for t in front], color="tab:red", marker="o")
    ax.set_xlabel("median TPOT (ms)")
    ax.set_ylabel("output throughput (tok/s)")
    ax.set_title("Sweep: Pareto front in red")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: Results, hosts: list[HostData], sweep: Sweep, checked: Checked, speed: str) -> None:
    """tune.md, pareto.png, best.py and the skipped points in trials.json, from the trials so far."""
    for point, found in checked.skipped:
        if not any(t.key == point.key for t in results.trials):
            results.trials.append(Trial(dict(point.settings), "", "skipped", why=f"[{found.rule}] {found.key}: {found.message}"))
    results.save()
    (results.dir / "tune.md").write_text(markdown(results.trials, sweep, checked.skipped, speed))
    plot(results.trials, results.dir / "pareto.png")
    winner = best(results.trials)
    best_file = results.dir / "best.py"
    if winner is not None:
        best_file.write_text(best_fragment(hosts, winner.host, sweep, winner))
    elif best_file.exists():
        best_file.unlink()
