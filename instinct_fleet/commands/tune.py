"""``instinct-fleet tune``'s scheduler: run a validated sweep on some hosts at once, and put every host back.

The sweep itself, its grid and its validation before any host are
:mod:`instinct_fleet.commands.sweeps`; the results, their ranking and trials.json
:mod:`instinct_fleet.commands.trials`; tune.md, pareto.png and best.py
:mod:`instinct_fleet.commands.tunereport`. Here:

- **Trials run in parallel**, one point per host at a time, on at most
  ``max_out`` hosts: only those hosts are ever away from their deployed
  configuration, so the fleet loses at most ``max_out`` hosts' capacity. Points
  go round-robin over them; each host first measures its deployed configuration
  as it runs (the baseline, no restart).
- **A trial** renders the instance's unit and env file through the deploy's own
  path (:func:`instinct_fleet.roll.plan.plan_inventory` with the host's preflight
  fact), writes them through the one applier (:func:`instinct_fleet.converge.steps.trial`'s steps, as
  :func:`instinct_fleet.converge.apply.shell` makes them a script: the declared modes, owners and restarts), waits behind the deploy's health gate
  (one token generated, :mod:`instinct_fleet.converge.health`) and benchmarks it as
  ``bench`` does: ``--warmup`` discarded requests, then ``--repeats`` runs, every one
  kept (the defaults are the host's ``canary_warmup`` and ``canary_runs``), so that a
  point is ranked by its median and named best only when it beats the deployed
  configuration beyond the noise (:mod:`instinct_fleet.live.noise`). A trial whose unit fails is recorded as failed, with its
  journal; the sweep goes on.
- **Restore is guaranteed**: a host gets back the files its deploy wrote (the
  same render with the inventory's own settings), behind the same gate, when its
  points are done, on a failure, and on SIGINT or SIGTERM (ignored while the
  restore runs). The restore takes the host's tune lock (:func:`locked`), so a
  trial's restart that the interrupt cut off on the controller ends on the host
  first. A deploy of the same inventory then changes nothing.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from instinct_fleet.commands.sweeps import BASELINE, RESULT_FIELDS, Checked, Point, Sweep, assign, with_point
from instinct_fleet.commands.trials import SHOWN, Results, Trial, judge, medians
from instinct_fleet.converge import apply, evaluate, health, preflight, probe, progress, steps
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.live import bench, canary, interrupts, remote, report
from instinct_fleet.model import paths, render, workload
from instinct_fleet.model.catalog import Catalog
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.pools import Membership
from instinct_fleet.model.spec import ServiceSpec

# The work on a host.


class HostTuner:
    """One host's trials: its preflight fact read once, each point rendered through the deploy's plan.

    The host is planned alone: it is single-node (:func:`check`), so no other host's data enters its
    plan, and a trial costs the same in a fleet of ten hosts or a thousand.
    """

    def __init__(
        self,
        runner: remote.Hosts,
        host: HostData,
        sweep: Sweep,
        results: Results,
        members: tuple[Membership, ...] = (),
        catalog: Catalog | None = None,
        board: progress.Board | None = None,
    ) -> None:
        self.runner = runner
        self.board = board or progress.Board()  # what the host is waiting for now, shown while it waits
        self.catalog = catalog or Catalog()  # the project's recipes and tables
        self.host = host
        self.members = members  # the router pools that list the tuned instance: it leaves them for the sweep
        self.name = host.name
        self.sweep = sweep
        self.results = results
        self.report: preflight.HostReport | None = None
        self.deployed: HostPlan | None = None
        self.away = False  # the instance may run something else than its deploy wrote

    @property
    def unit(self) -> str:
        return paths.vllm_unit(self.sweep.instance)

    @property
    def stamp(self) -> str:
        """The sweep's name on its benchmark runs: their results directory and their containers' label."""
        return f"tune-{self.results.dir.name}"

    def plan(self, point: Point) -> HostPlan:
        """The host's plan with the point applied: the deploy's render, from the facts read at :meth:`prepare`."""
        from instinct_fleet.roll.plan import plan_inventory

        data = dataclasses.replace(self.host, data=with_point(self.host.data, self.sweep.instance, point))
        report = self.report
        plans = plan_inventory([data], {self.name}, lambda specs: {n: report for n in specs}, catalog=self.catalog)
        return plans[self.name]

    def service(self, plan: HostPlan) -> ServiceSpec:
        return next(s for s in plan.serves if s.name == self.sweep.instance)

    def prepare(self) -> str | None:
        """Read the host's facts; refuse a host that cannot serve, or whose instance is not as its deploy left it."""
        ((spec, _),) = plan_hosts([self.host], self.catalog)
        done = self.runner.run(self.name, probe.script(spec.vars.hf_token_path, evaluate.probe(spec)), spec.vars.command_timeout)
        if done.error is not None:
            return done.error
        self.report = preflight.parse_report(done.stdout)
        plan = self.plan(BASELINE)
        if not plan.ok:
            return "; ".join(str(f) for f in plan.errors)
        if plan.quarantine is not None and plan.quarantined(self.unit):
            return (
                f"{self.unit} is quarantined (GPU health): {plan.quarantine.reason(self.unit)}; tune another host, or admit this one first"
            )
        if not plan.serving_in_place(self.unit):
            return f"{self.unit} is not as its deploy left it (files, state or health): deploy the inventory first, then tune"
        marker = self.runner.run(self.name, f"cat {paths.ROLL_MARKER} 2>/dev/null || true", 30)
        if marker.stdout.strip():
            return f"a roll or another sweep is in progress ({marker.stdout.strip()}); wait for it, or deploy again if it failed"
        self.deployed = plan
        return None

    def install(self, plan: HostPlan, why: str, first: str = "") -> tuple[str | None, list[str]]:
        """Write the instance's unit and env file, restart it, and wait behind the health gate: (problem, journal).

        ``first``: a command run before the files are written, under the same lock (the restore's).
        """
        files = [plan.desired.file(path) for path in plan.desired.unit_files(self.unit)]
        trial = apply.shell((steps.Planned(steps.mark(why)), *steps.trial(files)))  # the marker first: bench refuses the host
        svc = self.service(plan)
        v = plan.spec.vars
        stop = render.stop_seconds(svc, v.rolling_drain_timeout)
        restart = locked(" && ".join(s for s in (first, trial) if s), v.command_timeout + stop)
        if self.members and not self.away:  # out of every router pool before its first restart, back after the restore
            left = self.runner.run(
                self.name, apply.shell((steps.Planned(steps.PoolLeave(self.members, "Tune: out of the router pools")),)), v.command_timeout
            )
            if left.error is not None or not left.ok:
                return f"not restarted: {left.error or (left.stderr or left.stdout).strip()[-500:]}", []
        self.away = True
        # Twice the stop: a restore may first wait on the lock for a trial's restart that an interrupt left running.
        limit = 2 * (v.command_timeout + stop) + render.start_seconds(None, False)
        with self.board.waiting(self.name, f"{why}: restart", limit):
            done = self.runner.run(self.name, restart, limit)
        if done.error is not None or not done.ok:
            return f"restart failed: {done.error or (done.stderr or done.stdout).strip()[-500:]}", []

        def read(command: str) -> str | None:  # beside the gate's own command
            seen = self.runner.run(self.name, command, 15)
            return seen.stdout if seen.ok else None

        phase = health.phase_probe(read, paths.service(self.unit), svc.table.startup_log if svc.table is not None else {})
        with self.board.waiting(self.name, f"{why}: health gate on :{svc.port}", v.health_timeout, phase):
            waited = self.runner.run(
                self.name,
                health.wait_script(
                    paths.service(self.unit),
                    svc.port,
                    render.served_model(svc),
                    v.health_timeout,
                    v.vllm_api_key_path,
                    render.generates(svc),
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
        """``repeats`` measured runs, the first after ``warmup`` discarded requests; every run is kept under runs/."""
        svc = self.service(plan)
        concurrency = [self.sweep.concurrency] if self.sweep.concurrency else None
        (job,) = workload.jobs(plan.spec, svc, self.sweep.profile, self.sweep.num_prompts, concurrency)
        v = plan.spec.vars
        repeats = self.sweep.repeats or v.canary_runs
        warmup = v.canary_warmup if self.sweep.warmup is None else self.sweep.warmup
        for repeat in range(repeats):
            limit = workload.time_limit([job])
            with self.board.waiting(self.name, f"{point.label()}: benchmark run {repeat + 1} of {repeats}", limit):
                done = self.runner.run(self.name, bench.command(job, self.stamp, None, warmup if repeat == 0 else 0), limit)
            data = bench.result_of(done.stdout) if done.ok else None
            if data is None:
                trial.why = (
                    f"vllm bench serve failed (run {repeat + 1} of {repeats}): {done.error or (done.stderr or done.stdout).strip()[-500:]}"
                )
                return
            canary.store(self.results.run_dir(point, self.name), job, repeat, data)
            failed = report.failed_requests(data)
            if failed is not None:  # the figures of the requests left over would flatter the point
                trial.why = f"vllm bench serve: {failed} (run {repeat + 1} of {repeats}); its result is kept under runs/, not compared"
                return
            trial.runs.append({k: float(data[k]) for k in RESULT_FIELDS if isinstance(data.get(k), int | float)})
        trial.status = "measured"
        trial.figures = medians(trial.runs)
        trial.meets_slo = judge(trial.figures, self.sweep.slos)

    def restore(self) -> str | None:
        """The files the deploy wrote, back behind the gate, and the marker gone; None when the host serves as deployed."""
        if not self.away or self.deployed is None:
            return None
        problem, _ = self.install(
            self.deployed, f"tune sweep {self.results.dir.name}: restoring the deployed configuration", bench.stop_command(self.stamp)
        )
        if problem is None and self.members:  # healthy on its deployed files: back into its pools
            joined = self.runner.run(
                self.name,
                apply.shell((steps.Planned(steps.PoolJoin(self.members, "Tune: back into the router pools")),)),
                self.deployed.spec.vars.command_timeout,
            )
            problem = None if joined.ok and joined.error is None else (joined.error or (joined.stderr or joined.stdout).strip()[-500:])
        if problem is None:
            cleared = self.runner.run(self.name, apply.shell((steps.Planned(steps.unmark()),)), 30)
            problem = None if cleared.ok else f"cannot remove {paths.ROLL_MARKER}: {cleared.error or cleared.stderr}"
        if problem is None:
            self.away = False
        return problem


def locked(script: str, wait: int) -> str:
    """``script`` under the host's tune lock, waiting at most ``wait`` seconds for it.

    An interrupt stops the controller's greenlet, not the command it was running: a trial's restart goes
    on on the host. The restore takes the same lock, so it writes the deployed files after that restart
    ends, never between its writes, and its own restart is the last.
    """
    q = shlex.quote
    busy = f"instinct-fleet: another trial step held {paths.TUNE_LOCK} for {wait}s; deploy the inventory once it ends"
    return (
        f"mkdir -p {paths.TUNE_LOCK} && flock -w {wait} -E 75 {paths.TUNE_LOCK} sh -c {q(script)}"
        f" || {{ rc=$?; [ $rc -ne 75 ] || printf '%s\\n' {q(busy)} >&2; exit $rc; }}"
    )


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
    # The router pools of the whole inventory: a tuned instance leaves every pool that lists it for its sweep.
    members = {str(spec.host): spec.memberships for spec, _ in plan_hosts(hosts, checked.catalog)}
    unit = paths.vllm_unit(sweep.instance)
    board = progress.Board()  # each host's restart, health gate and benchmark runs while they last
    tuners = {
        host: HostTuner(
            runner, by_name[host], sweep, results, tuple(m for m in members.get(host, ()) if m.unit == unit), checked.catalog, board
        )
        for host in checked.hosts
    }
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

    stopped: str | None = None
    workers = [gevent.spawn(work, host, queue) for host, queue in queues.items()]
    try:
        with interrupts.raised_in_main():
            gevent.joinall(workers, raise_error=True)  # a bug in a host's work is raised here, every host restored below
    except interrupts.Interrupted as exc:
        stopped = exc.name
        say(f"{stopped}: restoring every host that left its deployed configuration (further signals are ignored until done)")
    finally:
        with interrupts.ignored():
            gevent.killall(workers)
            away = [host for host, tuner in tuners.items() if tuner.away]
            gevent.joinall([gevent.spawn(restore, host) for host in away])
            board.stop()
    return Outcome(ran, stopped is not None, unprepared, not_restored)
