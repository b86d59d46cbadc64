"""The validation rules: id, severity and the reason or source behind each.

Rules live in one table so the CLI, the README and the tests all name the same
ids. Errors stop a run before any connection; warnings are printed and the run
goes on.

A rule about vLLM tells apart two outcomes: vLLM **refuses to start** (an error: the
instance would crash-loop), and vLLM **starts, but not as you meant** (it warns and
ignores a variable, or emulates a format slowly). The second kind (``starts=True``)
is a warning by default, and ``validation_levels`` raises it to an error per host or
group: validated means "it starts", in both directions.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    reason: str
    starts: bool = False  # vLLM starts with it, though not as meant: a warning that validation_levels may raise


@dataclass(frozen=True)
class Finding:
    """One rule tripped, on one host (None for ``render``), for one key; ``origin`` says where the inventory set the value."""

    rule: str
    severity: Severity
    host: str | None
    key: str
    message: str
    origin: str | None = None  # "vllm_args, set in group_data/gpu.py line 2": the variable and the file that wrote it

    def __str__(self) -> str:
        return self.line([self.host] if self.host else [])

    def line(self, hosts: Sequence[str]) -> str:
        """The finding as one line for every host in ``hosts`` (none: ``render``, or data that no host reads)."""
        where = f"{host_ranges(hosts)}: " if hosts else ""
        origin = f" ({self.origin})" if self.origin else ""
        return f"{self.severity}: {where}{self.key}: {self.message}{origin} [{self.rule}]"

    @property
    def mistake(self) -> tuple[str, str, str, str, str | None]:
        """What makes two hosts' findings one mistake: the same rule, key, message and origin."""
        return (self.severity, self.rule, self.key, self.message, self.origin)

    @property
    def brief(self) -> str:
        """The finding without severity and host, for a line that already names the host.

        A key under ``preflight`` names a probe of the host, not a variable, so it is left out.
        """
        key = "" if self.key.startswith("preflight") else f"{self.key}: "
        return f"{key}{self.message} [{self.rule}]"


_RULES = (
    Rule("schema", "error", "group_data values must have the documented type (README, Variables)."),
    Rule(
        "unknown-variable",
        "error",
        "A misspelt variable is silently ignored by pyinfra; every instinct-fleet variable is listed in the README.",
    ),
    Rule(
        "group-data-unread",
        "warning",
        "pyinfra keeps a group_data file of a group no host is in (a misspelt name) as a group without hosts: its values reach no host, without a word.",
    ),
    Rule(
        "inventory-conflict",
        "error",
        "A host listed in two groups with different values for a variable (two clusters, say) gets one of them silently from pyinfra's merge.",
    ),
    Rule("recipe-unknown", "error", "Only built-in recipes can be named; `instinct-fleet recipes` lists them."),
    Rule(
        "recipe-model-bound",
        "error",
        "A recipe's setting made for its own model (an EAGLE draft in --speculative-config) cannot follow another `vllm_model`; names of the model itself (--served-model-name) follow it.",
    ),
    Rule("version-unsupported", "error", "Validation needs the env var and flag table of the pinned vLLM version."),
    Rule("image-unpinned", "error", "A `latest` or missing tag makes every run pull a different image: pin a tag or a digest."),
    Rule(
        "image-version-mismatch",
        "warning",
        "The image tag names a vLLM version other than `vllm_version`, so the checks may use the wrong table.",
    ),
    Rule(
        "env-unknown",
        "warning",
        "vLLM starts and ignores a VLLM_* variable it does not know, with a warning in its log ('Unknown vLLM environment variable detected', vllm/envs.py); a typo's setting never takes effect. Raise it to an error with validation_levels (generated from vllm/envs.py).",
        starts=True,
    ),
    Rule(
        "env-unread",
        "warning",
        "vLLM defines the variable in envs.py but no running code reads it, so it has no effect (generated: a read must reach code that runs).",
        starts=True,
    ),
    Rule(
        "env-removed",
        "warning",
        "The variable is gone from the pinned vLLM, which starts and ignores it with a warning; knowledge/replaced.toml says what replaced it.",
        starts=True,
    ),
    Rule(
        "env-refused",
        "error",
        "With --fail-on-environ-validation (vLLM 0.22.0 and later) vLLM refuses to start on a VLLM_* variable it does not know, a removed one included (EngineArgs.fail_on_environ_validation).",
    ),
    Rule("flag-unknown", "error", "`vllm serve` exits on flags it does not know (generated from vLLM's engine and frontend arguments)."),
    Rule("flag-removed", "error", "The flag was removed (V0 or later); knowledge/replaced.toml says what replaced it."),
    Rule("flag-not-boolean", "error", "Only boolean flags take true/false; a value flag needs a value."),
    Rule("managed-key", "error", "The port, GPU set and GPU visibility come from `vllm_instances`, so they cannot also be set by hand."),
    Rule(
        "aiter-subflag-inert",
        "warning",
        "VLLM_ROCM_USE_AITER_* sub-flags only act when VLLM_ROCM_USE_AITER=1 (002:23, 003:59).",
        starts=True,
    ),
    Rule(
        "unified-attention-needs-mha-off",
        "error",
        "AITER unified attention only takes effect with VLLM_ROCM_USE_AITER_MHA=0 (003:106).",
    ),
    Rule(
        "value-domain",
        "error",
        "The value is outside what vLLM accepts (choices from vLLM's source; a positive count, a memory share in (0, 1], a port: the project's own bounds, where vLLM's parser has none).",
    ),
    Rule(
        "gpu-memory-high",
        "warning",
        "At 0.95 or more of HBM with AITER on, AITER workspace spikes can OOM during concurrent large prefills (000:73); 002:325 allows up to 0.95 without naming AITER.",
    ),
    Rule(
        "hip-visible-devices",
        "error",
        "vLLM on ROCm reads CUDA_VISIBLE_DEVICES; keep HIP_VISIBLE_DEVICES unset (002:171).",
    ),
    Rule(
        "parallel-size",
        "error",
        "TP x PP x DP must equal the GPUs the instance gets: its GPU set on one node, nodes x GPUs per node on a cluster.",
    ),
    Rule("tp-beyond-xgmi", "warning", "TP above 8 leaves the XGMI island; use PP across nodes (002:189)."),
    Rule("gpu-out-of-range", "error", "GPU indices must exist on the host (0 .. gpu_count-1)."),
    Rule(
        "gpu-overlap",
        "error",
        "Instances sharing a GPU must each set --gpu-memory-utilization and together stay at or below 1.0: each reserves that fraction of the whole GPU's memory, so shares above 1.0 cannot all start. The seed lowers it to pack instances (002:326) and gives two 0.45 as an example (002:327); the limit is the arithmetic, not the seed's.",
    ),
    Rule(
        "awq-rocm",
        "error",
        "AWQ on ROCm runs the Triton kernels (VLLM_USE_TRITON_AWQ=1) with float16 activations (--dtype auto or float16) (002:494).",
    ),
    Rule(
        "spec-tokens",
        "warning",
        "More speculative tokens lower the draft acceptance rate and the throughput; 002:579 advises num_speculative_tokens <= 2.",
    ),
    Rule("port-overlap", "error", "Two instances on one host cannot listen on the same port."),
    Rule(
        "dp-rocm-settings",
        "error",
        "Data parallel on ROCm needs the allgather_reducescatter all-to-all and --disable-nccl-for-dp-synchronization (002:202).",
    ),
    Rule("nccl-single-gpu", "warning", "NCCL_MIN_NCHANNELS only helps multi-GPU collectives; one GPU has none (002:17).", starts=True),
    Rule(
        "cluster-topology",
        "error",
        "A multi-node instance needs a `ray_cluster` of exactly `vllm_nodes` hosts with one head, which runs the single vLLM instance.",
    ),
    Rule(
        "cluster-mismatch",
        "error",
        "Every node of a cluster runs the same thing: GPU model and count, image, version, model, env, flags, nodes, Ray ports, ready timeout and InfiniBand (crosscheck.member); Ray places ranks on any of them.",
    ),
    Rule(
        "cluster-nic",
        "error",
        "A cluster needs `cluster_nic`: otherwise RCCL and Gloo pick an interface themselves, often docker0 or a management NIC. The project's choice (RCCL/NCCL documentation of NCCL_SOCKET_IFNAME); 002:580's multi-node checklist does not cover it.",
    ),
    Rule(
        "rccl-unset",
        "warning",
        "Without NCCL_IB_HCA RCCL sends cross-node traffic over TCP sockets on `cluster_nic`: a fraction of the RDMA bandwidth. The project's choice (RCCL documentation); 002:584 only covers GPUDirect RDMA (RCCL_NET_GDR_LEVEL).",
    ),
    Rule("ray-ports", "error", "Ray's pinned ports must not collide with a vLLM port on the same host."),
    Rule(
        "local-file",
        "error",
        "Registry credentials and CA certificates are copied from the control machine, so they must exist there (paths relative to the project directory).",
    ),
    Rule(
        "slo-fleet",
        "error",
        "The SLOs and their alerts (`slo_*`, `prometheus_retention`, `alert_webhook_url`) are one set for the fleet's rule file, so every host must carry the same values (set them in group_data/all.py).",
    ),
    Rule(
        "slo-window",
        "error",
        "Each burn-rate alert of `slo_burn_alerts` reads its long window of samples, which `prometheus_retention` must keep, and its short window must be below its long one.",
    ),
    Rule(
        "slo-ttft-bucket",
        "error",
        "`slo_ttft_seconds` must be a bucket bound of `vllm:time_to_first_token_seconds` as the pinned vLLM's source fixes them (or as an instance's `--custom-histogram-buckets` replaces them, from 0.33.0): Prometheus counts a request as within or over the threshold only at a bound.",
    ),
    Rule(
        "rolling-fleet",
        "error",
        "`rolling_batch`, `rolling_max_failures`, `rolling_on_failure` and the canary's settings (every `canary_*` variable: its profile, runs and verdict, and its accuracy probe) pace and judge one roll across the whole fleet, so every host must carry the same values (set them in group_data/all.py).",
    ),
    Rule(
        "canary-profile",
        "error",
        "`canary_profile` must name a bench profile (built-in or in `bench_profiles`) that every instance of the host can run: a random prompt plus its output must fit the instance's `--max-model-len`, as `instinct-fleet bench` requires.",
    ),
    Rule(
        "canary-runs",
        "warning",
        'The canary\'s speed verdict takes the run as its unit (instinct_fleet/live/noise.py): with one run a side it can never tell a slowdown from noise, so no slowdown fails the canary while `canary_inconclusive` is `"proceed"`, and with two it catches few (benchmarks/RESULTS.md, "Canary against noise"). Three runs a side or more, or `canary_inconclusive = "rollback"`.',
    ),
    Rule(
        "canary-probe",
        "error",
        "`canary_probe` is read on the control machine and asked of the canary: each line one JSON object with a `prompt` and exactly one of `answer` (a number) or `pattern` (a regular expression), at least one item; a probe that cannot be scored would pass or fail every change.",
    ),
    Rule(
        "watch-metrics",
        "error",
        "The watch (on by default) reads the engine's step counters and request gauges from `/metrics`, by the names the pinned vLLM's own source gives them (its table's `metrics`); a table without them cannot tell a hung engine from an idle one.",
    ),
    Rule(
        "gpu-health-thresholds",
        "error",
        "`gpu_health_recovery_warning` must not be above `gpu_health_recovery_error`: a link past the error bound would never have been warned about.",
    ),
    Rule(
        "watch-timing",
        "error",
        "The watch reads each instance every `watch_interval` seconds, which must be below `watch_stall_seconds`: a stall would be seen a reading late, or never.",
    ),
    Rule(
        "watch-stall-step",
        "warning",
        "The stall window should outlast the instance's longest engine step (its `--max-num-batched-tokens`, or `--max-model-len` with chunked prefill off, prefilled at `watch_prefill_tokens_per_second`), or the watch may restart a healthy instance in the middle of one long prefill. A warning: the rate is an estimate for the slowest model; state your model's in `watch_prefill_tokens_per_second`.",
    ),
    Rule(
        "unsafe-value",
        "error",
        "No value may hold a control character: a newline would add a line to an env file or a directive to a unit (README, Validation).",
    ),
    Rule(
        "hf-token-source",
        "error",
        "`hf_token_source` must name a token the control machine holds: a set environment variable (env:NAME) or a readable file, holding one token; the deploy writes it to every host.",
    ),
    Rule(
        "secret-inline",
        "error",
        "The Hugging Face token lives only in the file `hf_token_path` on each host, never in env, argv or a unit.",
    ),
    Rule(
        "value-format",
        "error",
        "The value must have the form its consumer accepts (docker's reference grammar, absolute paths, interface and user names, NCCL levels), checked before any host is touched.",
    ),
    Rule("instance-unique", "error", "Instance names name units, so they are unique on a host; an instance lists each GPU once."),
    Rule(
        "allow-from",
        "error",
        "`vllm_allow_from` and `prometheus_allow_from` take IP addresses or networks (10.0.0.0/8) exactly as written: host bits set would widen an entry to its whole network.",
    ),
    Rule(
        "port-conflict",
        "error",
        "Every port a feature listens on is distinct on its host: vLLM instances, the metrics exporter, Ray's ports and worker range, the router's pools and their metrics, and SSH.",
    ),
    Rule(
        "router-version",
        "error",
        "Router settings are checked against the pinned vllm-router's own CLI table (scripts/extract_router_knowledge.py).",
    ),
    Rule(
        "router-flag",
        "error",
        "vllm-router exits on an option or value its parser refuses (generated from its RouterArgs); the options a variable or the pool sets cannot be set twice.",
    ),
    Rule(
        "router-api-key-inline",
        "error",
        "A key given as --api-key sits in the unit file and in ps, and the router needs none: it passes each client's Authorization header on (measured on vllm-router 0.1.17).",
    ),
    Rule(
        "router-api-key",
        "warning",
        "The router passes the client's key on as it is: in a pool of instances with and without vllm_api_key_path, a client without the key is refused by some and served by others.",
    ),
    Rule(
        "router-reach",
        "error",
        "A firewall between a router and its pool cuts it: the router must pass each serving host's vllm_allow_from, and each serving host the router's router_allow_from (the roll drains through its worker API).",
    ),
    Rule(
        "router-wheel",
        "error",
        "The controller copies the router from the pinned wheel, checked against its sha256; without it the host gets no router.",
    ),
    Rule(
        "router-pool",
        "error",
        "Each router pool is every instance in the inventory that serves its model; a pool with none would refuse every request.",
    ),
    Rule(
        "derived-setting",
        "error",
        "The deploy derives HF_HOME, HF_TOKEN_PATH and, on a cluster node, VLLM_HOST_IP and the RCCL/Gloo interface settings; a user value would fight it.",
    ),
    Rule(
        "flag-twice",
        "error",
        "One flag under two spellings in one place (tp and tensor-parallel-size): which value vLLM sees would be an accident.",
    ),
    Rule(
        "path-overlap",
        "error",
        "weights_source, hf_cache_dir and hf_token_path must not coincide or nest: staging copies one into the other.",
    ),
    Rule(
        "firewall-off",
        "error",
        "An allow-list with `firewall = False` would not be enforced; the firewall must be on for it to mean anything.",
    ),
    Rule(
        "bench-profile",
        "error",
        "A bench profile's fields must be ones vLLM's benchmark reads together: `sharegpt` needs `dataset_path` and takes its lengths from it; `random` makes its own prompts from `input_len` and `output_len` and reads no file.",
    ),
    Rule(
        "timeouts",
        "error",
        "A unit's drain (`rolling_drain_timeout`, or an instance's own `--shutdown-timeout`) plus docker's 30 s stop margin must stay below `command_timeout`, or the hung-host watchdog kills a normal restart.",
    ),
    Rule(
        "quick-reduce-tp1",
        "warning",
        "Quick reduce quantizes all-reduces; at world size 1 vLLM creates no device communicator, so VLLM_ROCM_QUICK_REDUCE_QUANTIZATION does nothing.",
        starts=True,
    ),
)

# vLLM's own start-up checks (instinct_fleet/model/startup.py), from the per-version tables:
# each refuses what the pinned vLLM would refuse when it starts.
_STARTUP_RULES = (
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
_HOST_RULES = (
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

RULES: dict[str, Rule] = {r.id: r for r in (*_RULES, *_STARTUP_RULES, *_HOST_RULES, *GPU_RULES)}
# The rules for what vLLM starts with, though not as meant: warnings that validation_levels may raise.
STARTS_RULES: tuple[str, ...] = tuple(r.id for r in RULES.values() if r.starts)


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def host_ranges(hosts: Iterable[str]) -> str:
    """Host names as a reader scans them: numbered runs folded (``mi300x-01..40``), the rest listed, in natural order."""
    runs: list[tuple[str, int, int, int] | str] = []  # (prefix, padded width or 0, first, last) or a name as it is
    keyed = sorted(set(hosts), key=lambda h: ([(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", h)], h))
    for name in keyed:
        match = _NUMBERED.match(name)
        last = runs[-1] if runs else None
        if match:
            prefix, digits = match.group(1), match.group(2)
            padded = len(digits) > 1 and digits.startswith("0")
            fits = len(digits) == last[1] if isinstance(last, tuple) and last[1] else not padded
            if isinstance(last, tuple) and last[0] == prefix and fits and int(digits) == last[3] + 1:
                runs[-1] = (prefix, last[1], last[2], int(digits))
                continue
            runs.append((prefix, len(digits) if padded else 0, int(digits), int(digits)))
        else:
            runs.append(name)
    parts = []
    for run in runs:
        if isinstance(run, str):
            parts.append(run)
            continue
        prefix, width, first, last_number = run
        names = [f"{prefix}{n:0{width}d}" if width else f"{prefix}{n}" for n in (first, last_number)]
        parts.append(names[0] if first == last_number else f"{names[0]}..{names[1][len(prefix) :]}")
    return ", ".join(parts)


def distinct(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per mistake on a host: a second finding of the same rule on the same key (two checks of one bound)
    is dropped, and so is a warning on a key that already has an error (a value that is wrong needs no advice)."""
    found = list(dict.fromkeys(findings))
    wrong = {(f.host, f.key) for f in found if f.severity == "error"}
    seen: set[tuple[str | None, str, str]] = set()
    kept = []
    for f in found:
        if (f.host, f.key, f.rule) in seen or (f.severity == "warning" and (f.host, f.key) in wrong):
            continue
        seen.add((f.host, f.key, f.rule))
        kept.append(f)
    return kept


def grouped(findings: Iterable[Finding]) -> list[str]:
    """The findings as lines, one per mistake: the same rule, key, message and origin on many hosts is one line naming
    them all; errors first, each group in the order its first finding came."""
    hosts: dict[tuple[str, str, str, str, str | None], list[str]] = {}
    first: dict[tuple[str, str, str, str, str | None], Finding] = {}
    for f in distinct(findings):
        first.setdefault(f.mistake, f)
        hosts.setdefault(f.mistake, [])
        if f.host:
            hosts[f.mistake].append(f.host)
    order = sorted(first, key=lambda m: m[0] != "error")
    return [first[m].line(hosts[m]) for m in order]


def refused(findings: Iterable[Finding], consequence: str, warnings: bool = False) -> bool:
    """Print the errors (and the warnings, if asked) to stderr, one line per mistake, with a count and what follows from
    them; True when there is an error.

    The one printer for every command that validates before it acts: deploy, targets,
    status, bench and plain pyinfra's gate.
    """
    shown = distinct(f for f in findings if warnings or f.severity == "error")
    for line in grouped(shown):
        print(line, file=sys.stderr)
    if any(f.severity == "error" for f in shown):
        print(f"{tally(shown, 'error')}: {consequence}", file=sys.stderr, flush=True)
        return True
    return False


def tally(findings: Sequence[Finding], severity: Severity) -> str:
    """``3 error(s) on 40 host(s)``: mistakes (lines) of one severity, and the hosts they touch."""
    chosen = [f for f in findings if f.severity == severity]
    mistakes = len({f.mistake for f in chosen})
    hosts = {f.host for f in chosen if f.host}
    return f"{mistakes} {severity}(s)" + (f" on {len(hosts)} host(s)" if hosts else "")


def finding(rule: str, host: str | None, key: str, message: str) -> Finding:
    return Finding(rule=rule, severity=RULES[rule].severity, host=host, key=key, message=message)
