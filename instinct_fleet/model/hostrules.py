"""The rules table, part two: what vLLM refuses or warns about at start-up, what preflight finds on a host, and the GPU
health rules (:mod:`instinct_fleet.converge.gpuhealth`)."""

from __future__ import annotations

from instinct_fleet.model.ruletable import Rule

STARTUP_RULES = (
    Rule(
        "quantization-unknown",
        "error",
        "vLLM raises 'Unknown quantization method' for a name outside its QuantizationMethods (generated per version).",
    ),
    Rule(
        "quantization-rocm", "error", "vLLM on ROCm refuses a method outside RocmPlatform.supported_quantization (generated per version)."
    ),
    Rule(
        "quantization-deprecated",
        "error",
        "vLLM refuses a deprecated method, named or declared by the checkpoint, unless --allow-deprecated-quantization is given (generated per version).",
    ),
    Rule(
        "quantization-mismatch",
        "error",
        "A checkpoint carries its own quantization; vLLM refuses a --quantization that differs (knowledge/checkpoints.toml).",
    ),
    Rule(
        "mxfp4-native",
        "warning",
        "Native MXFP4 GEMMs need gfx950 (RocmPlatform.supports_mx); elsewhere vLLM starts and emulates them in high precision, with no memory or speed gain. 002:445 lists the MXFP4 models for MI350/MI355.",
        starts=True,
    ),
    Rule(
        "attention-backend",
        "error",
        "The attention backend must accept the KV-cache dtype, block size and the model's MLA, sparsity and sinks, or vLLM stops at start-up (generated per version).",
    ),
    Rule(
        "scheduler-batched-below-seqs",
        "error",
        "vLLM's SchedulerConfig needs --max-num-batched-tokens >= --max-num-seqs; an absent one counts at the default `vllm serve` sets on the host's GPU model (EngineArgs, by device memory).",
    ),
    Rule(
        "executor-nsight-needs-ray",
        "error",
        "--ray-workers-use-nsight needs the ray executor: vLLM's ParallelConfig refuses it under the executor it picks otherwise (uni for one process, mp for more).",
    ),
    Rule(
        "executor-nnodes-backend",
        "error",
        "--nnodes above 1 needs the mp, uni or external_launcher executor: vLLM's ParallelConfig refuses it under ray, explicit or picked by --data-parallel-backend ray.",
    ),
    Rule(
        "flag-config-exclusive",
        "error",
        "A flag and the key of a JSON-config flag that set the same thing (--attention-backend and --attention-config's backend): vLLM's EngineArgs refuses both (generated per version).",
    ),
    Rule(
        "scheduler-batched-below-model-len",
        "error",
        "With chunked prefill off, vLLM's SchedulerConfig needs --max-num-batched-tokens >= --max-model-len.",
    ),
    Rule("scheduler-partial-prefills-chunked", "error", "vLLM needs chunked prefill for --max-num-partial-prefills above 1."),
    Rule("scheduler-long-partial-prefills", "error", "vLLM needs --max-long-partial-prefills <= --max-num-partial-prefills."),
    Rule(
        "executor-async-scheduling",
        "error",
        "vLLM refuses --async-scheduling on an executor class that does not support it; the class follows the backend and, "
        "in 0.22.0, VLLM_USE_RAY_V2_EXECUTOR_BACKEND (0 picks RayDistributedExecutor, which does not).",
    ),
    Rule(
        "partial-prefill-unsupported",
        "error",
        "vLLM 0.22.0 runs no concurrent partial prefill: it refuses --max-num-partial-prefills or --max-long-partial-prefills "
        "other than 1 at start-up (NotImplementedError).",
    ),
    Rule("speculative-draft-tp", "error", "vLLM takes a draft_tensor_parallel_size of 1 or the target's tensor parallel size only."),
    Rule(
        "speculative-tokens-without-model",
        "error",
        "vLLM refuses num_speculative_tokens without a draft model for a method that needs one.",
    ),
    Rule(
        "speculative-tensor-parallel-key",
        "error",
        "vLLM refuses tensor_parallel_size in --speculative-config; the key is draft_tensor_parallel_size.",
    ),
    Rule("speculative-prompt-lookup", "error", "vLLM needs prompt_lookup_min <= prompt_lookup_max for n-gram speculation."),
    Rule("kv-connector-role", "error", "vLLM refuses a --kv-transfer-config kv_connector without its kv_role."),
    Rule(
        "shuffle-kv-speculative",
        "error",
        "ROCM_AITER_FA (named, or the backend vLLM picks when none is) asserts on the shuffled KV-cache layout together with "
        "speculative decoding (multi-token decode), and from 0.33.0 on with a model whose attention has sinks (gpt-oss) too.",
    ),
)

# Found by preflight, on the host's own facts (one read per host), before anything changes.
HOST_RULES = (
    Rule(
        "host-unreachable", "error", "The preflight facts could not be read: the host is down, refuses SSH or hangs past command_timeout."
    ),
    Rule(
        "host-os", "error", "instinct-fleet installs packages with apt and regenerates GRUB the Debian way: Debian and Ubuntu hosts only."
    ),
    Rule(
        "host-gpu",
        "error",
        "amd-smi (or rocm-smi) must be installed and list the host's GPUs: preflight reads the GPU model, count and partitions with ROCm's own tool.",
    ),
    Rule(
        "host-driver", "error", "The amdgpu driver must be live with /dev/kfd and a /dev/dri render node per GPU, which the containers get."
    ),
    Rule("host-gpu-model", "error", "`gpu_model` must be what amd-smi reports: the recipes' settings are per GPU generation."),
    Rule(
        "host-gpu-count",
        "error",
        "The host must show `gpu_count` GPUs in its partition mode; a cluster node exactly that many, as Ray offers them all.",
    ),
    Rule(
        "host-cluster-nic", "error", "`cluster_nic` must carry an IPv4 address on every member: it becomes VLLM_HOST_IP and Ray's node IP."
    ),
    Rule(
        "host-cluster-member",
        "error",
        "A cluster member needs every peer's facts (addresses, GPUs); one unreachable member stops its cluster.",
    ),
    Rule("host-reboot-required", "warning", "The GRUB drop-in changed the kernel command line; it takes effect at the next boot."),
    Rule("host-numa-balancing", "warning", "The kernel has no kernel.numa_balancing, so there is nothing to turn off."),
    Rule("host-hf-token", "warning", "Without a token at `hf_token_path`, gated models (Llama) fail to download."),
    Rule(
        "host-api-key",
        "error",
        "`vllm_api_key_path` must be a non-empty file only root can read: vLLM refuses every /v1 request without the key it holds.",
    ),
    Rule(
        "quarantine-operator",
        "error",
        "An operator quarantined the host or one of its GPUs (`instinct-fleet quarantine`): its instances stay drained and stopped until `instinct-fleet admit`.",
    ),
    Rule(
        "quarantine-held",
        "error",
        "The evidence cleared, but the host was re-admitted `gpu_health_readmit_max` times within `gpu_health_readmit_window` seconds (the AMD GPU Operator's bound: 3 per 15 minutes): a flapping GPU stays out until a person runs `instinct-fleet admit`.",
    ),
    Rule(
        "quarantine-admit",
        "error",
        "`instinct-fleet admit` reads the evidence again and refuses while a `gpu-*` rule still finds an error: fix the GPU (reset, reboot, replace) first.",
    ),
    Rule(
        "host-generation",
        "error",
        "`instinct-fleet rollback` needs the generation it asks for on the host, with a unit file and an env file for each serving unit the inventory gives the host, and no other: it puts back files, not instances. Without `--to`, a host with no older generation that passed the gate (one the change did not touch) keeps what it runs.",
    ),
)

# GPU health, judged on the preflight fact's amd-smi evidence (instinct_fleet/converge/gpuhealth.py). The defaults are
# those of AMD's node health analyzer (amd/node-scraper); `gpu_health_levels` lowers or raises any of them per host or
# group. An error quarantines the GPU's instances (all of the host's for a host-wide rule); a warning never does.
GPU_RULES = (
    Rule(
        "gpu-ecc-uncorrectable",
        "error",
        "Any uncorrectable ECC error, in total or in any RAS block, as AMD's device metrics exporter and node-scraper judge a GPU unhealthy.",
    ),
    Rule("gpu-ecc-correctable", "warning", "Correctable ECC errors: the hardware fixed them, but they precede retired pages."),
    Rule("gpu-ecc-deferred", "warning", "Deferred ECC errors: poisoned data the GPU has not consumed yet."),
    Rule(
        "gpu-bad-pages",
        "error",
        "Retired and pending bad pages at or over `ras.bad_page_threshold`: the amdgpu driver stops initialising the GPU.",
    ),
    Rule(
        "gpu-bad-pages-near",
        "warning",
        "Retired and pending bad pages over `gpu_health_bad_page_warning` of the threshold (the driver warns at 90%).",
    ),
    Rule(
        "gpu-pcie-width",
        "error",
        "The PCIe link trained at another width than `gpu_health_pcie_width` (x16): host-device copies run at a fraction of their speed.",
    ),
    Rule("gpu-pcie-speed", "error", "The PCIe link trained at another speed than `gpu_health_pcie_speed` GT/s (Gen5, 32)."),
    Rule("gpu-pcie-recovery", "error", "More L0-to-recovery transitions than `gpu_health_recovery_error`: the link is retraining."),
    Rule("gpu-pcie-recovery-warning", "warning", "More L0-to-recovery transitions than `gpu_health_recovery_warning`."),
    Rule("gpu-pcie-replay", "warning", "PCIe replays: packets the link had to send again."),
    Rule("gpu-pcie-nak", "warning", "PCIe NAKs sent or received."),
    Rule("gpu-xgmi-down", "error", "An XGMI link to another GPU of the node is down: tensor-parallel all-reduce crosses it."),
    Rule("gpu-node-mismatch", "error", "The GPUs of one node must agree on model, compute units and gfx version (node-scraper's check)."),
    Rule(
        "gpu-fleet-drift",
        "error",
        "Firmware, driver, XGMI bit rate and partition modes must be `gpu_health_expected`'s, or else the fleet's majority.",
    ),
    Rule(
        "gpu-fleet-split",
        "warning",
        "The hosts read in this run split evenly on a value: there is no majority to compare with; pin it in `gpu_health_expected`.",
    ),
    Rule(
        "gpu-evidence",
        "warning",
        "An amd-smi command gave no data (an old amd-smi, a guest VM, no root): the rules that read it were not judged.",
    ),
)
