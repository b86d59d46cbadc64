"""What a benchmark of an instance asks: the profiles (built in and ``bench_profiles``), the runs they make, and
what refuses a run before any host is contacted.

``instinct-fleet bench``, the canary and ``tune`` run these jobs (:mod:`instinct_fleet.live.bench`); validation
refuses a ``canary_profile`` that no instance of its host could run, with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

from instinct_fleet.model import paths
from instinct_fleet.model.defaults import BenchProfile
from instinct_fleet.model.spec import HostSpec, ServiceSpec

# The latencies and percentiles every run reports: vLLM names its result fields after them
# (mean_/median_/std_/p99_ + ttft + _ms, ...), which instinct-fleet tune's --slo accepts.
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
METRIC_PERCENTILES = (50, 99)

# Built-in profiles. seed-001-gpt-oss is the workload seed 001 states for its run (001:73: random data, 80 requests
# at concurrency 8, 4096 tokens in and 1024 out). The seed states neither --ignore-eos nor a request rate: the
# profile sets ignore_eos (every request yields its 1024 tokens) and no rate (vLLM's default: all at once, within
# the concurrency). Its published figures are in instinct_fleet/live/report.py:REFERENCES, compared by profile name.
CANARY = "canary"
BUILTIN_PROFILES: dict[str, BenchProfile] = {
    "seed-001-gpt-oss": BenchProfile(dataset="random", input_len=4096, output_len=1024, num_prompts=80, concurrency=[8]),
    # Seed 004 compares servers on ShareGPT (004:243); the dataset file is the one vLLM's docs download.
    "sharegpt-chat": BenchProfile(
        dataset="sharegpt",
        dataset_path=f"{paths.DATASETS_DIR}/ShareGPT_V3_unfiltered_cleaned_split.json",
        num_prompts=1000,
        concurrency=[64],
        ignore_eos=False,
    ),
    "latency": BenchProfile(dataset="random", input_len=1024, output_len=128, num_prompts=20, concurrency=[1]),
    # The default canary (canary_profile): short, so that every re-tune can afford it; sized down to fit an instance
    # whose --max-model-len is shorter (canary_sized).
    CANARY: BenchProfile(dataset="random", input_len=512, output_len=64, num_prompts=16, concurrency=[4]),
    "sweep": BenchProfile(dataset="random", input_len=1024, output_len=1024, num_prompts=1024, concurrency=[1, 8, 32, 128, 512]),
}


def profiles(spec: HostSpec) -> dict[str, BenchProfile]:
    """The built-in profiles and this host's own (``bench_profiles``); its own win on a name clash."""
    return {**BUILTIN_PROFILES, **spec.vars.bench_profiles}


@dataclass(frozen=True)
class Job:
    """One ``vllm bench serve`` run: an instance, a profile and one of its concurrencies."""

    spec: HostSpec
    svc: ServiceSpec
    profile_name: str
    profile: BenchProfile
    concurrency: int
    num_prompts: int

    @property
    def filename(self) -> str:
        return f"{self.profile_name}-c{self.concurrency}.json"

    def label(self) -> str:
        return f"{self.spec.host}/{self.svc.name} {self.profile_name} concurrency {self.concurrency}, {self.num_prompts} prompts"


class BenchRequestError(Exception):
    """A bench request that cannot run as asked; the message says why, before any host is contacted."""


def concurrencies(text: str | None) -> list[int] | None:
    """``--concurrency 1,8``: positive whole numbers, or None for the profile's own."""
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise BenchRequestError(f"--concurrency takes comma-separated whole numbers such as 1,8, got {text!r}") from None
    if any(v < 1 for v in values):
        raise BenchRequestError(f"--concurrency values must be 1 or more, got {text!r}")
    return values


def jobs(spec: HostSpec, svc: ServiceSpec, name: str, num_prompts: int | None, concurrency: list[int] | None) -> list[Job]:
    """The runs of one instance for profile ``name``, with the CLI's overrides; refused when they cannot run.

    A random prompt plus its output longer than the instance's ``--max-model-len`` is
    refused by vLLM request by request, so the whole run would measure errors.
    """
    known = profiles(spec)
    if name not in known:
        raise BenchRequestError(f"{spec.host} has no bench profile {name!r}; profiles: {', '.join(sorted(known))}")
    if num_prompts is not None and num_prompts < 1:
        raise BenchRequestError(f"--num-prompts must be 1 or more, got {num_prompts}")
    profile = known[name]
    limit = svc.args.get("max-model-len")
    if name == CANARY and CANARY not in spec.vars.bench_profiles:
        profile = canary_sized(profile, limit)
    if (
        profile.dataset == "random"
        and isinstance(limit, int)
        and not isinstance(limit, bool)
        and profile.input_len + profile.output_len > limit
    ):
        raise BenchRequestError(
            f"profile {name!r} sends {profile.input_len} + {profile.output_len} tokens, more than {spec.host}/{svc.name}'s "
            f"--max-model-len {limit}; choose a shorter profile or add one to bench_profiles"
        )
    return [Job(spec, svc, name, profile, c, num_prompts or profile.num_prompts) for c in (concurrency or profile.concurrency)]


def canary_sized(profile: BenchProfile, limit: object) -> BenchProfile:
    """The built-in canary for an instance: its prompt and output within ``limit`` (the instance's --max-model-len,
    when it gives one as a number), at most half of it for the prompt and a quarter for the output."""
    if not isinstance(limit, int) or isinstance(limit, bool) or profile.input_len + profile.output_len <= limit:
        return profile
    return profile.model_copy(
        update={"input_len": max(1, min(profile.input_len, limit // 2)), "output_len": max(1, min(profile.output_len, limit // 4))}
    )


RUN_LIMIT_FACTOR = 6  # a benchmark runs for minutes: several command_timeouts, not one


def time_limit(jobs: list[Job]) -> int:
    """Seconds one ``vllm bench serve`` run may take before its host counts as hung."""
    return max(j.spec.vars.command_timeout for j in jobs) * RUN_LIMIT_FACTOR
