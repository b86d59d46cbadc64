"""The stand-in vLLM refuses at start-up what validation refuses, and starts what validation accepts, from the same tables.

Why: the end-to-end fleet proves a deploy only as far as its stand-in behaves like
vLLM. The stand-in (tests/fleet/standin/vllm/vllm_standin.py) is loaded here as the
fleet builds it: beside the generated table of the version it stands in for and the
checkpoint table.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instinct_fleet.converge import health
from instinct_fleet.model import knowledge, startup
from instinct_fleet.model import launch as vllm_launch
from instinct_fleet.model.recipes import all_recipes
from instinct_fleet.model.render import render_args

from . import consumers
from .conftest import check, check_cluster
from .test_rules import CASES

ROOT = Path(__file__).resolve().parents[2]


def test_the_fleets_stand_in_is_the_default_version() -> None:
    assert f'STANDIN_VERSION = "{consumers.STANDIN_VERSION}"' in (ROOT / "tests" / "fleet" / "fleet.py").read_text()


@pytest.mark.parametrize("version", ["0.22.0", "0.33.0"])
@pytest.mark.parametrize("recipe", sorted(all_recipes()))
def test_every_recipe_starts_on_every_version_it_validates_on(recipe: str, version: str) -> None:
    """The recipes are written for 0.22.0 and 0.33.0 (on 0.11.0 validation refuses their V1 flags, as the seed table records)."""
    nodes = all_recipes()[recipe].nodes
    data = {"vllm_recipe": recipe, "vllm_version": version, "vllm_image": f"vllm/vllm-openai-rocm:v{version}"}
    planned = check_cluster({**data, "vllm_nodes": nodes}, nodes) if nodes > 1 else [check(data)]
    assert [str(f) for _, fs in planned for f in fs if f.severity == "error"] == []
    svc = planned[0][0].services[0]
    assert consumers.argv_check(svc.model, render_args(svc), svc.env, version) == ""


L8B = {"vllm_model": "meta-llama/Llama-3.1-8B-Instruct"}
EAGLE = {"vllm_recipe": "llama-3.1-8b-eagle3"}
# Wrong overrides built from vLLM's own start-up checks: each is refused by validation and by the stand-in.
REFUSED: dict[str, tuple[str, dict[str, Any]]] = {
    "unknown quantization": ("quantization-unknown", {**L8B, "vllm_args": {"quantization": "ptpc_fp8"}}),
    "quantization ROCm lacks": ("quantization-rocm", {**L8B, "vllm_args": {"quantization": "experts_int8"}}),
    "deprecated checkpoint": ("quantization-deprecated", {"vllm_model": "meta-llama/Llama-3.1-405B-Instruct-FP8"}),
    "quantization against the checkpoint": ("quantization-mismatch", {"vllm_args": {"quantization": "fp8"}}),
    "unknown speculative key": (
        "value-domain",
        {**EAGLE, "vllm_args": {"speculative-config": {"method": "eagle3", "model": "m/d", "dtype": "float16"}}},
    ),
    "speculative tokens out of range": (
        "value-domain",
        {**EAGLE, "vllm_args": {"speculative-config": {"method": "eagle3", "model": "m/d", "num_speculative_tokens": 0}}},
    ),
    "nested compilation key": ("value-domain", {"vllm_args": {"compilation-config": {"pass_config": {"no_such_pass": True}}}}),
    "memory above 1": ("value-domain", {"vllm_args": {"gpu-memory-utilization": 1.5}}),
    "KV dtype the backend refuses": (
        "attention-backend",
        {**L8B, "vllm_args": {"attention-backend": "ROCM_AITER_FA", "kv-cache-dtype": "fp8_inc"}},
    ),
    "block size the backend refuses": ("attention-backend", {**L8B, "vllm_args": {"attention-backend": "ROCM_AITER_FA", "block-size": 8}}),
    "sinks on a backend without them": ("attention-backend", {"vllm_args": {"attention-backend": "ROCM_ATTN"}}),
    "MLA model on an MHA backend": (
        "attention-backend",
        {"vllm_recipe": "deepseek-r1", "vllm_args": {"attention-backend": "ROCM_AITER_FA"}},
    ),
    "batched tokens below sequences": (
        "scheduler-batched-below-seqs",
        {"vllm_args": {"max-num-batched-tokens": 256, "enable-chunked-prefill": True}},
    ),
    "batched tokens below the sequences vLLM sets on an MI300X": (
        "scheduler-batched-below-seqs",
        {"vllm_args": {"max-num-seqs": None, "enable-chunked-prefill": None, "max-num-batched-tokens": 512}},
    ),
    "sequences above the batched tokens vLLM sets on an MI300X": (
        "scheduler-batched-below-seqs",
        {"vllm_args": {"max-num-seqs": 16384, "enable-chunked-prefill": None}},
    ),
    "a dict flag that is not a JSON object": ("value-domain", {"vllm_args": {"mm-processor-kwargs": "[1, 2]"}}),
    "an unknown variable under --fail-on-environ-validation": (
        "env-refused",
        {"vllm_env": {"VLLM_ROCM_USE_AITR": "1"}, "vllm_args": {"fail-on-environ-validation": True}},
    ),
}


def test_what_validation_warns_of_the_stand_in_starts_with_vllm_s_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown variable and an emulated MXFP4 checkpoint: validation warns (the rules of what vLLM starts with), and
    the stand-in starts, as vLLM does, saying so for the variable."""
    for data in (
        {"vllm_env": {"VLLM_ROCM_USE_AITR": "1"}},
        {"vllm_model": "amd/Llama-3.3-70B-Instruct-MXFP4-Preview", "vllm_recipe": None},
    ):
        spec, findings = check(data)
        assert [f for f in findings if f.severity == "error"] == [] and any(f.severity == "warning" for f in findings), data
        svc = spec.services[0]
        assert consumers.argv_check(svc.model, render_args(svc), svc.env) == "", data
    assert "WARNING Unknown vLLM environment variable detected: VLLM_ROCM_USE_AITR" in capsys.readouterr().out


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_validation_and_the_stand_in_refuse_alike(case: str) -> None:
    rule, data = REFUSED[case]
    spec, findings = check(data)
    assert rule in {f.rule for f in findings if f.severity == "error"}, case
    svc = spec.services[0]
    assert consumers.argv_check(svc.model, render_args(svc), svc.env), case


STARTUP_RULES = [
    *startup.CHECKS,
    "quantization-unknown",
    "quantization-rocm",
    "quantization-deprecated",
    "quantization-mismatch",
    "attention-backend",
    "flag-config-exclusive",
]


@pytest.mark.parametrize("rule", STARTUP_RULES)
def test_the_stand_in_refuses_each_start_up_rule_where_validation_does(rule: str) -> None:
    """Each start-up rule's case from the rules table: the stand-in refuses the tripping one and starts the passing one."""
    trip, passing = CASES[rule]
    for data, refused in ((trip, True), (passing, False)):
        spec, findings = check(data)
        assert (rule in {f.rule for f in findings}) is refused, (rule, data)
        svc = spec.services[0]
        said = consumers.argv_check(svc.model, render_args(svc), svc.env)
        assert bool(said) is refused, (rule, data, said)


def test_the_stand_in_compiles_once_per_configuration_and_waits_on_a_build_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """STANDIN_COMPILE_S: a miss compiles and writes its entry; the same model and settings hit it, on any port;
    a changed flag misses; an AITER build lock under AITER_JIT_DIR holds the start until it is gone."""
    module = consumers.standin()
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "AITER_JIT_DIR": str(tmp_path / "aiter"), "STANDIN_COMPILE_S": "0.2"}
    with mock.patch.dict(os.environ, env):
        formats = knowledge.load(consumers.STANDIN_VERSION).startup_log
        module.compile_or_reuse("m", {"--max-num-seqs": "8", "--port": "8000"})
        cold = health.startup(("elapsed 1.0", *capsys.readouterr().out.splitlines()), formats)
        module.compile_or_reuse("m", {"--max-num-seqs": "8", "--port": "9000"})
        warm = health.startup(("elapsed 1.0", *capsys.readouterr().out.splitlines()), formats)
        # The gate reads the stand-in's lines as vLLM's: they are printed from the same format strings.
        assert (cold.cache, warm.cache) == ("cold", "warm") and cold.compile is not None and cold.compile >= 0.2 > (warm.compile or 0)
        module.compile_or_reuse("m", {"--max-num-seqs": "8", "--port": "8000"})
        module.compile_or_reuse("m", {"--max-num-seqs": "8", "--port": "9000"})
        module.compile_or_reuse("m", {"--max-num-seqs": "16", "--port": "8000"})
        said = "\n".join(line for line in capsys.readouterr().out.splitlines() if "stand-in compile cache" in line)
        assert [line.split(":")[0] for line in said.splitlines()] == [
            "INFO stand-in compile cache hit",
            "INFO stand-in compile cache hit",
            "INFO stand-in compile cache miss",
        ], said
        lock = tmp_path / "aiter" / "module_moe" / "lock"
        lock.parent.mkdir(parents=True)
        lock.write_text("1\nsim-gpu-1\n")
        removed = threading.Timer(1.0, lock.unlink)
        removed.start()
        started = time.monotonic()
        module.compile_or_reuse("m", {"--max-num-seqs": "8"})
        assert time.monotonic() - started >= 0.9 and "waiting for baton release" in capsys.readouterr().out
        removed.join()


def test_a_ray_node_builds_its_own_ranks_and_hits_a_copy_of_the_same_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a cluster each node's Ray worker builds its ranks' entry in its own cache: a worker's entry (rank_8_0) is
    no use to a head (rank_0_0); a copy of another cluster's worker cache hits on this cluster's worker."""
    module = consumers.standin()
    args = {"--pipeline-parallel-size": "2", "--distributed-executor-backend": "ray"}
    worker, other = tmp_path / "worker", tmp_path / "other-worker"
    with mock.patch.dict(os.environ, {"VLLM_CACHE_ROOT": str(worker), "STANDIN_COMPILE_S": "0.2"}):
        assert module.build("m", args, "rank_8_0")[0] is False
        assert module.build("m", args, "rank_8_0")[0] is True
        assert module.build("m", args, "rank_0_0")[0] is False  # the head's ranks: not in a worker's cache
    other.mkdir()
    (worker / "torch_compile_cache").rename(other / "torch_compile_cache")  # what cache-spread.sh carries
    with mock.patch.dict(os.environ, {"VLLM_CACHE_ROOT": str(other), "STANDIN_COMPILE_S": "0.2"}):
        assert module.build("m", args, "rank_8_0")[0] is True
    with mock.patch.dict(os.environ, {"VLLM_CACHE_ROOT": str(other), "STANDIN_COMPILE_S": "0"}):
        assert module.build("m", args, "rank_8_0") is None  # no compile step: nothing to log
    capsys.readouterr()
    formats = knowledge.load(consumers.STANDIN_VERSION).startup_log
    module.log_build((False, 0.3))  # the driver's line for a start where one node compiled
    assert health.startup(("elapsed 1.0", *capsys.readouterr().out.splitlines()), formats).cache == "cold"


VERSIONS = ("0.11.0", "0.22.0", "0.33.0")
SPECULATIVE_METHODS = (None, "eagle3", "ngram", "[ngram]", "ngram_gpu", "suffix", "mtp", "deepseek_mtp", "dspark", "draft_model")


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values)


@st.composite
def launches(draw: st.DrawFn, version: str, model: str, env: dict[str, str]) -> dict[str, Any]:
    """A launch of ``model`` on ``version`` over every setting that a check between settings reads, each drawn near
    the boundaries the checks compare (absent included)."""
    small = st.sampled_from([1, 2, 4, 8, 256, 512, 1024, 4096, 8192, 16384, 131072])
    speculative = {
        "method": draw(st.sampled_from(SPECULATIVE_METHODS)),
        "model": draw(_maybe(st.just("m/draft"))),
        "num_speculative_tokens": draw(_maybe(st.integers(1, 4))),
        "prompt_lookup_min": draw(_maybe(st.integers(1, 6))),
        "prompt_lookup_max": draw(_maybe(st.integers(1, 6))),
        "draft_tensor_parallel_size": draw(_maybe(st.sampled_from([1, 2, 4]))),
        "tensor_parallel_size": draw(_maybe(st.just(2))),
    }
    transfer = {"kv_connector": draw(_maybe(st.just("NixlConnector"))), "kv_role": draw(_maybe(st.just("kv_both")))}
    args = {
        "max-num-seqs": draw(_maybe(small)),
        "max-num-batched-tokens": draw(_maybe(small)),
        "max-model-len": draw(_maybe(small)),
        "enable-chunked-prefill": draw(st.sampled_from([None, True, False])),
        "max-num-partial-prefills": draw(_maybe(st.integers(1, 3))),
        "max-long-partial-prefills": draw(_maybe(st.integers(1, 3))),
        "tensor-parallel-size": draw(st.sampled_from([1, 2, 4])),
        "speculative-config": draw(st.sampled_from([None, *[{k: v for k, v in speculative.items() if v is not None}] * 3])),
        "kv-transfer-config": draw(st.one_of(st.none(), st.just({k: v for k, v in transfer.items() if v is not None}))),
        "ray-workers-use-nsight": draw(st.sampled_from([None, True])),
        "distributed-executor-backend": draw(st.sampled_from([None, "mp", "ray", "uni"])),
        "nnodes": draw(_maybe(st.integers(1, 2))),
        "attention-backend": draw(st.sampled_from([None, "ROCM_AITER_FA", "TRITON_ATTN"])),
        "async-scheduling": draw(st.sampled_from([None, True, False])),
        "kv-cache-dtype": draw(st.sampled_from([None, "auto", "fp8"])),
        "block-size": draw(st.sampled_from([None, 16, 64])),
    }
    flags = knowledge.load(version).flags
    data = {
        "vllm_recipe": None,
        "vllm_model": model,
        "vllm_version": version,
        "vllm_image": f"vllm/vllm-openai-rocm:v{version}",
        "vllm_args": {k: v for k, v in args.items() if v is not None and f"--{k}" in flags and v != {}},
        "vllm_env": {
            **env,
            **draw(st.sampled_from([{}, {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"}, {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1"}])),
            # which ROCm backend runs when none is named: AITER's MHA lists ROCM_AITER_FA (vllm/_aiter_ops.py)
            **draw(st.sampled_from([{}, {"VLLM_ROCM_USE_AITER": "1"}, {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MHA": "0"}])),
        },
    }
    return data


@pytest.mark.parametrize("env", [{}, {"VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"}], ids=["plain", "shuffled-kv"])
@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B-Instruct", "openai/gpt-oss-120b"])  # without and with sinks
@pytest.mark.parametrize("version", VERSIONS)
def test_each_check_between_settings_trips_exactly_where_vllm_s_own_condition_holds(version: str, model: str, env: dict[str, str]) -> None:
    """The checks of instinct_fleet/model/startup.py are written by hand; vLLM's own conditions for them are
    extracted from its source (the table's startup_conditions) and evaluated by the stand-in. On every drawn launch
    and version, validation finds a check exactly where vLLM's condition holds."""

    @settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(launches(version, model, env))
    def agree(data: dict[str, Any]) -> None:
        spec, findings = check(data)
        ours = {f.rule for f in findings if f.rule in startup.CHECKS}
        svc = spec.services[0]
        with mock.patch.dict(os.environ, svc.env):
            parsed, args = module.parse(["serve", svc.model, *render_args(svc)])
            vllms = {name for name, _ in module.stated_checks(parsed, args)}
        assert ours == vllms, (data["vllm_args"], [str(f) for f in findings if f.rule in startup.CHECKS])
        tripped.update(vllms)

    module = consumers.standin(version)
    tripped: set[str] = set()
    agree()
    assert tripped, "no drawn launch tripped a check: the comparison saw only agreement on nothing"


def test_a_backend_condition_this_module_cannot_read_leaves_the_backend_untold_not_a_traceback() -> None:
    """A project's table from a newer vLLM may list a backend under a condition whose names validation does not bind:
    the running backend is then unknown, and the checks that belong to one backend do not apply."""
    spec, _ = check({**L8B, "vllm_env": {"VLLM_ROCM_USE_AITER": "1"}})
    svc = spec.services[0]
    table = knowledge.load("0.22.0")
    launch = vllm_launch.Launch(svc, table, "MI300X", vllm_launch.checkpoints().get(svc.model))
    assert vllm_launch.running_backend(launch) == "ROCM_ATTN"  # 0.22.0 tries ROCM_ATTN first, and it takes a Llama
    newer = dataclasses.replace(table, backend_priority=(("ROCM_ATTN", "rocm_aiter_ops.is_rdna_aiter_enabled()"),))
    assert vllm_launch.running_backend(vllm_launch.Launch(svc, newer, "MI300X", launch.checkpoint)) is None
    unknown = dataclasses.replace(table, backend_priority=(("ROCM_ATTN", "future_probe()"),))
    assert vllm_launch.running_backend(vllm_launch.Launch(svc, unknown, "MI300X", launch.checkpoint)) is None
