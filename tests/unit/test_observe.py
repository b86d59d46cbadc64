"""status, bench, targets, the exporter's firewall rule and weight staging, on captured and rendered data (no hosts)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from instinct_fleet.commands import monitoring, status
from instinct_fleet.converge import firewall, health, preflight, state
from instinct_fleet.converge.evaluate import probe
from instinct_fleet.converge.probe import script as probe_script
from instinct_fleet.live import bench
from instinct_fleet.live.remote import Result
from instinct_fleet.model import paths, workload
from instinct_fleet.model.inventory import HostData
from instinct_fleet.model.paths import WEIGHTS_COMPLETE, WEIGHTS_STAGED
from instinct_fleet.roll.plan import plan_inventory, weight_seeds

from . import test_preflight as pf
from .conftest import check, check_cluster, rules_of

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "vllm-bench-serve_gpt-oss-120b_seed001.json"


def test_the_metrics_status_reads_are_the_pinned_vllms() -> None:
    """Read from each shipped version's source (vllmsource/metrics.py), not from memory: a table without the
    renamed gauge gives the old one, one without either gives none (status shows no KV figure)."""
    import dataclasses

    from instinct_fleet.model import knowledge

    for version in knowledge.supported_versions():
        table = knowledge.load(version)
        assert table.metrics[status.RUNNING] == table.metrics[status.WAITING] == "gauge", version
        assert status.kv_cache_metric(table) == "vllm:kv_cache_usage_perc", version
    old = dataclasses.replace(table, metrics={"vllm:gpu_cache_usage_perc": "gauge", status.RUNNING: "gauge"})
    assert status.kv_cache_metric(old) == "vllm:gpu_cache_usage_perc"
    assert status.kv_cache_metric(dataclasses.replace(table, metrics={})) is None and status.kv_cache_metric(None) is None


def host_output(*sections: tuple[str, list[str]]) -> str:
    return "\n".join(f"{status.MARK}{name}\n" + "\n".join(lines) for name, lines in sections)


def test_status_reads_units_health_image_and_vllm_metrics() -> None:
    spec, _ = check({"vllm_instances": [{"name": "a"}, {"name": "b"}], "metrics_exporter": True})
    image = spec.services[0].image
    text = host_output(
        ("roll", []),
        (
            "instance vllm-a",
            [
                "active",
                "health ok",
                f"image {image} sha256:abc",
                "cache 1610612736",
                'vllm:num_requests_running{model_name="m",engine="0"} 3.0',
                'vllm:num_requests_running{model_name="m",engine="1"} 2.0',
                'vllm:num_requests_waiting{model_name="m",engine="0"} 1.0',
                'vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25',
                'vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.5',
            ],
        ),
        ("instance vllm-b", ["activating", "health 000", "cache "]),
        ("watch", [json.dumps({"instances": {"vllm-a": {"state": "in", "restarts": 0}, "vllm-b": {"state": "down"}}, "out": []})]),
        (f"unit {paths.EXPORTER_UNIT}", ["active", "health 200"]),
    )
    a, b, exporter = status.parse(spec, text)
    assert (a.watch, b.watch) == ("in", "down")
    assert (a.state, a.health, a.running, a.waiting, a.kv_cache, a.image_id, a.ok) == ("active", "ok", 5.0, 1.0, 0.5, "sha256:abc", True)
    assert (b.state, b.health, b.ok) == ("activating", "no answer", False)
    assert b.problem() == "vllm-b.service is activating"
    assert exporter.instance == paths.EXPORTER_UNIT and exporter.ok
    assert (a.compile_cache, b.compile_cache) == (1610612736, None)  # no directory yet: du printed nothing
    table = status.table([a, b, exporter])
    assert "50.0%" in table and "activating" in table and "1.5G" in table


def test_status_shows_what_the_watch_holds_out_with_the_fix_and_a_watch_that_does_not_answer() -> None:
    spec, _ = check({"vllm_instances": [{"name": "a"}, {"name": "b"}]})
    image = spec.services[0].image
    seen = {
        "vllm-a": {"state": "left-out", "reason": "no engine step for 61 s with 3 requests running or waiting", "restarts": 3},
        "vllm-b": {"state": "restarting", "reason": "no engine step for 60 s", "restarts": 1},
    }
    healthy = ["active", "health ok", f"image {image} sha256:abc"]
    text = host_output(
        ("roll", []), ("instance vllm-a", healthy), ("instance vllm-b", healthy), ("watch", [json.dumps({"instances": seen})])
    )
    a, b = status.parse(spec, text)
    assert not a.ok and a.problem() == (
        "vllm-a.service is left out of its router pools by the watch (no engine step for 61 s with 3 requests running or "
        f"waiting): find the cause in its journal, then `rm {paths.watch_out('vllm-a')}` on h1"
    )
    assert not b.ok and "while the watch restarts it" in str(b.problem())
    table = status.table([a, b])
    assert "left-out (3 restarts)" in table and f"rm {paths.watch_out('vllm-a')}" in table
    # The watch gave nothing (stopped, or not installed yet): every instance says so.
    (c, d) = status.parse(spec, host_output(("roll", []), ("instance vllm-a", healthy), ("instance vllm-b", healthy), ("watch", [])))
    assert c.watch == d.watch == "no answer" and "does not answer" in str(c.problem())
    # With the watch off, no column value and no problem.
    off, _ = check({"watch": False})
    (row,) = status.parse(off, host_output(("roll", []), ("instance vllm-main", healthy)))
    assert row.watch is None and row.ok
    assert "curl -s -m 3 http://127.0.0.1:9401/state" in status.script(spec) and "9401" not in status.script(off)


def test_status_marks_a_rolling_host_another_image_and_an_unreachable_host() -> None:
    spec, _ = check({})
    text = host_output(
        ("roll", ["roll batch 2 started 2026-11-23T10:00:00Z"]),
        ("instance vllm-main", ["active", "health ok", "image other:1 sha256:x"]),
    )
    (row,) = status.parse(spec, text)
    assert row.rolling == "roll batch 2 started 2026-11-23T10:00:00Z"
    assert row.problem() == f"vllm-main.service runs other:1, not {spec.services[0].image}: deploy to roll it"
    assert "! other:1" in status.table([row])
    (down,) = status.unreachable(spec, "cannot connect: timed out")
    assert (down.state, down.ok) == ("unreachable", False) and "cannot connect" in status.table([down])


def test_status_script_asks_every_unit_in_one_command() -> None:
    (head, _), (worker, _) = check_cluster({"metrics_exporter": True}, 2)
    script = status.script(head)
    assert "vllm:kv_cache_usage_perc" in script and "ray-head.service" in script and paths.ROLL_MARKER in script
    assert f"du -sb {paths.compile_cache(head.vars.compile_cache_dir, head.services[0].image)}" in script
    assert "vllm-" not in status.script(worker) and "ray-worker.service" in status.script(worker)


def test_bench_command_runs_the_instance_image_with_vllm_flag_names() -> None:
    spec, _ = check(
        {
            "bench_profiles": {"long": {"input_len": 32768, "output_len": 512, "concurrency": [2, 4], "num_prompts": 10}},
            "vllm_args": {"max-model-len": 40960},
        }
    )
    svc = spec.services[0]
    (seed,) = workload.jobs(spec, svc, "seed-001-gpt-oss", 16, None)
    argv = shlex.split(bench.command(seed, "T", None).rsplit("; ", 1)[1].split(" && printf")[0])
    entry = argv.index("--entrypoint")
    assert argv[entry + 1 : entry + 5] == ["vllm", svc.image, "bench", "serve"]
    flags = dict(zip(argv[entry + 5 :: 1], argv[entry + 6 :: 1], strict=False))
    assert flags["--random-input-len"] == "4096" and flags["--random-output-len"] == "1024" and flags["--max-concurrency"] == "8"
    assert (
        flags["--num-prompts"] == "16" and flags["--label"] == "seed-001-gpt-oss" and flags["--base-url"] == f"http://127.0.0.1:{svc.port}"
    )
    assert (
        "--save-result" in argv
        and "--save-detailed" in argv  # every request's records, for the noise test (instinct_fleet/live/noise.py)
        and "--ignore-eos" in argv
        and ["--env-file", paths.unit_env_path(paths.vllm_unit(svc.name))] == argv[argv.index("--env-file") : argv.index("--env-file") + 2]
    )
    # A warm-up: the same run with 8 prompts, nothing saved, before the measured one; its output shows only if it fails.
    warmed = bench.command(seed, "T", None, 8)
    warm = warmed.split("warm=$(", 1)[1].split(" 2>&1)", 1)[0]
    warm_argv = shlex.split(warm)
    assert warm_argv[warm_argv.index("--num-prompts") + 1] == "8" and "--save-result" not in warm_argv
    assert warm_argv[: warm_argv.index("--num-prompts")] == argv[: argv.index("--num-prompts")]
    assert "exit 4; }" in warmed and warmed.rsplit("; ", 1)[1] == bench.command(seed, "T", None).rsplit("; ", 1)[1]
    long = workload.jobs(spec, svc, "long", None, None)
    assert [(j.concurrency, j.num_prompts, j.filename) for j in long] == [(2, 10, "long-c2.json"), (4, 10, "long-c4.json")]
    assert set(workload.BUILTIN_PROFILES) <= set(workload.profiles(spec))


@pytest.mark.parametrize(
    ("profile", "num_prompts", "concurrency", "says"),
    [
        ("long", None, None, "sends 32768 + 512 tokens, more than h1/main's --max-model-len 8192"),
        ("nope", None, None, "h1 has no bench profile 'nope'; profiles:"),
        ("latency", 0, None, "--num-prompts must be 1 or more, got 0"),
        ("latency", None, "0", "--concurrency values must be 1 or more, got '0'"),
        ("latency", None, "8,x", "--concurrency takes comma-separated whole numbers such as 1,8, got '8,x'"),
    ],
)
def test_a_bench_request_that_cannot_run_is_refused_before_any_host(
    profile: str, num_prompts: int | None, concurrency: str | None, says: str
) -> None:
    spec, _ = check({"bench_profiles": {"long": {"input_len": 32768, "output_len": 512}}})
    with pytest.raises(workload.BenchRequestError, match=re.escape(says)):
        workload.jobs(spec, spec.services[0], profile, num_prompts, workload.concurrencies(concurrency))


def test_ipv6_scrape_addresses_are_bracketed_for_prometheus_and_the_bench_client() -> None:
    spec, findings = check({"scrape_address": "fd00::7", "metrics_exporter": True})
    assert not [f for f in findings if f.severity == "error"]
    assert [g["targets"] for g in monitoring.file_sd([spec])] == [["[fd00::7]:5000"], ["[fd00::7]:9401"], ["[fd00::7]:8080"]]
    client, _ = check({}, host="loadgen")
    (job,) = workload.jobs(spec, spec.services[0], "latency", None, None)
    assert "--base-url 'http://[fd00::7]:8080'" in bench.command(job, "T", client)


def test_bench_from_a_client_reaches_the_instance_at_its_scrape_address_and_checks_the_dataset() -> None:
    spec, _ = check({"scrape_address": "10.0.0.7"})
    client, _ = check({}, host="loadgen")
    (job,) = workload.jobs(spec, spec.services[0], "sharegpt-chat", None, None)
    text = bench.command(job, "T", client)
    assert f"--base-url http://10.0.0.7:{spec.services[0].port}" in text and "--env-file" not in text
    assert text.startswith("test -f /var/lib/instinct-fleet/datasets/ShareGPT_V3_unfiltered_cleaned_split.json ||")
    assert "if test -r /etc/instinct-fleet/hf-token; then token='-v /etc/instinct-fleet/hf-token:/run/secrets/hf-token:ro" in text
    assert " $token --entrypoint vllm " in text
    assert "--dataset-name sharegpt --dataset-path /datasets/ShareGPT_V3_unfiltered_cleaned_split.json" in text


def test_bench_result_is_read_back_after_the_benchmark_report() -> None:
    data = json.loads(FIXTURE.read_text())
    stdout = "============ Serving Benchmark Result ============\nSuccessful requests: 80\n\n" + bench.RESULT_MARK + "\n" + json.dumps(data)
    assert bench.result_of(stdout) == data
    assert bench.result_of("vllm bench serve: error: boom") is None


class Printed:
    """Hosts whose every command prints ``stdout`` (remote.Hosts' run and each, one host after another)."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    def run(self, name: str, command: str, timeout: int) -> Result:
        return Result(name, True, self.stdout, "")

    def each(self, items: dict[str, Any], work: Callable[[str, Any], Any]) -> dict[str, Any]:
        return {name: work(name, item) for name, item in items.items()}


def test_a_run_that_lost_requests_is_saved_and_reported_as_not_measuring_the_instance(tmp_path: Path) -> None:
    spec, _ = check({})
    (job,) = workload.jobs(spec, spec.services[0], "seed-001-gpt-oss", None, None)
    lost = {**json.loads(FIXTURE.read_text()), "completed": 76, "failed": 4, "errors": [""] * 76 + ["Internal Server Error"] * 4}
    said: list[str] = []
    printed = Printed(f"report\n{bench.RESULT_MARK}\n{json.dumps(lost)}")
    (outcome,) = bench.run(printed, [job], None, tmp_path / "T", 60, said.append, {})
    assert outcome.saved and outcome.problem == (
        f"4 of 80 requests failed (Internal Server Error) on {spec.host}: "
        "its figures count only the rest, so they do not measure the instance"
    )
    assert "done in 0s, but 4 of 80 requests failed" in said[-1] and "479.1 output tok/s" in said[-1]
    assert json.loads((tmp_path / "T" / str(spec.host) / "main" / job.filename).read_text())["failed"] == 4
    printed.stdout = "Traceback: no result"
    (nothing,) = bench.run(printed, [job], None, tmp_path / "U", 60, said.append, {})
    assert not nothing.saved and nothing.problem is not None and nothing.problem.startswith(f"vllm bench serve failed on {spec.host}")


@pytest.mark.parametrize(
    ("profile", "key"),
    [
        ({"dataset": "sonnet"}, "dataset"),
        ({"concurrency": []}, "concurrency"),
        ({"input_len": 0}, "input_len"),
        ({"inputlen": 5}, "inputlen"),
    ],
)
def test_a_bad_bench_profile_names_the_host_key_and_rule(profile: dict[str, object], key: str) -> None:
    _, findings = check({"bench_profiles": {"mine": profile}})
    assert findings and all(f.host == "h1" for f in findings)
    assert any(key in f.key for f in findings) and rules_of(findings) & {"value-format", "schema", "unknown-variable"}


def test_targets_list_every_exporter_and_only_head_vllm_endpoints() -> None:
    (head, _), (worker, _) = check_cluster({"metrics_exporter": True, "scrape_address": "10.1.1.1"}, 2)
    groups = monitoring.file_sd([head, worker])
    jobs = sorted((g["labels"]["job"], g["labels"]["host"], g["labels"]["role"]) for g in groups)
    # The head serves, so it runs the watch; the worker serves nothing and runs none.
    assert jobs == [
        ("amd-device-metrics", "h1", "head"),
        ("amd-device-metrics", "h2", "worker"),
        ("instinct-fleet-watch", "h1", "head"),
        ("vllm", "h1", "head"),
    ]
    assert all(g["targets"][0].startswith("10.1.1.1:") for g in groups)


def test_prometheus_allow_from_opens_the_scraped_ports_and_closes_the_exporter_to_everyone_else() -> None:
    report = preflight.parse_report(pf.mi300x_host())
    plan = pf.plan({"metrics_exporter": True, "prometheus_allow_from": ["10.9.0.0/24"]}, report)
    rules = firewall.firewall(plan)
    assert rules is not None
    port = plan.spec.services[0].port
    assert "elements = { 10.9.0.0/24 }" in rules
    # The exporter's port: the scrapers alone. The instances' and the watch's (its /state and /metrics): anyone, as
    # vllm_allow_from is not set (the scrapers among them).
    assert "tcp dport { 5000 } ip saddr @scrapers_v4 accept" in rules
    assert 'tcp dport { 5000 } counter drop comment "metrics exporter: prometheus_allow_from only"' in rules
    assert rules.index("tcp dport { 5000 } ip saddr @scrapers_v4 accept") < rules.index("tcp dport { 5000 } counter drop")
    served = ", ".join(map(str, sorted({port, plan.spec.vars.watch_port})))
    assert f'tcp dport {{ {served} }} accept comment "vLLM: anyone"' in rules
    # Without prometheus_allow_from the exporter is open to anyone, and the firewall still denies every other port.
    alone = firewall.firewall(pf.plan({"metrics_exporter": True}, report))
    assert alone is not None and 'tcp dport { 5000 } accept comment "metrics exporter: anyone"' in alone and "policy drop;" in alone


def weights_output(source: str, complete: str, staged: str) -> str:
    return pf.mi300x_host(weights=f"{source}|{complete}|{staged}")


def test_weights_are_probed_and_judged_by_their_markers() -> None:
    data = {"weights_source": "/mnt/models"}
    spec = pf.spec(**data)
    (want,) = probe(spec).weights  # type: ignore[arg-type]
    assert want == ("/mnt/models/hub/models--openai--gpt-oss-120b", "/var/lib/instinct-fleet/huggingface/hub/models--openai--gpt-oss-120b")
    script = probe_script("/t", probe(spec))  # type: ignore[arg-type]
    assert f"{want[0]}/{WEIGHTS_COMPLETE}" in script and f"{want[1]}/{WEIGHTS_STAGED}" in script
    fresh = pf.plan(data, preflight.parse_report(weights_output(want[0], "", "")))
    (w,) = fresh.desired.weights
    assert not fresh.source_has(w) and state.weights_drift(w, fresh.report)
    copied = pf.plan(data, preflight.parse_report(weights_output(want[0], "main abc", "main abc")))
    assert copied.source_has(w) and not state.weights_drift(w, copied.report)
    stale = pf.plan(data, preflight.parse_report(weights_output(want[0], "main def", "main abc")))
    assert stale.source_has(w) and state.weights_drift(w, stale.report)
    other_revision = pf.plan(
        {**data, "vllm_args": {"revision": "v2"}}, preflight.parse_report(weights_output(want[0], "main abc", "main abc"))
    )
    (w2,) = other_revision.desired.weights
    assert w2.revision == "v2" and not other_revision.source_has(w2)


def test_one_host_per_missing_model_downloads_it() -> None:
    report = preflight.parse_report(pf.mi300x_host())
    hosts = [HostData(name, ("gpu",), {"weights_source": "/mnt/models"}) for name in ("b2", "a1", "c3")]
    plans = plan_inventory(hosts, {"a1", "b2", "c3"}, lambda specs: dict.fromkeys(specs, report))
    assert weight_seeds(plans) == {"/mnt/models/hub/models--openai--gpt-oss-120b": "a1"}


def test_a_finished_roll_leaves_no_marker_and_the_exporter_is_in_the_desired_state() -> None:
    report = preflight.parse_report(pf.mi300x_host())
    want = pf.plan({"metrics_exporter": True}, report).desired
    assert want.file(paths.ROLL_MARKER).content is None
    assert want.file(paths.EXPORTER_CONFIG).content and paths.EXPORTER_UNIT in {u.name for u in want.units}


def test_status_health_is_the_gate_s_definition() -> None:
    """An instance is ok only when health.serving passed on the host; /health alone is not enough."""
    assert status._health(["health ok"]) == "ok"
    assert status._health(["health 200"]) == "lists another model"
    assert status._health(["health 000"]) == "no answer" and status._health(["health 503"]) == "HTTP 503"
    assert status._health(["health 200"], instance=False) == "ok"  # the exporter's /metrics
    svc_script = status.script(pf.plan({"vllm_api_key_path": "/etc/instinct-fleet/api-key"}, preflight.parse_report(pf.mi300x_host())).spec)
    assert health.serving(8080, "openai/gpt-oss-120b", "/etc/instinct-fleet/api-key") in svc_script


FAKE_DOCKER = r"""#!/bin/sh
# A docker that records each run's --num-prompts and, for a measured run, writes vLLM's result where -v mounts /results.
prompts= out= name=
while [ $# -gt 0 ]; do
  case "$1" in
    --num-prompts) prompts=$2 ;;
    --result-filename) name=$2 ;;
    -v) case "$2" in *:/results) out=${2%:/results} ;; esac ;;
  esac
  shift
done
echo "$prompts" >> "$LOG"
if [ -z "$name" ]; then
  [ -z "$WARMUP_FAILS" ] || { echo "Traceback: the warm-up broke"; exit 1; }
  echo "warm-up output nobody should see"; exit 0
fi
echo '{"output_throughput": 700.0, "completed": 16}' > "$out/$name"
"""


@pytest.mark.parametrize("fails", [False, True])
def test_the_warm_up_runs_first_and_a_failed_one_ends_the_command_with_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    """The command as a shell runs it, with a stand-in docker: the warm-up's requests first and silent, then the
    measured run's JSON; a warm-up that fails ends it with its last lines, so nothing unwarmed is measured."""
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    monkeypatch.setattr(paths, "DOCKER", str(docker))
    monkeypatch.setattr(paths, "BENCH_ROOT", str(tmp_path / "bench"))
    spec, _ = check({})
    (job,) = workload.jobs(spec, spec.services[0], "latency", 16, None)
    log = tmp_path / "runs.log"
    env = {"PATH": "/usr/bin:/bin", "LOG": str(log), **({"WARMUP_FAILS": "1"} if fails else {})}
    done = subprocess.run(["sh", "-c", bench.command(job, "T", None, 8)], capture_output=True, text=True, env=env)
    if fails:
        assert done.returncode == 4 and log.read_text().split() == ["8"]
        assert "vllm bench serve warm-up failed:" in done.stdout and "Traceback: the warm-up broke" in done.stdout
        assert bench.result_of(done.stdout) is None
    else:
        assert done.returncode == 0 and log.read_text().split() == ["8", "16"], done.stderr
        assert "nobody should see" not in done.stdout and bench.result_of(done.stdout) == {"output_throughput": 700.0, "completed": 16}


def test_the_stand_in_exposes_only_metrics_the_pinned_vllm_creates_and_of_their_kind() -> None:
    """The fleet's stand-in stands for vLLM's /metrics in every end-to-end test (status, Prometheus, the router):
    each series it types is one vLLM's source creates (a counter exposed with ``_total``, as prometheus_client does)."""
    from unittest import mock

    from instinct_fleet.model import knowledge

    from . import consumers

    module = consumers.standin()
    with mock.patch.object(module.State, "args", {}), mock.patch.object(module.State, "served", "m"):
        text = module.metrics_text()
    typed = [line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE ")]
    table = knowledge.load(consumers.STANDIN_VERSION).metrics
    assert len(typed) >= 8
    for name, kind in typed:
        source = name.removesuffix("_total") if kind == "counter" else name
        assert table.get(source) == kind, (name, kind, table.get(source))


def test_the_docs_count_each_versions_metrics_as_its_table_has_them() -> None:
    from collections import Counter

    from instinct_fleet.model import knowledge

    page = ROOT / "docs" / "reference" / "vllm-versions.md"
    row = next(line for line in page.read_text().splitlines() if line.startswith("| Prometheus metrics"))
    written = [cell.strip() for cell in row.strip("|").split("|")[2:]]
    counted = []
    for version in knowledge.supported_versions():
        kinds = Counter(knowledge.load(version).metrics.values())
        counted.append(f"{kinds['gauge']} / {kinds['counter']} / {kinds['histogram']}")
    assert written == counted
