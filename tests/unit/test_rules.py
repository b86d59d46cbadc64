"""Every validation rule: one case that trips it and one that passes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from instinct_fleet.model.hostrules import GPU_RULES
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.rules import RULES

from .conftest import CLUSTER, check, check_cluster, rules_of

G = {"vllm_recipe": "gpt-oss-120b"}
V011 = {"vllm_version": "0.11.0", "vllm_image": "rocm/vllm:v0.11.0", "vllm_recipe": None, "vllm_model": "m"}
ROOT = Path(__file__).resolve().parents[2]
L8B = {"vllm_model": "meta-llama/Llama-3.1-8B-Instruct"}
EAGLE = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 2}
NGRAM = {"method": "ngram", "num_speculative_tokens": 2}

# rule id -> (data that trips it, data that passes it)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "schema": ({"gpu_count": "eight"}, {"gpu_count": 8}),
    "unknown-variable": ({"vllm_instance": [{"name": "a"}]}, {"vllm_instances": [{"name": "a"}]}),
    "recipe-unknown": ({"vllm_recipe": "gpt-oss-12b"}, {"vllm_recipe": "gpt-oss-120b"}),
    "hf-token-source": (
        {"hf_token_source": "env:INSTINCT_FLEET_NO_SUCH_TOKEN_VARIABLE"},
        {"hf_token_source": str(ROOT / "tests" / "fixtures" / "hf-token-example.txt")},
    ),
    "recipe-model-bound": (
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_model": "meta-llama/Llama-3.2-3B-Instruct"},
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_model": "meta-llama/Llama-3.2-3B-Instruct", "vllm_args": {"speculative-config": None}},
    ),
    "version-unsupported": (
        {"vllm_version": "0.1.0", "vllm_image": "vllm/vllm-openai-rocm:v0.1.0"},
        {"vllm_version": "0.33.0", "vllm_image": "vllm/vllm-openai-rocm:v0.33.0"},
    ),
    "image-unpinned": ({"vllm_image": "vllm/vllm-openai-rocm:latest"}, {"vllm_image": "registry.local:5000/vllm@sha256:" + "a" * 64}),
    "image-version-unnamed": (
        {"vllm_image": "rocm/vllm:instinct_main"},
        {"vllm_image": "rocm/vllm:instinct_main", "vllm_version": "0.22.0"},
    ),
    "image-version-mismatch": (
        {"vllm_image": "vllm/vllm-openai-rocm:v0.11.0", "vllm_version": "0.22.0"},
        {"vllm_image": "vllm/vllm-openai-rocm:v0.22.0", "vllm_version": "0.22.0"},
    ),
    "env-unknown": ({"vllm_env": {"VLLM_ROCM_USE_AITR": "1"}}, {"vllm_env": {"VLLM_ROCM_USE_AITER": "1"}}),
    "env-removed": ({"vllm_env": {"VLLM_USE_TRITON_FLASH_ATTN": "0"}}, {"vllm_env": {"TORCH_BLAS_PREFER_HIPBLASLT": "1"}}),
    "env-refused": (
        {"vllm_env": {"VLLM_ROCM_USE_AITR": "1"}, "vllm_args": {"fail-on-environ-validation": True}},
        {"vllm_env": {"VLLM_ROCM_USE_AITER": "1"}, "vllm_args": {"fail-on-environ-validation": True}},
    ),
    "flag-unknown": ({"vllm_args": {"max-num-sequences": 8, "kv-cache-dtpe": "fp8"}}, {"vllm_args": {"max-num-seqs": 8}}),
    "flag-removed": ({"vllm_args": {"num-scheduler-steps": 15}}, {"vllm_args": {"async-scheduling": True}}),
    "flag-not-boolean": ({"vllm_args": {"max-model-len": True}}, {"vllm_args": {"max-model-len": 4096}}),
    "canary-off": ({"canary_profile": None}, {"canary_profile": "canary", "vllm_args": {"max-model-len": 256}}),
    "canary-profile": ({"canary_profile": "seed-001-gpt-oss", "vllm_args": {"max-model-len": 4096}}, {"canary_profile": "latency"}),
    "canary-runs": (
        {"canary_profile": "latency", "canary_runs": 1},
        {"canary_profile": "latency", "canary_runs": 2, "canary_inconclusive": "rollback"},
    ),
    "canary-probe": (
        {"canary_probe": str(ROOT / "tests" / "fixtures" / "probe-no-answer.jsonl")},
        {"canary_probe": str(ROOT / "tests" / "fixtures" / "probe-golden.jsonl")},
    ),
    "watch-timing": ({"watch_interval": 60}, {"watch_interval": 5}),
    "slo-window": ({"prometheus_retention": "2d"}, {"prometheus_retention": "3d"}),
    "slo-ttft-bucket": ({"slo_ttft_seconds": 2}, {"slo_ttft_seconds": 2.5}),
    "gpu-health-thresholds": ({"gpu_health_recovery_warning": 4}, {"gpu_health_recovery_warning": 3}),
    "watch-stall-step": (
        {"vllm_args": {"enable-chunked-prefill": False, "max-model-len": 131072}},
        {"vllm_args": {"enable-chunked-prefill": False, "max-model-len": 131072}, "watch_prefill_tokens_per_second": 20000},
    ),
    "managed-key": ({"vllm_args": {"port": 9000}}, {"vllm_instances": [{"name": "main", "port": 9000}]}),
    "aiter-subflag-inert": (
        {"vllm_env": {"VLLM_ROCM_USE_AITER": "0"}},
        {"vllm_env": {"VLLM_ROCM_USE_AITER": "1"}},
    ),
    "unified-attention-needs-mha-off": (
        {**V011, "vllm_env": {"VLLM_USE_AITER_UNIFIED_ATTENTION": "1", "VLLM_ROCM_USE_AITER_MHA": None}},
        {**V011, "vllm_env": {"VLLM_USE_AITER_UNIFIED_ATTENTION": "1", "VLLM_ROCM_USE_AITER_MHA": "0"}},
    ),
    "awq-rocm": (
        {"vllm_recipe": "llama-3.1-70b-awq", "vllm_args": {"dtype": "bfloat16"}, "vllm_env": {"VLLM_USE_TRITON_AWQ": None}},
        {"vllm_recipe": "llama-3.1-70b-awq", "vllm_args": {"dtype": "float16"}},
    ),
    "spec-tokens": (
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_args": {"speculative-config": {"method": "eagle3", "num_speculative_tokens": 5}}},
        {"vllm_recipe": "llama-3.1-8b-eagle3"},
    ),
    "env-unread": (
        {"vllm_env": {"VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION": "1"}},
        {"vllm_args": {"attention-backend": "ROCM_AITER_UNIFIED_ATTN"}},
    ),
    "value-domain": (
        {"vllm_env": {"VLLM_ROCM_QUICK_REDUCE_QUANTIZATION": "INT2"}},
        {"vllm_env": {"VLLM_ROCM_QUICK_REDUCE_QUANTIZATION": "INT6"}},
    ),
    "gpu-memory-high": ({"vllm_args": {"gpu-memory-utilization": 0.95}}, {"vllm_args": {"gpu-memory-utilization": 0.94}}),
    "quick-reduce-tp1": (
        {"vllm_env": {"VLLM_ROCM_QUICK_REDUCE_QUANTIZATION": "INT4"}},
        {"vllm_recipe": "llama-3.1-70b", "vllm_env": {"VLLM_ROCM_QUICK_REDUCE_QUANTIZATION": "INT4"}},
    ),
    # vLLM's start-up checks (instinct_fleet/model/startup.py), on the default 0.22.0 tables.
    "quantization-unknown": ({"vllm_args": {"quantization": "ptpc_fp8"}, **L8B}, {"vllm_args": {"quantization": "fp8"}, **L8B}),
    "quantization-rocm": ({"vllm_args": {"quantization": "experts_int8"}, **L8B}, {"vllm_args": {"quantization": "fp8"}, **L8B}),
    "quantization-deprecated": (
        {"vllm_model": "meta-llama/Llama-3.1-405B-Instruct-FP8"},
        {"vllm_model": "meta-llama/Llama-3.1-405B-Instruct-FP8", "vllm_args": {"allow-deprecated-quantization": True}},
    ),
    "quantization-mismatch": ({"vllm_args": {"quantization": "fp8"}}, {"vllm_args": {"quantization": "mxfp4"}}),
    "mxfp4-native": (
        {"vllm_recipe": None, "vllm_model": "amd/Llama-3.3-70B-Instruct-MXFP4-Preview"},
        {"vllm_recipe": None, "vllm_model": "amd/Llama-3.3-70B-Instruct-MXFP4-Preview", "gpu_model": "MI355X"},
    ),
    "attention-backend": (
        {"vllm_args": {"attention-backend": "ROCM_AITER_FA"}},
        {"vllm_args": {"attention-backend": "ROCM_AITER_UNIFIED_ATTN"}},
    ),
    "scheduler-batched-below-seqs": (
        {"vllm_args": {"max-num-batched-tokens": 256}},
        {"vllm_args": {"max-num-batched-tokens": 8192}},
    ),
    "scheduler-batched-below-model-len": (
        {"vllm_args": {"max-num-batched-tokens": 4096}},
        {"vllm_args": {"max-num-batched-tokens": 8192}},
    ),
    "scheduler-partial-prefills-chunked": (
        {"vllm_args": {"max-num-partial-prefills": 2}},
        {"vllm_args": {"max-num-partial-prefills": 1}},  # 2 with chunked prefill is refused too (partial-prefill-unsupported)
    ),
    "scheduler-long-partial-prefills": (
        {"vllm_args": {"max-long-partial-prefills": 2}},
        {"vllm_args": {"max-long-partial-prefills": 1, "max-num-partial-prefills": 1, "enable-chunked-prefill": True}},
    ),
    "partial-prefill-unsupported": (
        {"vllm_args": {"max-num-partial-prefills": 2, "enable-chunked-prefill": True}},
        {"vllm_args": {"max-num-partial-prefills": 1, "enable-chunked-prefill": True}},
    ),
    "speculative-draft-tp": (
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_args": {"speculative-config": {**EAGLE, "draft_tensor_parallel_size": 2}}},
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_args": {"speculative-config": {**EAGLE, "draft_tensor_parallel_size": 1}}},
    ),
    "speculative-tokens-without-model": (
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_args": {"speculative-config": {"method": "eagle3", "num_speculative_tokens": 2}}},
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_args": {"speculative-config": {"method": "ngram", "num_speculative_tokens": 2}}},
    ),
    "speculative-tensor-parallel-key": (
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_args": {"speculative-config": {**EAGLE, "tensor_parallel_size": 1}}},
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_args": {"speculative-config": EAGLE}},
    ),
    "speculative-prompt-lookup": (
        {
            "vllm_recipe": "llama-3.1-8b-eagle3",
            "vllm_args": {"speculative-config": {**NGRAM, "prompt_lookup_min": 5, "prompt_lookup_max": 3}},
        },
        {
            "vllm_recipe": "llama-3.1-8b-eagle3",
            "vllm_args": {"speculative-config": {**NGRAM, "prompt_lookup_min": 3, "prompt_lookup_max": 5}},
        },
    ),
    "kv-connector-role": (
        {"vllm_args": {"kv-transfer-config": {"kv_connector": "NixlConnector"}}},
        {"vllm_args": {"kv-transfer-config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"}}},
    ),
    "shuffle-kv-speculative": (  # passing: without a backend named, vLLM runs ROCM_ATTN for a Llama (its priorities)
        {
            "vllm_recipe": "llama-3.1-8b-eagle3",
            "vllm_env": {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"},
            "vllm_args": {"attention-backend": "ROCM_AITER_FA"},
        },
        {"vllm_recipe": "llama-3.1-8b-eagle3", "vllm_env": {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT": "1"}},
    ),
    "hip-visible-devices": ({"vllm_env": {"HIP_VISIBLE_DEVICES": "0"}}, {"vllm_env": {"HIP_FORCE_DEV_KERNARG": "1"}}),
    "parallel-size": (
        {"vllm_instances": [{"name": "a", "gpus": [0, 1]}]},
        {"vllm_args": {"tensor-parallel-size": 2}, "vllm_instances": [{"name": "a", "gpus": [0, 1]}]},
    ),
    "tp-beyond-xgmi": (
        {"vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2, "vllm_args": {"tensor-parallel-size": 16, "pipeline-parallel-size": 1}},
        {"vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2},
    ),
    "gpu-out-of-range": (
        {"gpu_count": 4, "vllm_instances": [{"name": "a", "gpus": [4]}]},
        {"gpu_count": 4, "vllm_instances": [{"name": "a", "gpus": [3]}]},
    ),
    "gpu-overlap": (
        {"vllm_instances": [{"name": "a", "gpus": [0]}, {"name": "b", "gpus": [0]}]},
        {
            "vllm_args": {"gpu-memory-utilization": 0.45},
            "vllm_instances": [{"name": "a", "gpus": [0]}, {"name": "b", "gpus": [0]}],
        },
    ),
    "port-overlap": (
        {"vllm_instances": [{"name": "a", "port": 8000}, {"name": "b", "port": 8000}]},
        {"vllm_instances": [{"name": "a", "port": 8000}, {"name": "b", "port": 8001}]},
    ),
    "dp-rocm-settings": (
        {"vllm_recipe": "deepseek-r1-dp-ep", "vllm_args": {"disable-nccl-for-dp-synchronization": None}},
        {"vllm_recipe": "deepseek-r1-dp-ep"},
    ),
    "nccl-single-gpu": ({"vllm_env": {"NCCL_MIN_NCHANNELS": "112"}}, {"vllm_recipe": "llama-3.1-70b"}),
    "local-file": (
        {"docker_credentials_file": "no/such/config.json", "docker_registry_ca_certs": {"r:5000": "no/such/ca.crt"}},
        {"docker_credentials_file": str(ROOT / "pyproject.toml"), "docker_registry_ca_certs": {"r:5000": str(ROOT / "README.md")}},
    ),
    "unsafe-value": ({"vllm_env": {"FOO": "a\nHF_TOKEN=x"}}, {"vllm_env": {"FOO": "a"}}),
    "secret-inline": ({"vllm_env": {"HF_TOKEN": "hf_x"}}, {"hf_token_path": "/etc/instinct-fleet/hf-token"}),
    "value-format": ({"hf_cache_dir": "hf-cache"}, {"hf_cache_dir": "/data/hf-cache"}),
    "instance-unique": (
        {"vllm_instances": [{"name": "a", "gpus": [0]}, {"name": "a", "gpus": [1]}]},
        {"vllm_instances": [{"name": "a", "gpus": [0]}, {"name": "b", "gpus": [1]}]},
    ),
    "allow-from": ({"vllm_allow_from": ["10.0.0.0/33"]}, {"vllm_allow_from": ["10.0.0.0/8", "192.168.1.5", "fd00::/8"]}),
    # Where features meet (instinct_fleet/model/crosscheck.py).
    "port-conflict": (
        {"metrics_exporter": True, "vllm_instances": [{"name": "main", "port": 5000}]},
        {"metrics_exporter": True, "vllm_instances": [{"name": "main", "port": 8000}]},
    ),
    "derived-setting": ({"vllm_env": {"HF_HOME": "/data/hf"}}, {"hf_cache_dir": "/data/hf"}),
    # vLLM's router (instinct_fleet/model/router.py): its settings against the pinned router's own CLI, its pools.
    "router-version": ({"router": True, "router_version": "0.0.1"}, {"router": True}),
    "router-flag": ({"router": True, "router_policy": "fastest"}, {"router": True, "router_policy": "round_robin"}),
    "router-api-key-inline": ({"router": True, "router_flags": {"--api-key": "sk-1"}}, {"router": True}),
    "router-reach": (
        {"router": True, "scrape_address": "10.1.0.1", "vllm_allow_from": ["10.2.0.0/16"]},
        {"router": True, "scrape_address": "10.1.0.1", "vllm_allow_from": ["10.1.0.0/16"]},
    ),
    "router-pool": ({"router": True, "router_models": ["meta-llama/none"]}, {"router": True, "router_models": ["openai/gpt-oss-120b"]}),
    "path-overlap": (
        {"weights_source": "/data/hf-cache/store", "hf_cache_dir": "/data/hf-cache"},
        {"weights_source": "/mnt/store", "hf_cache_dir": "/data/hf-cache"},
    ),
    "firewall-off": ({"firewall": False, "vllm_allow_from": ["10.0.0.0/8"]}, {"firewall": True, "vllm_allow_from": ["10.0.0.0/8"]}),
    "timeouts": ({"rolling_drain_timeout": 600}, {"rolling_drain_timeout": 60}),
    "executor-nsight-needs-ray": (
        {"vllm_args": {"ray-workers-use-nsight": True}},
        {"vllm_args": {"ray-workers-use-nsight": True, "distributed-executor-backend": "ray"}},
    ),
    "executor-nnodes-backend": (
        {"vllm_args": {"nnodes": 2, "distributed-executor-backend": "ray"}},
        {"vllm_args": {"nnodes": 2, "distributed-executor-backend": "mp"}},
    ),
    "executor-async-scheduling": (  # 0.22.0's ray executor is RayExecutorV2 unless the variable says 0
        {
            "vllm_args": {"async-scheduling": True, "distributed-executor-backend": "ray"},
            "vllm_env": {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"},
        },
        {
            "vllm_args": {"async-scheduling": True, "distributed-executor-backend": "ray"},
            "vllm_env": {"VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1"},
        },
    ),
    "flag-config-exclusive": (  # a Llama: gpt-oss's attention sinks rule ROCM_AITER_FA out whatever else is set
        {
            "vllm_model": "meta-llama/Llama-3.1-8B-Instruct",
            "vllm_args": {"attention-backend": "ROCM_AITER_FA", "attention-config": '{"backend": "ROCM_AITER_FA"}'},
        },
        {
            "vllm_model": "meta-llama/Llama-3.1-8B-Instruct",
            "vllm_args": {"attention-backend": "ROCM_AITER_FA", "attention-config": '{"use_prefill_decode_attention": false}'},
        },
    ),
    "bench-profile": (
        {"bench_profiles": {"chat": {"dataset": "sharegpt"}}},
        {"bench_profiles": {"chat": {"dataset": "sharegpt", "dataset_path": "/var/lib/datasets/sharegpt.json"}}},
    ),
    "flag-twice": ({"vllm_args": {"max_num_seqs": 64, "max-num-seqs": 128}}, {"vllm_args": {"max-num-seqs": 128}}),
}

L405 = {"vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2}
# Rules across the hosts of a cluster: rule -> ((data, nodes, head data) that trips it, (...) that passes it)
CLUSTER_CASES: dict[str, tuple[tuple[dict[str, Any], int, dict[str, Any]], tuple[dict[str, Any], int, dict[str, Any]]]] = {
    "cluster-topology": ((L405, 3, {}), (L405, 2, {})),
    "cluster-mismatch": ((L405, 2, {"gpu_model": "MI325X"}), (L405, 2, {"gpu_model": "MI300X"})),
    "cluster-nic": (({**L405, "cluster_nic": None}, 2, {}), (L405, 2, {})),
    "rccl-unset": (({**L405, "nccl_ib_hca": None}, 2, {}), (L405, 2, {})),
    "ray-ports": (
        (L405, 2, {"vllm_instances": [{"name": "a", "port": 6379}]}),
        (L405, 2, {"vllm_instances": [{"name": "a", "port": 8000}]}),
    ),
    # Fleet-wide, checked across hosts like the cluster rules: the head disagrees with its worker.
    "rolling-fleet": ((L405, 2, {"rolling_batch": "50%"}), (L405, 2, {"rolling_batch": 1})),
    "slo-fleet": ((L405, 2, {"slo_ttft_objective": 0.95}), (L405, 2, {"slo_ttft_objective": 0.99})),
}


def test_inventory_conflict_trips_and_passes() -> None:
    # What instinct_fleet.model.inventory.hosts_of finds in pyinfra's groups as written.
    two = {"ray_cluster": (("c1", "a"), ("c2", "b"))}
    ((_, findings),) = plan_hosts([HostData("h1", ("c1", "c2"), {"ray_cluster": "b", "ray_role": "head", **CLUSTER}, two)])
    (hit,) = [f for f in findings if f.rule == "inventory-conflict"]
    assert hit.host == "h1" and hit.key == "ray_cluster" and "c1: 'a', c2: 'b'" in hit.message
    ((_, findings),) = plan_hosts([HostData("h1", ("c1", "c2"), {"ray_cluster": "b", "ray_role": "head", **CLUSTER})])
    assert "inventory-conflict" not in rules_of(findings)


def test_every_rule_has_a_case() -> None:
    # host-* rules are found by preflight on facts: tests/unit/test_preflight.py has a case for each.
    preflight_rules = {r for r in RULES if r.startswith("host-")}
    # router-wheel (the controller's copy of the wheel) and router-api-key (across hosts): tests/unit/test_router.py.
    # group-data-unread (a project's file, not a host): tests/unit/test_findings.py.
    # watch-metrics (a table without metrics): tests/unit/test_watch.py.
    # api-key-keyless-routes (a keyed host and its routers): tests/unit/test_keyless_routes.py.
    # mapping-replaced(-parallel) (a mapping of one level replaced at another): tests/unit/test_cli.py, from an init project.
    others = {
        *("inventory-conflict", "router-wheel", "router-api-key", "group-data-unread", "watch-metrics", "api-key-keyless-routes"),
        *("mapping-replaced", "mapping-replaced-parallel"),
    }
    # gpu-* rules judge the preflight fact's amd-smi evidence, quarantine-* the operator's asks and the record's count:
    # tests/unit/test_gpuhealth.py has a case for each (test_every_gpu_rule_and_quarantine_rule_has_a_case).
    evidence = {r.id for r in GPU_RULES} | {r for r in RULES if r.startswith("quarantine-")}
    assert set(CASES) | set(CLUSTER_CASES) | others | preflight_rules | evidence == set(RULES)


def test_every_preflight_rule_is_tested() -> None:
    # host-generation is judged on a host's generations, so the roll's own tests (test_stages) cover it.
    text = "".join((ROOT / "tests" / "unit" / name).read_text() for name in ("test_preflight.py", "test_inputs.py", "test_stages.py"))
    assert [r for r in RULES if r.startswith("host-") and f'"{r}"' not in text] == []
    assert not set(CASES) & set(CLUSTER_CASES)


@pytest.mark.parametrize("rule", sorted(CLUSTER_CASES))
def test_cluster_rule_trips_and_passes(rule: str) -> None:
    (bad, nodes, head), (good, good_nodes, good_head) = CLUSTER_CASES[rule]
    hits = [f for _, fs in check_cluster(bad, nodes, **head) for f in fs if f.rule == rule]
    assert hits, f"{rule} did not trip"
    assert all(f.host and f.host.startswith("h") and f.key and f.severity == RULES[rule].severity for f in hits)
    assert rule not in {f.rule for _, fs in check_cluster(good, good_nodes, **good_head) for f in fs}


def test_cluster_needs_one_head() -> None:
    planned = check_cluster(L405, 2, ray_role="worker")
    messages = [f.message for _, fs in planned for f in fs if f.rule == "cluster-topology"]
    assert messages and all("has 0 heads" in m for m in messages)


def test_multi_node_instance_outside_a_cluster_is_refused() -> None:
    _, findings = check({**G, **L405})
    (hit,) = [f for f in findings if f.rule == "cluster-topology"]
    assert hit.key == "vllm_nodes" and "in no ray_cluster" in hit.message


def test_cluster_env_carries_rccl_settings() -> None:
    planned = check_cluster({**L405, "nccl_ib_gid_index": 3, "nccl_net_gdr_level": "PHB"}, 2)
    cluster = planned[0][0].cluster
    assert cluster is not None and cluster.role == "head"
    assert cluster.rccl_env() == {
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_IB_HCA": "mlx5_0",
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_MIN_NCHANNELS": "112",
    }


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_trips(rule: str) -> None:
    bad, _ = CASES[rule]
    _, findings = check({**G, **bad})
    hits = [f for f in findings if f.rule == rule]
    assert hits, f"{rule} did not trip: {[str(f) for f in findings]}"
    for f in hits:
        assert f.host == "h1" and f.key and f.message
        assert f.severity == RULES[rule].severity
        assert f"[{rule}]" in str(f) and "h1" in str(f)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_passes(rule: str) -> None:
    _, good = CASES[rule]
    _, findings = check({**G, **good})
    assert rule not in rules_of(findings), [str(f) for f in findings]


def test_did_you_mean_for_env_and_flags() -> None:
    _, findings = check({**G, "vllm_env": {"VLLM_ROCM_USE_AITER_MAH": "0"}, "vllm_args": {"max-num-sequences": 4}})
    messages = " ".join(f.message for f in findings)
    assert "did you mean" in messages and "VLLM_ROCM_USE_AITER_MHA" in messages
    assert "did you mean --max-num-seqs" in messages


def test_removed_flag_says_what_replaced_it() -> None:
    _, findings = check({**G, "vllm_args": {"num-scheduler-step": 15}})
    (hit,) = [f for f in findings if f.rule == "flag-removed"]
    assert "--async-scheduling" in hit.message


def test_value_domains_from_vllm_source() -> None:
    _, findings = check({**G, "vllm_args": {"kv-cache-dtype": "fp9", "dtype": "bf16", "max-num-seqs": 0, "gpu-memory-utilization": 1.5}})
    keys = {f.key for f in findings if f.rule == "value-domain"}
    assert keys == {
        "main.args.--kv-cache-dtype",
        "main.args.--dtype",
        "main.args.--max-num-seqs",
        "main.args.--gpu-memory-utilization",
    }


def test_cluster_product_must_match_nodes_times_gpus() -> None:
    _, findings = check({"vllm_recipe": "llama-3.1-405b-pp2"})
    (hit,) = [f for f in findings if f.rule == "parallel-size"]
    assert "vllm_nodes=2" in hit.message
    _, findings = check({"vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 3})
    assert "parallel-size" in rules_of(findings)


def test_dp_rules_follow_the_pinned_version() -> None:
    data = {
        "vllm_recipe": None,
        "vllm_model": "m",
        "vllm_version": "0.11.0",
        "vllm_image": "rocm/vllm:v0.11.0",
        "vllm_args": {"data-parallel-size": 2},
        "vllm_instances": [{"name": "a", "gpus": [0, 1]}],
    }
    # allgather_reducescatter is already 0.11.0's default, and the version has no DP-sync flag: nothing to demand.
    _, findings = check(data)
    assert "dp-rocm-settings" not in rules_of(findings)
    _, findings = check({**data, "vllm_env": {"VLLM_ALL2ALL_BACKEND": "naive"}})
    (hit,) = [f for f in findings if f.rule == "dp-rocm-settings"]
    assert "VLLM_ALL2ALL_BACKEND=allgather_reducescatter" in hit.message
    # 0.22.0: the default backend is fine, the Gloo DP sync is still asked for (002 tip).
    newer = {**data, "vllm_version": "0.22.0", "vllm_image": "rocm/vllm:v0.22.0"}
    (hit,) = [f for f in check(newer)[1] if f.rule == "dp-rocm-settings"]
    assert hit.message.endswith("needs --disable-nccl-for-dp-synchronization")
    (hit,) = [
        f for f in check({**newer, "vllm_args": {"data-parallel-size": 2, "all2all-backend": "naive"}})[1] if f.rule == "dp-rocm-settings"
    ]
    assert "--all2all-backend allgather_reducescatter" in hit.message


def test_eight_tp1_four_tp2_two_tp4_one_tp8_layouts_validate() -> None:
    for tp, count in ((1, 8), (2, 4), (4, 2), (8, 1)):
        instances = [{"name": f"i{i}"} for i in range(count)]
        spec, findings = check({**G, "vllm_args": {"tensor-parallel-size": tp}, "vllm_instances": instances})
        assert [str(f) for f in findings] == []
        assert sorted(g for s in spec.services for g in s.gpus) == list(range(8))
        assert len({s.port for s in spec.services}) == count


@pytest.mark.parametrize(
    ("args", "key", "says"),
    [
        ({"attention-backend": "AITER_FA"}, "main.args.--attention-backend", "did you mean ROCM_AITER_FA"),
        ({"compilation-config": '{"cudagraph_mode": "FULLL"}'}, "main.args.--compilation-config.cudagraph_mode", "did you mean FULL"),
        ({"compilation-config": '{"full_cuda_graph": true'}, "main.args.--compilation-config", "is not valid JSON"),
        ({"compilation-config": '{"cuda_graph_mode": "FULL"}'}, "main.args.--compilation-config.cuda_graph_mode", "cudagraph_mode"),
        ({"compilation-config": "[1, 2]"}, "main.args.--compilation-config", "must be a JSON object"),
    ],
)
def test_choices_and_json_configs_are_checked_against_the_version(args: dict[str, Any], key: str, says: str) -> None:
    _, findings = check({**G, "vllm_args": args})
    (hit,) = [f for f in findings if f.rule == "value-domain"]
    assert (hit.key == key and says in hit.message and "0.22.0" in hit.message) or "JSON" in hit.message


def test_choices_are_compared_the_way_vllm_compares_them() -> None:
    # vLLM looks enum names up with value.upper(); a mapping in group_data becomes JSON.
    good = {"attention-backend": "rocm_aiter_fa", "compilation-config": {"cudagraph_mode": "full_and_piecewise"}}
    _, findings = check({**G, "vllm_args": good})
    assert "value-domain" not in rules_of(findings)


def test_a_recipes_own_model_name_follows_the_chosen_model() -> None:
    """--served-model-name named the recipe's model: with another vllm_model, clients must see that one, or the name the
    inventory gave; the default image follows vllm_version."""
    spec, findings = check({"vllm_recipe": "llama-3.1-70b", "vllm_model": "meta-llama/Llama-3.3-70B-Instruct"})
    (svc,) = spec.services
    assert svc.model == svc.args["served-model-name"] == "meta-llama/Llama-3.3-70B-Instruct" and findings == []
    assert "follows the model" in svc.reasons["--served-model-name"]
    own = {"vllm_recipe": "llama-3.1-70b", "vllm_model": "meta-llama/Llama-3.3-70B-Instruct", "vllm_args": {"served-model-name": "chat"}}
    assert check(own)[0].services[0].args["served-model-name"] == "chat"
    spec, _ = check({"vllm_recipe": "llama-3.1-70b", "vllm_instances": [{"name": "a", "model": "org/tuned-70b"}]})
    assert spec.services[0].args["served-model-name"] == "org/tuned-70b"
    spec, findings = check({"vllm_version": "0.33.0"})
    assert spec.vars.vllm_image == "vllm/vllm-openai-rocm:v0.33.0" and "image-version-mismatch" not in rules_of(findings)


def test_every_recipe_value_naming_a_model_follows_or_is_refused() -> None:
    """Each shipped recipe, served with another model: no value still names the recipe's model, and a value bound to
    it (a draft) is refused; the class, not the one flag."""
    from instinct_fleet.model.recipes import all_recipes

    for recipe in all_recipes().values():
        spec, findings = check({"vllm_recipe": recipe.name, "vllm_model": "org/another-model", "vllm_nodes": recipe.nodes, **CLUSTER})
        for svc in spec.services:
            assert recipe.model not in [*map(str, svc.args.values()), *svc.env.values()], recipe.name
        bound = [f for f in findings if f.rule == "recipe-model-bound"]
        assert bool(bound) == ("speculative-config" in recipe.args and '"model"' in str(recipe.args["speculative-config"].value)), (
            recipe.name
        )


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("rocm/vllm:rocm7.0.0_vllm_0.11.1_20251103", "0.11.1"),
        ("rocm/vllm:rocm6.4.1_vllm_0.9.0.1_20250605", "0.9.0.1"),
        ("rocm/vllm:rocm6.3.1_instinct_vllm0.8.3_20250415", "0.8.3"),
        ("rocm/vllm:v0.14.0_amd_dev", "0.14.0"),
        ("rocm/vllm-dev:rocm7.1.1_vllm_0.12.0rc1_20251201", "0.12.0rc1"),
        ("vllm/vllm-openai-rocm:v0.22.0", "0.22.0"),
        ("registry.local:5000/vllm/vllm-openai-rocm:0.33.0", "0.33.0"),
        ("ghcr.io/embeddedllm/vllm-rocm:v0.6.3.post1-717a5f8", "0.6.3.post1"),
        ("rocm/vllm:instinct_main", None),
        ("rocm/vllm-dev:nightly_main_20251110", None),
        ("ghcr.io/embeddedllm/vllm-rocm:cb3b2b9", None),
        ("rocm/vllm@sha256:" + "a" * 64, None),
        ("rocm/vllm:rocm7.0.0_vllm_0.11.1_20251103@sha256:" + "a" * 64, "0.11.1"),  # a digest that keeps its tag
    ],
)
def test_the_vllm_version_is_read_from_every_tag_scheme(image: str, version: str | None) -> None:
    """AMD's tags name ROCm first: rocm7.0.0_vllm_0.11.1 is vLLM 0.11.1, never 7.0.0."""
    from instinct_fleet.model.defaults import tag_version

    assert tag_version(image) == version
    if version in ("0.11.1", "0.14.0"):
        _, findings = check({"vllm_image": image, "vllm_version": "0.22.0"})
        (hit,) = [f for f in findings if f.rule == "image-version-mismatch"]
        assert hit.severity == "error" and hit.message.startswith(f"is '0.22.0' but vllm_image {image!r} runs vLLM {version}: ")
        assert hit.key == "vllm_version" and hit.also == ("vllm_image",)


def test_the_image_decides_the_version_and_a_version_without_a_table_is_refused_unless_asked() -> None:
    """Unset, vllm_version is the tag's: AMD's 0.11.1 image is validated against 0.11.1, whose table there is none of;
    set to a version without a table, plan refuses plainly, and the opt-in turns that into a warning on every plan."""
    image = "rocm/vllm:rocm7.0.0_vllm_0.11.1_20251103"
    spec, findings = check({"vllm_image": image})
    assert spec.vars.vllm_version == "0.11.1" and spec.services[0].version == "0.11.1"
    (hit,) = [f for f in findings if f.rule == "version-unsupported"]
    assert hit.severity == "error" and hit.message.startswith("not validated: no table for vLLM 0.11.1 (there are tables for 0.11.0, ")
    assert "`instinct-fleet vllm-facts 0.11.1`" in hit.message and "vllm_version_unvalidated = True" in hit.message
    assert "image-version-mismatch" not in rules_of(findings)
    _, findings = check({"vllm_image": image, "vllm_version_unvalidated": True, "watch": False})
    assert [(f.rule, f.severity) for f in findings] == [("version-unsupported", "warning")]
    _, findings = check({"vllm_image": image, "vllm_version_unvalidated": True})  # the watch needs its metric names
    assert [(f.rule, f.severity) for f in findings] == [("version-unsupported", "warning"), ("watch-metrics", "error")]
    spec, findings = check({"vllm_image": "rocm/vllm:rocm7.0.0_vllm_0.33.0_20260101"})  # a version with a table: checked against it
    assert spec.vars.vllm_version == "0.33.0" and spec.services[0].table is not None and spec.services[0].table.version == "0.33.0"
    spec, findings = check({"vllm_image": "rocm/vllm:instinct_main"})  # a tag that names none: the default version's table, said
    assert spec.vars.vllm_version == "0.22.0" and [f.rule for f in findings] == ["image-version-unnamed"]
    assert findings[0].message.endswith("validated against vLLM 0.22.0's table; set vllm_version to the version the image runs")
    assert check({"vllm_image": "rocm/vllm:instinct_main", "vllm_version": "0.22.0"})[1] == []


def test_what_vllm_starts_with_is_a_warning_that_validation_levels_raises() -> None:
    """vLLM warns and starts on a variable it does not know (envs.py): a warning by default, an error where the
    host asks for one, and an error of its own where the instance makes vLLM refuse (--fail-on-environ-validation)."""
    typo = {"vllm_env": {"VLLM_ROCM_USE_AITR": "1"}}
    _, found = check(typo)
    (unknown,) = [f for f in found if f.rule == "env-unknown"]
    assert unknown.severity == "warning" and "It starts and ignores it" in unknown.message and "VLLM_ROCM_USE_AITER" in unknown.message
    _, raised = check({**typo, "validation_levels": {"env-unknown": "error"}})
    assert [f.severity for f in raised if f.rule == "env-unknown"] == ["error"]
    _, refused = check({**typo, "vllm_args": {"fail-on-environ-validation": True}, "validation_levels": {"env-refused": "warning"}})
    assert "value-format" in rules_of(refused) and [f.severity for f in refused if f.rule == "env-refused"] == ["error"]
    assert any(f.key == "validation_levels.env-refused" for f in refused if f.rule == "value-format")
    # A rule of what vLLM refuses cannot be lowered: the variable names only the rules of what it starts with.
    _, lowered = check({"vllm_args": {"max-num-sequences": 8}, "validation_levels": {"flag-unknown": "warning"}})
    assert [f.severity for f in lowered if f.rule == "flag-unknown"] == ["error"] and "value-format" in rules_of(lowered)


def test_the_rules_of_what_vllm_starts_with_are_warnings_and_say_so() -> None:
    starts = [r for r in RULES.values() if r.starts]
    assert {r.id for r in starts} >= {"env-unknown", "env-removed", "env-unread", "mxfp4-native"}
    assert all(r.severity == "warning" for r in starts)
    assert all(
        r.severity == "error"
        for r in RULES.values()
        if r.id in {"flag-unknown", "env-refused", "quantization-unknown", "attention-backend"}
    )
