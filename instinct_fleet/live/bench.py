"""``instinct-fleet bench``: ``vllm bench serve`` from each instance's own image, against each instance.

Why from the instance's image: the benchmark client then matches the server's
vLLM version, tokenizer code included, and nothing is installed on a host. Why
on the host by default: the network between a client and the instance does not
distort the figures (``--client`` chooses another host instead).

A run is refused for an instance that is not serving (unit not active,
``/health`` not 200, another image than the inventory's) and for a host whose
roll is in progress: the deploy's marker (:data:`instinct_fleet.model.paths.ROLL_MARKER`)
is there while a batch runs and stays after a roll failed.

Results land under ``results/<UTC timestamp>/<host>/<instance>/``: vLLM's own
JSON per run (``--save-result``) and ``config.json``, the rendered
configuration the instance ran. ``instinct-fleet report`` reads that tree.
"""

from __future__ import annotations

import base64
import json
import shlex
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from instinct_fleet.live import accuracy, interrupts, remote, report
from instinct_fleet.model import paths, render
from instinct_fleet.model.probe import Item
from instinct_fleet.model.spec import HostSpec, ServiceSpec
from instinct_fleet.model.workload import METRIC_PERCENTILES, PERCENTILE_METRICS, Job

RESULT_MARK = "@@instinct-fleet-bench-result"
LABEL = "instinct-fleet.bench"  # on each benchmark container, its run's stamp: an interrupted run's are removed by it


def vllm_bench_args(job: Job, base_url: str, warmup: int | None = None) -> list[str]:
    """``vllm bench serve`` flags, by the names of vLLM's vllm/benchmarks/serve.py.

    A measured run saves vLLM's result JSON with its per-request records (``--save-detailed``: every request's
    TTFT and inter-token latencies, which the noise test of :mod:`instinct_fleet.live.noise` reads). ``warmup``:
    instead, that many requests of the same shape whose results are discarded (nothing saved).
    """
    p = job.profile
    argv = ["bench", "serve", "--backend", "vllm", "--base-url", base_url, "--model", job.svc.model]
    argv += ["--served-model-name", render.served_model(job.svc), "--dataset-name", p.dataset]
    if p.dataset == "random":
        argv += ["--random-input-len", str(p.input_len), "--random-output-len", str(p.output_len)]
    else:
        argv += ["--dataset-path", f"/datasets/{p.dataset_path.rsplit('/', 1)[-1]}" if p.dataset_path else ""]
    argv += ["--num-prompts", str(warmup or job.num_prompts), "--max-concurrency", str(job.concurrency)]
    if p.request_rate is not None:
        argv += ["--request-rate", repr(p.request_rate)]
    if p.ignore_eos:
        argv.append("--ignore-eos")
    argv += ["--percentile-metrics", ",".join(PERCENTILE_METRICS), "--metric-percentiles", ",".join(map(str, METRIC_PERCENTILES))]
    if warmup is None:
        argv += ["--save-result", "--save-detailed", "--result-dir", paths.RESULTS_IN_CONTAINER]
        argv += ["--result-filename", job.filename, "--label", job.profile_name]
    return argv


def remote_dir(stamp: str, job: Job) -> str:
    return f"{paths.BENCH_ROOT}/{stamp}/{job.spec.host}/{job.svc.name}"


def command(job: Job, stamp: str, client: HostSpec | None, warmup: int = 0) -> str:
    """The shell command that runs one job on the instance's host (or ``client``), then prints vLLM's JSON;
    ``warmup``: first that many requests of the same shape, unmeasured (a warm-up that fails ends the command)."""
    q = shlex.quote
    on = client or job.spec
    local = client is None
    address = "127.0.0.1" if local else job.spec.reach
    base_url = f"http://{paths.host_port(address, job.svc.port)}"
    out = remote_dir(stamp, job)
    argv = [paths.DOCKER, "run", "--rm", "--label", f"{LABEL}={stamp}", "--network", "host", "--ipc", "host"]
    argv += ["-v", f"{on.vars.hf_cache_dir}:{paths.HF_CACHE_IN_CONTAINER}", "-v", f"{out}:{paths.RESULTS_IN_CONTAINER}"]
    if local:  # the instance's env (HF_HUB_OFFLINE, HF_TOKEN_PATH and all) for loading its tokenizer
        argv += ["--env-file", paths.unit_env_path(paths.vllm_unit(job.svc.name))]
    checks = []
    if job.profile.dataset_path:
        argv += ["-v", f"{job.profile.dataset_path}:/datasets/{job.profile.dataset_path.rsplit('/', 1)[-1]}:ro"]
        missing = f"{job.profile.dataset_path} is not on {on.host}: download the dataset there first"
        checks.append(f"test -f {q(job.profile.dataset_path)} || {{ printf '%s\\n' {q(missing)} >&2; exit 3; }}")
    # The bench host's Hugging Face token, when it has one, for a gated model's tokenizer: mounted as the units mount it.
    token = on.vars.hf_token_path
    mount = f"-v {token}:{paths.TOKEN_IN_CONTAINER}:ro -e HF_TOKEN_PATH={paths.TOKEN_IN_CONTAINER}"
    checks.append(f"token=; if test -r {q(token)}; then token={q(mount)}; fi")

    def container(bench_args: list[str]) -> str:
        # With vllm_api_key_path the instance answers /v1 only with the key: the bench host's file at that path
        # becomes OPENAI_API_KEY inside the container, which vllm bench serve sends as the bearer token.
        entrypoint, wrapped, key_mounts = render.with_api_key(
            "vllm", bench_args, job.spec.vars.vllm_api_key_path, variable="OPENAI_API_KEY"
        )
        mounts = [part for mount in key_mounts for part in ("-v", mount)]
        return (
            " ".join(q(a) for a in [*argv, *mounts])
            + " $token "
            + " ".join(q(a) for a in ["--entrypoint", entrypoint, job.svc.image, *wrapped])
        )

    steps = [*checks, f"mkdir -p {q(out)} || exit 1"]
    if warmup:  # its output is shown only when it fails: then the measured run would measure nothing
        warm = container(vllm_bench_args(job, base_url, warmup))
        steps.append(f"warm=$({warm} 2>&1) || {{ printf '%s\\n' 'vllm bench serve warm-up failed:' \"$warm\" | tail -n 20; exit 4; }}")
    measured = container(vllm_bench_args(job, base_url))
    steps.append(f"{measured} && printf '\\n%s\\n' {RESULT_MARK} && cat {q(out + '/' + job.filename)}")
    return "; ".join(steps)


def stop_command(stamp: str) -> str:
    """Remove the benchmark containers of the run ``stamp``: on the host they outlive an interrupted command."""
    return f"{paths.DOCKER} ps -q --filter label={shlex.quote(LABEL + '=' + stamp)} | xargs -r {paths.DOCKER} rm -f >/dev/null"


def result_of(stdout: str) -> dict[str, Any] | None:
    """vLLM's result JSON, printed after the benchmark's own report and a marker line."""
    data = remote.json_after(stdout, RESULT_MARK)
    return data if isinstance(data, dict) else None


def config(job: Job, env: dict[str, str], image_id: str, client: str | None, started: str) -> dict[str, Any]:
    """What the instance ran and how it was measured, stored beside vLLM's JSON."""
    return {
        "host": str(job.spec.host),
        "instance": job.svc.name,
        "recipe": job.svc.recipe,
        "model": job.svc.model,
        "served_model": render.served_model(job.svc),
        "vllm_version": job.svc.version,
        "image": job.svc.image,
        "image_id": image_id,
        "gpus": list(job.svc.gpus),
        "gpu_model": job.spec.gpu_model,  # the GPU model the host must have: preflight fails a host without it
        "env": env,
        "vllm_serve_args": render.render_args(job.svc),
        "profile": job.profile_name,
        "profile_settings": job.profile.model_dump(),
        "concurrency": job.concurrency,
        "num_prompts": job.num_prompts,
        "client": client or str(job.spec.host),
        "started": started,
    }


def save(results: Path, job: Job, data: dict[str, Any], info: dict[str, Any], repeat: int = 0) -> None:
    """One run's JSON and the instance's config.json under ``results/<host>/<instance>/``, the tree
    ``instinct-fleet report`` reads; a repeat of the same run (the canary's ``canary_runs``) is ``-runN``."""
    folder = results / str(job.spec.host) / job.svc.name
    folder.mkdir(parents=True, exist_ok=True)
    name = job.filename if repeat == 0 else job.filename.removesuffix(".json") + f"-run{repeat + 1}.json"
    (folder / name).write_text(json.dumps(data) + "\n")
    (folder / "config.json").write_text(json.dumps(info, indent=2) + "\n")


class Ran(Protocol):
    """What one command did on one host (remote.Result)."""

    @property
    def ok(self) -> bool: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...
    @property
    def error(self) -> str | None: ...


class Runner(Protocol):
    """Connections to the hosts that run the benchmarks (remote.Hosts); bench needs no more of them, so
    that validation (``canary_profile``) can read the profiles without the inventory loader."""

    def run(self, name: str, command: str, timeout: int) -> Ran: ...
    def each(self, items: dict[str, Any], work: Callable[[str, Any], Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Outcome:
    """One job's end: ``problem`` is None when its figures measure the instance, else why not; ``saved``
    says whether its result file was written (a run some of whose requests failed is kept, to be read)."""

    job: Job
    problem: str | None
    saved: bool


def run(
    hosts: Runner,
    todo: list[Job],
    client: HostSpec | None,
    out_dir: Path,
    timeout: int,
    say: Callable[[str], None],
    image_ids: dict[tuple[str, str], str],
    warmup: int = 0,
) -> list[Outcome]:
    """Run the jobs: one host's jobs one after another, hosts at once (all on ``client`` when given); ``warmup``
    discarded requests before each.

    Each run's JSON and the instance's config.json go under ``out_dir/<host>/<instance>/``.
    Progress: a line when a run starts and ends, and every 30 s the runs still going.
    """
    import gevent

    stamp = out_dir.name
    queues: dict[str, list[Job]] = {}
    for job in todo:
        queues.setdefault(str(client.host) if client else str(job.spec.host), []).append(job)
    running: dict[str, float] = {}  # label -> when it started
    counter = [0]

    def one(where: str, job: Job) -> Outcome:
        counter[0] += 1
        say(f"[{counter[0]}/{len(todo)}] {job.label()}: started")
        started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        running[job.label()] = time.monotonic()
        result = hosts.run(where, command(job, stamp, client, warmup), timeout)
        seconds = time.monotonic() - running.pop(job.label())
        data = result_of(result.stdout) if result.ok else None
        if data is None:
            detail = result.error or (result.stderr or result.stdout).strip().splitlines()[-3:]
            return Outcome(job, f"vllm bench serve failed on {where} after {seconds:.0f}s: {detail}", saved=False)
        cluster = job.spec.cluster
        env = {**job.svc.env, **(cluster.rccl_env() if cluster else {})}
        info = config(job, env, image_ids.get((str(job.spec.host), job.svc.name), ""), str(client.host) if client else None, started)
        save(out_dir, job, data, info)
        summary = (
            f"{data.get('output_throughput', 0):.1f} output tok/s, median TTFT {data.get('median_ttft_ms', 0):.1f} ms, "
            f"median TPOT {data.get('median_tpot_ms', 0):.2f} ms"
        )
        failed = report.failed_requests(data)
        if failed is not None:
            say(f"    {job.label()}: done in {seconds:.0f}s, but {failed}: {summary}")
            return Outcome(job, f"{failed} on {where}: its figures count only the rest, so they do not measure the instance", saved=True)
        say(f"    {job.label()}: done in {seconds:.0f}s: {summary}")
        return Outcome(job, None, saved=True)

    def queue(where: str, jobs_here: list[Job]) -> list[Outcome]:
        return [one(where, job) for job in jobs_here]

    def heartbeat() -> None:
        while True:
            gevent.sleep(30)
            for label, since in list(running.items()):
                say(f"    ... {label}: running for {time.monotonic() - since:.0f}s")

    beat = gevent.spawn(heartbeat)
    try:
        done = each_host(hosts, queues, queue, stamp, say, "benchmark")
    finally:
        beat.kill()
    return [o for outcomes in done.values() for o in outcomes]


def each_host(
    hosts: Runner, queues: dict[str, Any], work: Callable[[str, Any], Any], stamp: str, say: Callable[[str], None], what: str
) -> dict[str, Any]:
    """``work(host, queue)`` on every host at once (``hosts.each``); on SIGINT or SIGTERM the containers of the run
    ``stamp`` are removed from every host, since they outlive the command on the host, and the interrupt goes on."""
    try:
        with interrupts.raised_in_main():
            return hosts.each(queues, work)
    except interrupts.Interrupted as exc:
        with interrupts.ignored():
            say(f"{exc.name}: stopping the {what} containers on {', '.join(queues)}")
            hosts.each(queues, lambda where, _queue: hosts.run(where, stop_command(stamp), 60))
        raise


def probe_command(spec: HostSpec, svc: ServiceSpec, items: Sequence[Item], stamp: str) -> str:
    """The shell command, on the instance's host, that asks it the accuracy probe (instinct_fleet/live/accuracy.py's
    client, from the instance's own image, as a benchmark runs) and prints the answers after accuracy.MARK."""
    q = shlex.quote
    payload = base64.b64encode(zlib.compress(json.dumps([i.prompt for i in items]).encode(), 9)).decode()
    args = [accuracy.CLIENT, f"http://{paths.host_port('127.0.0.1', svc.port)}", render.served_model(svc)]
    args += [str(spec.vars.canary_probe_max_tokens), str(accuracy.CONCURRENCY)]
    entrypoint, wrapped, mounts = render.with_api_key("python3", ["-c", *args], spec.vars.vllm_api_key_path, variable="OPENAI_API_KEY")
    argv = [paths.DOCKER, "run", "--rm", "-i", "--label", f"{LABEL}={stamp}", "--network", "host"]
    argv += [part for mount in mounts for part in ("-v", mount)]
    argv += ["--entrypoint", entrypoint, svc.image, *wrapped]
    return " ".join(q(a) for a in argv) + f" <<'PROBE'\n{payload}\nPROBE\n"  # a line of its own after the end mark


@dataclass(frozen=True)
class Asked:
    """One instance's probe in ``bench --accuracy``: where its answers went, or why there are none."""

    label: str
    path: Path | None
    problem: str | None


def probe_all(
    hosts: Runner,
    todo: Sequence[tuple[HostSpec, ServiceSpec]],
    items: Sequence[Item],
    source: str,
    out_dir: Path,
    say: Callable[[str], None],
) -> list[Asked]:
    """``instinct-fleet bench --accuracy``: ask the probe of every instance in ``todo`` (a host's instances one after
    another, hosts at once), and store each instance's answers under ``out_dir`` as a canary stores them; an
    interrupt removes the probe containers it left on the hosts."""
    stamp = out_dir.name
    queues: dict[str, list[tuple[HostSpec, ServiceSpec]]] = {}
    for spec, svc in todo:
        queues.setdefault(str(spec.host), []).append((spec, svc))

    def one(where: str, spec: HostSpec, svc: ServiceSpec) -> Asked:
        label = f"{where}/{svc.name}"
        ran = hosts.run(where, probe_command(spec, svc, items, stamp), accuracy.time_limit(len(items)))
        answers = accuracy.answers_of(ran.stdout) if ran.ok else None
        if answers is None or len(answers) != len(items):
            detail = ran.error or " | ".join((ran.stderr or ran.stdout).strip().splitlines()[-3:])
            return Asked(label, None, f"the probe's client failed: {detail}")
        data = accuracy.record(items, answers, source, spec.vars.canary_probe_max_tokens)
        path = accuracy.save(out_dir / where / svc.name, data)
        head = data["probe"]
        say(f"    {label}: probe accuracy {head['right'] / head['items'] * 100:.1f}% ({head['right']} of {head['items']} right)")
        return Asked(label, path, accuracy.failed(answers))

    done = each_host(hosts, queues, lambda where, pairs: [one(where, spec, svc) for spec, svc in pairs], stamp, say, "probe")
    return [asked for results in done.values() for asked in results]
