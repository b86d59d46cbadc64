"""The rules table, part one: a rule's shape, and the rules on the inventory's own values (schema, vLLM's meaning of
settings, clusters, the roll, the router, inputs). Every finding names one rule of :data:`instinct_fleet.model.rules.RULES`,
which joins this part and :mod:`instinct_fleet.model.hostrules`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    reason: str
    starts: bool = False  # vLLM starts with it, though not as meant: a warning that validation_levels may raise


INPUT_RULES = (
    Rule("schema", "error", "group_data values must have the documented type (docs/reference/variables.md)."),
    Rule(
        "unknown-variable",
        "error",
        "A misspelt variable is silently ignored by pyinfra; every instinct-fleet variable is listed in docs/reference/variables.md.",
    ),
    Rule(
        "group-data-unread",
        "warning",
        "pyinfra keeps a group_data file of a group no host is in (a misspelt name) as a group without hosts: its values reach no host, without a word.",
    ),
    Rule(
        "mapping-replaced",
        "warning",
        "A more specific level (a group, the host) sets a mapping such as `vllm_args` and so drops keys a broader level set: pyinfra, like Ansible by default, replaces a mapping whole and never merges it. Repeat the keys where the mapping is replaced.",
    ),
    Rule(
        "mapping-replaced-parallel",
        "error",
        "A replaced `vllm_args` dropped a tensor, pipeline or data parallel size that differs from the one in force: each instance would take another number of GPUs. Repeat it where `vllm_args` is replaced (the value you mean).",
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
        "error",
        "The image tag names a vLLM version other than `vllm_version`: the checks would read one version's table while the image runs another's (a flag the image refuses would pass). Unset, `vllm_version` follows the tag.",
    ),
    Rule(
        "image-version-unnamed",
        "warning",
        "`vllm_image`'s tag names no vLLM version (a nightly, a commit, a bare digest) and `vllm_version` is unset: the checks read the default version's table, which may not be the image's.",
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
        "canary-off",
        "warning",
        "`canary_profile` is None: no re-tune is benchmarked or asked the accuracy probe before it rolls on, so a change that slows the engine or corrupts answers reaches every batch.",
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
        "The watch (on by default) reads the engine's step counters and request gauges from `/metrics`, by the names the pinned vLLM's own source gives them (its table's `metrics`); a table without them, or no table at all (`vllm_version_unvalidated`), cannot tell a hung engine from an idle one.",
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
        "No value may hold a control character: a newline would add a line to an env file or a directive to a unit (docs/your-fleet.md).",
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
        "error",
        "The router checks no key and passes the client's on as it is: in a pool of instances with and without vllm_api_key_path, a client without the key is refused by some and served by others, so the key protects nothing.",
    ),
    Rule(
        "api-key-keyless-routes",
        "warning",
        "vLLM checks vllm_api_key_path's key only on the paths its source guards (/v1, then /v2, /inference, /cohere); /tokenize, /pause, /scale_elastic_ep and every other route it serves answer anyone who reaches the port. A keyed host in a pool with vllm_allow_from unset is open to its routers alone; any other keyed host is warned, with the routes of its pinned version.",
    ),
    Rule(
        "router-reach",
        "error",
        "A firewall between a router and its pool cuts it: the router must pass each serving host's vllm_allow_from, and the router host's firewall must admit each serving host, by its IP, to the worker API (the roll drains through it).",
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
