"""instinct-fleet tune without hosts: the grid, its validation, who runs what, and what the results mean."""

from __future__ import annotations

import io
import json
import math
import os
import random
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import pytest

from instinct_fleet.commands import sweeps, trials, tune, tunereport
from instinct_fleet.commands.sweeps import BASELINE, Slo, Sweep, TuneError
from instinct_fleet.commands.trials import Trial
from instinct_fleet.converge import health, preflight
from instinct_fleet.live import bench
from instinct_fleet.live.remote import Result
from instinct_fleet.model import paths
from instinct_fleet.model.inventory import HostData, load_inventory, plan_hosts
from instinct_fleet.model.pools import Membership
from instinct_fleet.model.rules import RULES
from tests.unit.test_preflight import mi300x_host

ROOT = Path(__file__).resolve().parents[2]


def sweep(**changes: Any) -> Sweep:
    data: dict[str, Any] = {
        "instance": "main",
        "vary": {"max-num-seqs": [4, 32], "max-num-batched-tokens": [2048, 16384]},
        "max_out": 2,
        **changes,
    }
    return Sweep.from_json(data)


# The default recipe (gpt-oss-120b: --max-model-len 8192, chunked prefill off) on two hosts; one more host
# serves another instance, a cluster member serves "main" across nodes.
HOSTS = [
    HostData("s1", ("staging",), {}),
    HostData("s2", ("staging",), {}),
    HostData("s3", ("staging",), {"vllm_instances": [{"name": "other", "args": {"max-num-seqs": 8}}]}),
]


def test_values_are_typed_as_group_data_holds_them() -> None:
    assert sweeps.parse_vary("--max-num-seqs=64,128", env=False) == ("max-num-seqs", (64, 128))
    assert sweeps.parse_vary("gpu-memory-utilization=0.9,0.95", env=False) == ("gpu-memory-utilization", (0.9, 0.95))
    assert sweeps.parse_vary("enforce-eager=true,false", env=False) == ("enforce-eager", (True, False))
    assert sweeps.parse_vary("VLLM_ROCM_USE_AITER=0,1", env=True) == ("VLLM_ROCM_USE_AITER", ("0", "1"))


@pytest.mark.parametrize(
    ("text", "env", "says"),
    [
        ("max-num-seqs", False, "takes NAME=V1,V2"),
        ("max-num-seqs=4,,8", False, "an empty value"),
        ("max-num-seqs=4,4", False, "listed twice"),
        ("1BAD=0,1", True, "not an environment variable name"),
    ],
)
def test_a_wrong_vary_says_what_is_wrong(text: str, env: bool, says: str) -> None:
    with pytest.raises(TuneError, match=says):
        sweeps.parse_vary(text, env)


def test_slos_name_vllms_own_result_fields() -> None:
    assert sweeps.parse_slo("median_tpot_ms<=25") == Slo("median_tpot_ms", "<=", 25.0)
    assert sweeps.parse_slo("output_throughput >= 1000").met({"output_throughput": 1200.0})
    assert not sweeps.parse_slo("p99_ttft_ms<=100").met({"p99_ttft_ms": 101.0})
    assert not sweeps.parse_slo("p99_ttft_ms<=100").met({})  # a figure that is not there does not meet it
    with pytest.raises(TuneError, match="not a field of vLLM's benchmark result"):
        sweeps.parse_slo("median_tpot<=25")
    with pytest.raises(TuneError, match="METRIC<=VALUE"):
        sweeps.parse_slo("median_tpot_ms=25")


def test_the_grid_is_every_combination_in_the_order_given() -> None:
    points = sweeps.grid(sweep(vary_env={"VLLM_ROCM_USE_AITER": ["0", "1"]}))
    assert [p.label() for p in points][:3] == [
        "--max-num-seqs=4 --max-num-batched-tokens=2048 VLLM_ROCM_USE_AITER=0",
        "--max-num-seqs=4 --max-num-batched-tokens=2048 VLLM_ROCM_USE_AITER=1",
        "--max-num-seqs=4 --max-num-batched-tokens=16384 VLLM_ROCM_USE_AITER=0",
    ]
    assert len(points) == 8 and len({p.key for p in points}) == 8
    assert points[0].flags() == {"max-num-seqs": 4, "max-num-batched-tokens": 2048} and points[0].env() == {"VLLM_ROCM_USE_AITER": "0"}


def test_a_sweep_with_nothing_to_vary_or_a_bad_setting_is_refused() -> None:
    with pytest.raises(TuneError, match="nothing varies"):
        Sweep.from_json({"instance": "main"})
    with pytest.raises(TuneError, match="max-out must be 1 or more"):
        sweep(max_out=0)
    with pytest.raises(TuneError, match="--repeats must be 1 to 10, got 0"):
        sweep(repeats=0)
    with pytest.raises(TuneError, match="--warmup must be 0 or more, got -1"):
        sweep(warmup=-1)
    assert (sweep(repeats=5, warmup=0).repeats, Sweep.from_json(sweep(repeats=5).as_json()).repeats) == (5, 5)
    with pytest.raises(TuneError, match="unknown key"):
        sweep(hosts=3)
    with pytest.raises(TuneError, match="varied twice"):
        Sweep("main", vary=(("max-num-seqs", (1,)),), vary_env=(("max-num-seqs", ("1",)),))


def test_every_point_is_validated_as_a_deploy_would_and_invalid_ones_are_skipped_with_their_rule() -> None:
    checked = sweeps.check(HOSTS, {"s1", "s2", "s3"}, sweep())
    assert checked.hosts == ("s1", "s2")
    assert checked.idle == (("s3", "has no instance 'main'"),)
    # chunked prefill is off in the recipe, so a budget below --max-model-len 8192 cannot start
    assert [p.label() for p in checked.points] == [
        "--max-num-seqs=4 --max-num-batched-tokens=16384",
        "--max-num-seqs=32 --max-num-batched-tokens=16384",
    ]
    assert {f.rule for _, f in checked.skipped} == {"scheduler-batched-below-model-len"}
    assert all(f.host == "s1" and f.rule in RULES for _, f in checked.skipped)
    # an env var value vLLM refuses, and a flag it does not have, are refused the same way
    odd = sweep(vary={"max-num-seqs": [8, 16]}, vary_env={"VLLM_ROCM_USE_AITER": ["yes", "no"]})
    with pytest.raises(TuneError, match=r"every point of the sweep is invalid, so there is nothing to measure \(4 skipped: ") as raised:
        sweeps.check(HOSTS, {"s1"}, odd)
    assert raised.value.args[0].count("[value-format] vllm_env.VLLM_ROCM_USE_AITER") == 4
    with pytest.raises(TuneError, match=r"\(1 skipped: --max-num-seqz=8: \[flag-unknown\]"):
        sweeps.check(HOSTS, {"s1"}, sweep(vary={"max-num-seqz": [8]}))


def test_what_deploy_accepts_for_a_point_is_what_the_sweep_runs() -> None:
    """The point's data is the inventory's with the instance's args and env extended; it plans without errors."""
    (point,) = [p for p in sweeps.grid(sweep()) if p.flags() == {"max-num-seqs": 32, "max-num-batched-tokens": 16384}]
    data = sweeps.with_point(
        {"vllm_instances": [{"name": "main", "args": {"max-model-len": 16384}}, {"name": "b", "gpus": [1]}]}, "main", point
    )
    (spec, findings), *_ = plan_hosts([HostData("s1", ("staging",), data)])
    assert not [f for f in findings if f.severity == "error"], findings
    main = spec.services[0]
    assert (main.args["max-num-seqs"], main.args["max-num-batched-tokens"], main.args["max-model-len"]) == (32, 16384, 16384)
    assert spec.services[1].name == "b"


def test_max_out_bounds_the_hosts_that_leave_their_configuration() -> None:
    checked = sweeps.check(HOSTS, {"s1", "s2"}, sweep(max_out=1))
    assert checked.hosts == ("s1",)
    assert checked.idle[0][0] == "s2" and "--max-out 1" in checked.idle[0][1]


def test_hosts_that_cannot_tune_the_instance_are_named() -> None:
    with pytest.raises(TuneError, match="s3 has no instance 'main'"):
        sweeps.check(HOSTS, {"s3"}, sweep())
    cluster = {"ray_cluster": "c", "cluster_nic": "eth0", "nccl_ib_hca": "mlx5_0", "vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2}
    members = [HostData("c1", ("c",), {**cluster, "ray_role": "head"}), HostData("c2", ("c",), {**cluster, "ray_role": "worker"})]
    with pytest.raises(TuneError, match="spans a Ray cluster"):
        sweeps.check(members, {"c1"}, sweep(vary={"max-num-seqs": [8]}))


def test_a_profile_the_instance_cannot_run_is_refused_before_any_host() -> None:
    short = [HostData("s1", ("staging",), {"vllm_args": {"max-model-len": 2048}})]
    with pytest.raises(TuneError, match="sends 4096 \\+ 1024 tokens, more than s1/main's --max-model-len 2048"):
        sweeps.check(short, {"s1"}, sweep(profile="seed-001-gpt-oss"))
    with pytest.raises(TuneError, match="runs 5 concurrencies; a trial measures one: give --concurrency N"):
        sweeps.check(HOSTS, {"s1"}, sweep(profile="sweep"))
    assert sweeps.check(HOSTS, {"s1"}, sweep(profile="sweep", concurrency=8)).points


def test_points_go_round_robin_after_each_hosts_baseline() -> None:
    points = sweeps.grid(sweep(vary={"max-num-seqs": [1, 2, 3, 4, 5]}))
    queues = sweeps.assign(points, ("a", "b"))
    assert queues["a"] == [BASELINE, points[0], points[2], points[4]]
    assert queues["b"] == [BASELINE, points[1], points[3]]


def trial(seqs: int, tput: float, tpot: float, ttft: float, host: str = "s1", baseline: bool = False) -> Trial:
    figures = {"output_throughput": tput, "median_tpot_ms": tpot, "median_ttft_ms": ttft}
    settings: dict[str, Any] = {} if baseline else {"--max-num-seqs": seqs}
    return Trial(
        settings, host, "measured", baseline=baseline, figures=figures, meets_slo=trials.judge(figures, (Slo("median_tpot_ms", "<=", 8.0),))
    )


# Recorded results, shaped as the stand-in's model makes them: more sequences, more throughput, slower tokens.
A, B, C, D = trial(4, 1000, 4.0, 900), trial(32, 2000, 12.0, 300), trial(8, 900, 5.0, 800, host="s2"), trial(64, 1900, 13.0, 250)
BASE = trial(0, 1800, 12.5, 350, baseline=True)
FAILED = Trial({"--max-num-seqs": 128}, "s2", "failed", why="vllm-main: not healthy on :8080: failed")


def test_the_pareto_front_keeps_what_nothing_beats_on_both() -> None:
    ran = [A, B, C, D, BASE, FAILED]
    assert trials.pareto(ran) == [B, A]
    # against TTFT, more sequences also win: 64 has the lowest TTFT and is on that front
    assert trials.pareto(ran, "median_ttft_ms") == [B, D]


def test_the_best_point_is_the_fastest_that_meets_every_slo() -> None:
    assert trials.best([A, B, C, D, BASE, FAILED]) is A
    assert trials.best([B, D]) is None
    assert trials.best([trial(4, 100, 1, 1), trial(8, 200, 2, 2)]) == trial(8, 200, 2, 2)


def test_the_report_sorts_by_throughput_and_gives_the_gain_over_the_deployed_configuration(tmp_path: Path) -> None:
    text = tunereport.markdown([A, B, C, D, BASE, FAILED], sweep(slos=["median_tpot_ms<=8"]), (), "2 trials.", 10.0, 0.01)
    rows = [line for line in text.splitlines() if line.startswith("| --") or line.startswith("| deployed")]
    assert [r.split(" | ")[2] for r in rows] == ["2000.0", "1900.0", "1800.0", "1000.0", "900.0"]
    assert "**--max-num-seqs=4** on s1: 1000.0 output tok/s" in text
    assert "It meets every SLO in each of its 1 run(s); the deployed configuration misses them." in text
    assert "output throughput -44.4% (1800.0 -> 1000.0 tok/s), median TPOT -68.0% (12.5 -> 4.0 ms)" in text
    assert "--max-num-seqs=128 on s2: vllm-main: not healthy" in text
    tunereport.plot([A, B, C, D, BASE], tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def repeated(seqs: int, throughputs: list[float], baseline: bool = False) -> Trial:
    """A point measured once per throughput (TPOT and TTFT equal), as trials.json keeps it."""
    runs = [{"output_throughput": t, "median_tpot_ms": 5.0, "median_ttft_ms": 300.0} for t in throughputs]
    return Trial(
        {} if baseline else {"--max-num-seqs": seqs},
        "s1",
        "measured",
        baseline=baseline,
        figures=trials.medians(runs),
        runs=runs,
        meets_slo=True,
    )


def test_a_point_is_named_best_only_when_it_beats_the_deployed_configuration_beyond_the_noise(tmp_path: Path) -> None:
    base = repeated(0, [1000.0, 1060.0, 1030.0], baseline=True)
    # Within the runs' noise: every point equal within it, so none is named.
    equal = [base, repeated(8, [1050.0, 1000.0, 1070.0]), repeated(16, [1020.0, 1045.0, 1010.0])]
    winner, said = tunereport.champion(equal, sweep(), 10.0, 0.01)
    assert winner is None and said.startswith("No point beats the deployed configuration beyond the noise.")
    assert "within the noise (t-test p=0.367 over the 3 and 3 runs (alpha 0.01 / 2 points = 0.005))" in said
    # Beyond it: named, with the evidence; the best of three points is judged at alpha / 3.
    faster = repeated(32, [1200.0, 1180.0, 1210.0])
    winner, said = tunereport.champion([*equal, faster], sweep(), 10.0, 0.01)
    assert winner is faster and "beyond 0%, 10 tok/s and the noise (t-test p=0.000" in said and "(alpha 0.01 / 3 points = 0.0033))" in said
    # One run per point: no noise to judge by, so nothing can be named.
    winner, said = tunereport.champion([repeated(0, [1000.0], True), repeated(32, [1200.0])], sweep(), 10.0, 0.01)
    assert winner is None and "1 and 1 runs: too few to judge the noise" in said
    # The table gives each figure's median and spread; best.py is written only for a point that beats the baseline.
    text = tunereport.markdown(equal, sweep(), (), "3 trials.", 10.0, 0.01)
    assert "| --max-num-seqs=8 | s1 | 1050.0 (1000.0-1070.0, 3 runs) |" in text
    results = trials.Results(tmp_path)
    results.start(sweep())
    results.trials = list(equal)
    checked = sweeps.Checked(("s1",), (), (), (), 10.0, 0.01)
    hosts = [HostData("s1", ("staging",), {"vllm_instances": [{"name": "main"}]})]
    tunereport.write_report(results, hosts, sweep(), checked, "3 trials.")
    assert not (tmp_path / "best.py").exists()
    results.trials.append(faster)
    tunereport.write_report(results, hosts, sweep(), checked, "4 trials.")
    assert "--max-num-seqs" in (tmp_path / "best.py").read_text()
    # trials.json keeps every run of every point.
    assert [t.runs for t in trials.Results(tmp_path).trials if not t.baseline][-1] == faster.runs


@pytest.mark.parametrize("points", [6, 12])
def test_the_best_of_many_harmless_points_is_named_at_most_alpha_of_the_time(points: int) -> None:
    """K points that are all the deployed configuration again (run-to-run variation 10%, three runs each): picking
    the fastest and testing it at alpha alone names one in 2.3% (K=6) and 3.3% (K=12) of sweeps where the old band
    was meant to hold 0.7%; split over the K points, at most alpha (plus 3.72 binomial standard deviations)."""
    rng = random.Random(points)
    alpha, sweeps_run, named, uncorrected = 0.01, 2000, 0, 0

    def measured(baseline: bool = False) -> Trial:
        factor = [math.exp(rng.gauss(0, 0.10)) for _ in range(3)]
        return repeated(0 if baseline else 8, [1000.0 / f for f in factor], baseline)

    for _ in range(sweeps_run):
        found = [measured(True), *(measured() for _ in range(points))]
        named += tunereport.champion(found, sweep(), 10.0, alpha)[0] is not None
        winner = trials.best(found)
        judged = winner and not winner.baseline and trials.gain(winner, found[0], 10.0, alpha, 1)
        uncorrected += bool(judged and judged.status == "beyond")
    assert named / sweeps_run <= alpha + 3.72 * math.sqrt(alpha * (1 - alpha) / sweeps_run), named
    assert uncorrected > 2 * named and uncorrected / sweeps_run > alpha, (uncorrected, named)  # what the split buys


def test_best_py_is_group_data_that_deploys_the_winner(tmp_path: Path) -> None:
    hosts = [HostData("s1", ("staging",), {"vllm_instances": [{"name": "main", "port": 8000}, {"name": "b", "gpus": [1]}]})]
    text = tunereport.best_fragment(hosts, "s1", sweep(), A)
    (tmp_path / "best.py").write_text(text)
    data = runpy.run_path(str(tmp_path / "best.py"))
    (spec, findings), *_ = plan_hosts([HostData("s1", ("staging",), {"vllm_instances": data["vllm_instances"]})])
    assert not [f for f in findings if f.severity == "error"]
    assert spec.services[0].args["max-num-seqs"] == 4 and spec.services[0].port == 8000 and spec.services[1].name == "b"


def test_results_are_kept_after_each_trial_and_a_resumed_sweep_skips_them(tmp_path: Path) -> None:
    results = trials.Results(tmp_path)
    results.start(sweep())
    results.record(A)
    results.record(BASE)
    results.record(FAILED)
    again = trials.Results(tmp_path)
    assert again.trials == [A, BASE, FAILED]
    assert again.done() == {A.key, "deployed@s1", FAILED.key}
    assert trials.Results.sweep_of(tmp_path) == sweep()
    again.record(trial(4, 1100, 4.0, 900))  # the same point measured again replaces the first
    assert [t.figures["output_throughput"] for t in trials.Results(tmp_path).trials if t.key == A.key] == [1100]
    (tmp_path / "trials.json").write_text("[{")
    with pytest.raises(TuneError, match="cannot be read back"):
        trials.Results(tmp_path)
    with pytest.raises(TuneError, match=r"holds no sweep\.json"):
        trials.Results.sweep_of(tmp_path / "elsewhere")


def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "inventories" / "staging.py"
    path.parent.mkdir()
    # Addresses nobody answers on: a dry run and a refused sweep never connect.
    path.write_text("staging = [('s1', {'ssh_hostname': '192.0.2.1'}), ('s2', {'ssh_hostname': '192.0.2.2'})]\n")
    return path


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "instinct_fleet", "tune", *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_a_dry_run_prints_the_whole_plan_and_touches_nothing(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    config = tmp_path / "sweep.toml"
    config.write_text(
        'instance = "main"\nmax_out = 2\nprofile = "latency"\nslo = ["median_tpot_ms<=20"]\n[vary]\nmax-num-seqs = [4, 32]\nmax-num-batched-tokens = [2048, 16384]\n'
    )
    done = cli(str(inv), "--config", str(config), "--dry", "--output", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "tune vllm-main: 2 point(s) to measure, 2 skipped as invalid, profile latency, SLOs median_tpot_ms<=20" in done.stdout
    assert "skipped --max-num-seqs=4 --max-num-batched-tokens=2048: [scheduler-batched-below-model-len]" in done.stdout
    assert "s1: deployed; --max-num-seqs=4 --max-num-batched-tokens=16384" in done.stdout
    assert "s2: deployed; --max-num-seqs=32 --max-num-batched-tokens=16384" in done.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--instance", "main"], "nothing varies"),
        (["--instance", "main", "--vary", "max-num-seqs"], "--vary takes NAME=V1,V2"),
        (["--instance", "main", "--vary", "max-num-seqs=4,8", "--slo", "tpot<=3"], "not a field of vLLM's benchmark result"),
        (["--instance", "nope", "--vary", "max-num-seqs=4,8"], "no host of --limit can tune instance 'nope'"),
        (["--instance", "main", "--vary", "max-num-batched-tokens=256,512"], "every point of the sweep is invalid"),
        (["--instance", "main", "--vary", "max-num-seqs=4,8", "--profile", "sweep"], "runs 5 concurrencies"),
        (["--resume", "somewhere", "--vary", "max-num-seqs=4"], "--resume takes the sweep from DIR/sweep.json; drop --vary"),
        (["--resume", "somewhere"], "holds no sweep.json"),
        (["--config", "missing.toml"], "cannot read missing.toml"),
        (["--instance", "main", "--vary", "max-num-seqs=4,8", "--output", "{earlier}"], "holds an earlier sweep: go on with --resume"),
    ],
)
def test_a_sweep_that_cannot_run_fails_before_any_host_with_why(tmp_path: Path, argv: list[str], says: str) -> None:
    earlier = tmp_path / "earlier"
    trials.Results(earlier).start(sweep())
    argv = [a.replace("{earlier}", str(earlier)) for a in argv]
    done = cli(str(inventory(tmp_path)), *argv)
    assert done.returncode == 2, done.stdout
    assert says in done.stderr and "Traceback" not in done.stderr


def test_resuming_a_finished_sweep_says_so_and_contacts_no_host(tmp_path: Path) -> None:
    """Every baseline and point measured: a resume has nothing to do, and says where the report is instead of reconnecting."""
    inv = inventory(tmp_path)
    out = tmp_path / "out"
    definition = sweep(vary={"max-num-seqs": [4, 32]}, max_out=2)
    results = trials.Results(out)
    results.start(definition)
    checked = sweeps.check(load_inventory(str(inv), str(ROOT)), {"s1", "s2"}, definition)
    for host, queue in sweeps.assign(list(checked.points), checked.hosts).items():
        for point in queue:
            results.record(trials.Trial(dict(point.settings), host, "measured", baseline=point.baseline))
    done = cli(str(inv), "--resume", str(out))
    assert done.returncode == 2 and "measured every point of its sweep already: nothing to do" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (out / "tune.md").exists()
    results.trials.pop()  # one point left: the resume goes on to run it (--dry stops it before any host)
    results.save()
    assert cli(str(inv), "--resume", str(out), "--dry").returncode == 0


def test_hosts_that_cannot_be_reached_run_nothing_and_say_why(tmp_path: Path) -> None:
    """Real connections (pyinfra's SSH connector) to a port nobody listens on: each host fails alone, the run exits 1."""
    path = tmp_path / "inventories" / "down.py"
    path.parent.mkdir()
    path.write_text("down = [(n, {'ssh_hostname': '127.0.0.1', 'ssh_port': 1}) for n in ('s1', 's2')]\n")
    done = cli(str(path), "--instance", "main", "--vary", "max-num-seqs=4,8", "--max-out", "2", "--output", str(tmp_path / "out"))
    assert done.returncode == 1, done.stdout + done.stderr
    for host in ("s1", "s2"):
        assert f"instinct-fleet: {host} ran nothing: cannot connect" in done.stderr
    assert "Traceback" not in done.stderr and "0 trial(s) on 2 host(s)" in done.stdout
    assert (tmp_path / "out" / "tune.md").is_file() and not (tmp_path / "out" / "best.py").exists()


class Answers:
    """A runner whose every command prints ``stdout`` on its host, as remote.Hosts returns it."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.commands: list[str] = []

    def run(self, name: str, command: str, timeout: int) -> Result:
        self.commands.append(command)
        return Result(name, True, self.stdout, "")


def test_a_benchmark_that_lost_requests_fails_its_trial_and_keeps_its_result(tmp_path: Path) -> None:
    """vLLM computes the figures from the requests that succeeded: a run that lost some would flatter its point."""
    seed = json.loads((ROOT / "tests" / "fixtures" / "vllm-bench-serve_gpt-oss-120b_seed001.json").read_text())
    lost = {**seed, "completed": 70, "failed": 10, "errors": [""] * 70 + ["Internal Server Error"] * 10}
    results = trials.Results(tmp_path)
    results.start(sweep(profile="seed-001-gpt-oss"))
    runner = Answers(f"============ Serving Benchmark Result ============\n{bench.RESULT_MARK}\n{json.dumps(lost)}")
    tuner = tune.HostTuner(runner, HOSTS[0], sweep(profile="seed-001-gpt-oss"), results)  # type: ignore[arg-type]
    tuner.report = preflight.parse_report(mi300x_host())
    plan = tuner.plan(BASELINE)
    failed = Trial({}, "s1", "failed", baseline=True)
    tuner.bench(plan, BASELINE, failed)
    assert failed.status == "failed" and failed.figures == {} and failed.meets_slo is None
    assert (
        failed.why
        == "vllm bench serve: 10 of 80 requests failed (Internal Server Error) (run 1 of 3); its result is kept under runs/, not compared"
    )
    kept = tmp_path / "runs" / "deployed" / "s1" / "s1" / "main" / "seed-001-gpt-oss-c8.json"
    assert json.loads(kept.read_text())["failed"] == 10
    runner.stdout = runner.stdout.replace(json.dumps(lost), json.dumps(seed))
    measured = Trial({}, "s1", "failed", baseline=True)
    tuner.bench(plan, BASELINE, measured)
    assert measured.status == "measured" and measured.figures["output_throughput"] == 479.07
    assert "--max-concurrency 8" in runner.commands[0]


class Watched(Answers):
    """A runner that notes what the tuner's board shows while each of its commands runs."""

    def __init__(self, stdout: str, board: Any) -> None:
        super().__init__(stdout)
        self.board = board
        self.shown: list[list[str]] = []

    def run(self, name: str, command: str, timeout: int) -> Result:
        self.shown.append(self.board.lines())
        return super().run(name, command, timeout)


def test_a_trial_shows_each_step_while_it_waits(tmp_path: Path) -> None:
    """The restart, the health gate and each benchmark run are on the board, with their limit, while they run; none after."""
    from instinct_fleet.converge.progress import Board

    seed = json.loads((ROOT / "tests" / "fixtures" / "vllm-bench-serve_gpt-oss-120b_seed001.json").read_text())
    results = trials.Results(tmp_path)
    definition = sweep(profile="seed-001-gpt-oss", repeats=2, vary={"max-num-seqs": [4, 32]})
    results.start(definition)
    board = Board(io.StringIO(), every=3600, live=False)
    runner = Watched(f"============ Serving Benchmark Result ============\n{bench.RESULT_MARK}\n{json.dumps(seed)}", board)
    tuner = tune.HostTuner(runner, HOSTS[0], definition, results, board=board)  # type: ignore[arg-type]
    tuner.report = preflight.parse_report(mi300x_host())
    tuner.deployed = tuner.plan(BASELINE)
    point = next(iter(sweeps.grid(definition)))
    tuner.measure(point)  # the runner's answer is no health gate's: the trial stops after it
    tuner.bench(tuner.plan(point), point, Trial(dict(point.settings), "s1", "failed"))
    steps = [line[0].split(", ")[0] for line in runner.shown if line]
    assert len(steps) == 4 and steps[0].startswith("s1: tune sweep") and steps[0].endswith(f"{point.label()}: restart")
    assert steps[1].endswith(f"{point.label()}: health gate on :8080")
    assert steps[2:] == [f"s1: {point.label()}: benchmark run 1 of 2", f"s1: {point.label()}: benchmark run 2 of 2"]
    assert all("at most" in line[0] for line in runner.shown if line) and board.lines() == []


class Refusing(Answers):
    """A runner whose router calls fail as curl does when the router does not answer."""

    def run(self, name: str, command: str, timeout: int) -> Result:
        self.commands.append(command)
        if "_worker?url=" in command:
            return Result(name, False, "", "instinct-fleet: could not take vllm-main ... out of the pool: curl: (7) Failed to connect")
        return Result(name, True, self.stdout, "")


def test_a_tuned_instance_leaves_its_router_pools_before_its_first_restart_or_is_not_restarted(tmp_path: Path) -> None:
    member = Membership("r1", "http://10.0.0.9:30000", "vllm-main", "http://10.0.0.1:8080")
    results = trials.Results(tmp_path)
    results.start(sweep(profile="seed-001-gpt-oss"))
    refusing = Refusing("")
    tuner = tune.HostTuner(refusing, HOSTS[0], sweep(profile="seed-001-gpt-oss"), results, (member,))  # type: ignore[arg-type]
    tuner.report = preflight.parse_report(mi300x_host())
    problem, _ = tuner.install(tuner.plan(BASELINE), "tune sweep: a point")
    assert problem is not None and problem.startswith("not restarted: instinct-fleet: could not take vllm-main")
    assert len(refusing.commands) == 1 and "remove_worker?url=http://10.0.0.1:8080" in refusing.commands[0] and not tuner.away
    answering = Answers("")
    tuner = tune.HostTuner(answering, HOSTS[0], sweep(profile="seed-001-gpt-oss"), results, (member,))  # type: ignore[arg-type]
    tuner.report = preflight.parse_report(mi300x_host())
    tuner.install(tuner.plan(BASELINE), "tune sweep: a point")
    tuner.install(tuner.plan(BASELINE), "tune sweep: another point")
    removes = [i for i, c in enumerate(answering.commands) if "remove_worker" in c]
    assert removes == [0] and paths.ROLL_MARKER in answering.commands[1] and tuner.away  # once, before the first restart


def holding(path: Path) -> None:
    """Wait until a locked step has written ``path``: from then on it holds the lock."""
    end = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < end, f"{path} not written within 30 s"
        time.sleep(0.02)


def test_the_tune_lock_orders_a_restore_after_a_restart_the_controller_no_longer_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real flock and sh: the restore's writes wait for the trial's script that an interrupt left running;
    a lock held too long fails the restore with what to do."""
    monkeypatch.setattr(paths, "TUNE_LOCK", str(tmp_path / "run"))
    log = tmp_path / "log"
    trial = subprocess.Popen(["sh", "-c", tune.locked(f"echo trial writes >> {log}; sleep 1; echo trial restarts >> {log}", 5)])
    holding(log)  # the trial holds the lock (on a busy machine its shell may take longer than any fixed sleep)
    restore = subprocess.run(["sh", "-c", tune.locked(f"echo restore writes >> {log}", 5)], capture_output=True, text=True)
    assert trial.wait() == 0 and restore.returncode == 0
    assert log.read_text().splitlines() == ["trial writes", "trial restarts", "restore writes"]
    mark = tmp_path / "held"
    held = subprocess.Popen(["sh", "-c", tune.locked(f"touch {mark}; sleep 2", 5)])
    holding(mark)
    late = subprocess.run(["sh", "-c", tune.locked("echo never", 1)], capture_output=True, text=True)
    held.wait()
    assert late.returncode == 75 and "never" not in late.stdout
    assert f"another trial step held {tmp_path / 'run'} for 1s; deploy the inventory once it ends" in late.stderr
    failing = subprocess.run(["sh", "-c", tune.locked("exit 3", 5)], capture_output=True, text=True)
    assert failing.returncode == 3 and failing.stderr == ""


class Interrupted(Answers):
    """One host: its baseline benchmarks, its first trial's restart hangs until the sweep is interrupted,
    and every health gate answers healthy."""

    def __init__(self, bench_result: str) -> None:
        super().__init__("")
        self.bench_result = bench_result
        self.restarting = gevent.event.Event()

    def run(self, name: str, command: str, timeout: int) -> Result:
        self.commands.append(command)
        if "flock" in command and "restoring the deployed configuration" not in command:
            self.restarting.set()
            gevent.sleep(60)  # the trial's restart: the interrupt kills the greenlet that waits for it
        if "vllm bench" in command or "bench serve" in command:
            return Result(name, True, self.bench_result, "")
        if health.MARK in command:
            models = json.dumps({"data": [{"id": "openai/gpt-oss-120b"}]})
            return Result(name, True, f"{health.MARK}state\nhealthy\n{health.MARK}models\n{models}", "")
        return Result(name, True, "", "")


def test_an_interrupt_mid_restart_restores_the_host_behind_the_lock_and_prints_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A real SIGINT to this process while a trial's restart runs: the sweep stops, the restore takes the tune
    lock after it and removes the sweep's benchmark containers, and Ctrl-C's handler is put back."""
    seed = (ROOT / "tests" / "fixtures" / "vllm-bench-serve_gpt-oss-120b_seed001.json").read_text()
    runner = Interrupted(f"{bench.RESULT_MARK}\n{seed}")

    def prepare(self: tune.HostTuner) -> None:  # the probe and its parse have tests of their own
        self.report = preflight.parse_report(mi300x_host())
        self.deployed = self.plan(BASELINE)

    monkeypatch.setattr(tune.HostTuner, "prepare", prepare)
    definition = sweep(profile="seed-001-gpt-oss", vary={"max-num-seqs": [4, 8]}, max_out=1, repeats=1, warmup=0)
    results = trials.Results(tmp_path / "sweep")
    results.start(definition)
    checked = sweeps.check(HOSTS, {"s1"}, definition)
    before = signal.getsignal(signal.SIGINT)
    interrupter = gevent.spawn(lambda: (runner.restarting.wait(), os.kill(os.getpid(), signal.SIGINT)))
    said: list[str] = []
    outcome = tune.run(runner, HOSTS, checked, definition, results, said.append)  # type: ignore[arg-type]
    interrupter.join()
    assert outcome.interrupted and outcome.not_restored == {} and outcome.unprepared == {}
    assert [t.baseline for t in outcome.ran] == [True]  # the baseline ran; the interrupted trial is not recorded
    assert said[-3:] == [
        "SIGINT: restoring every host that left its deployed configuration (further signals are ignored until done)",
        "s1: restoring the deployed vllm-main",
        "s1: restored, healthy",
    ]
    trial_restart = next(i for i, c in enumerate(runner.commands) if "flock" in c)
    restore = runner.commands[trial_restart + 1]
    assert restore.startswith(f"mkdir -p {paths.TUNE_LOCK} && flock -w ")
    assert f"docker ps -q --filter label={bench.LABEL}=tune-sweep | xargs -r /usr/bin/docker rm -f" in restore
    assert "restoring the deployed configuration" in restore
    assert runner.commands[-1] == f"rm -f {paths.ROLL_MARKER}"
    assert f"--label {bench.LABEL}=tune-sweep" in next(c for c in runner.commands if "bench serve" in c)
    assert signal.getsignal(signal.SIGINT) is before
    assert "Traceback" not in capfd.readouterr().err


def test_a_sweep_refuses_an_instance_the_gpu_health_verdict_quarantines(tmp_path: Path) -> None:
    """Its unit is stopped on purpose: a trial would start it on a GPU with uncorrectable errors."""
    from tests.unit import smi

    results = trials.Results(tmp_path)
    results.start(sweep(profile="seed-001-gpt-oss"))
    runner = Answers(mi300x_host(**smi.sections({"gpus": {"0": {"uncorrectable": 1}}})))
    tuner = tune.HostTuner(runner, HOSTS[0], sweep(profile="seed-001-gpt-oss"), results)  # type: ignore[arg-type]
    why = tuner.prepare()
    assert why is not None and why.startswith("vllm-main is quarantined (GPU health): GPU 0: 1 uncorrectable ECC error(s)"), why
    assert "admit this one first" in why
