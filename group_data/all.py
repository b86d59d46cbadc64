"""Fleet-wide settings: every instinct-fleet variable, at its default.

pyinfra reads this file for every host; group files (group_data/<group>.py) and
host data in the inventory override it. instinct_fleet/model/defaults.py defines
each default; docs/reference/variables.md lists the same variables.
"""

# Built-in recipe each instance starts from (`instinct-fleet recipes` lists them); `None` starts
# from nothing but `vllm_model`, `vllm_env` and `vllm_args`.
vllm_recipe = "gpt-oss-120b"

# vLLM ROCm container image, pinned by tag or digest; `latest` and untagged names are refused.
# Unset, it follows `vllm_version` (`vllm/vllm-openai-rocm:v<vllm_version>`).
vllm_image = "vllm/vllm-openai-rocm:v0.22.0"

# vLLM version inside `vllm_image`; selects the table of env vars and flags that validation
# checks against. Unset, the image's tag decides it (`rocm/vllm:rocm7.0.0_vllm_0.11.1_20251103`
# is 0.11.1); set, it must agree with the tag.
vllm_version = "0.22.0"

# Deploy a `vllm_version` that has no table (`instinct-fleet vllm-facts` makes one): its flags
# and env vars go unchecked, and `plan` warns instead of refusing.
vllm_version_unvalidated = False

# Model to serve; `None` keeps the recipe's model.
vllm_model = None

# Env vars layered over the recipe's for every instance on the host; a value of `None` removes a
# recipe variable.
vllm_env = {}

# `vllm serve` flags layered over the recipe's (`{"max-num-seqs": 256}`); `True` is a bare flag,
# `False` the `--no-` form, `None` removes.
vllm_args = {}

# Instances per host: `name`, and optionally `recipe`, `model`, `gpus` (list of GPU indices),
# `port`, `env`, `args`. GPUs and ports default to consecutive blocks.
vllm_instances = [{"name": "main"}]

# Nodes one instance spans (2 or more for a Ray cluster); TP x PP x DP must equal nodes x GPUs
# per node.
vllm_nodes = 1

# GPUs each host must have (logical GPUs after partitioning); preflight compares it with amd-
# smi.
gpu_count = 8

# GPU model the host must have: MI300X, MI325X, MI350X or MI355X.
gpu_model = "MI300X"

# Judge every GPU on the preflight fact's amd-smi evidence (ECC, bad pages, PCIe link, XGMI
# links, firmware, driver, partitions) by the `gpu-*` rules, and quarantine the instances of a
# GPU in error: drained out of the router, stopped, held out until the evidence clears
# (docs/gpu-health.md).
gpu_health = True

# PCIe link width each GPU must train at (`gpu-pcie-width`; node-scraper's default, x16).
gpu_health_pcie_width = 16

# PCIe link speed in GT/s each GPU must train at (`gpu-pcie-speed`; node-scraper's default, 32:
# Gen5).
gpu_health_pcie_speed = 32

# L0-to-recovery transitions of a GPU's PCIe link above which it is in error (`gpu-pcie-
# recovery`; node-scraper's default).
gpu_health_recovery_error = 3

# L0-to-recovery transitions above which a warning is given (`gpu-pcie-recovery-warning`); at
# most `gpu_health_recovery_error`.
gpu_health_recovery_warning = 1

# Fraction of `ras.bad_page_threshold` of retired and pending pages that gives a warning (`gpu-
# bad-pages-near`; the amdgpu driver warns at 90%).
gpu_health_bad_page_warning = 0.9

# What every GPU must run (`gpu-fleet-drift`): `{"firmware": "00159017", "driver": "6.16.13",
# "xgmi_rate": "32 Gb/s", "compute_partition": "SPX", "memory_partition": "NPS1"}`; a key left
# out is compared with the majority of the hosts read in the run.
gpu_health_expected = {"firmware": None, "driver": None, "xgmi_rate": None, "compute_partition": None, "memory_partition": None}

# Junction temperature (°C) above which the `GpuJunctionTemperatureHigh` alert fires after 5
# minutes (`instinct-fleet targets --alerts`); our default, not AMD's limit: set your
# platform's.
gpu_alert_junction_celsius = 100

# Memory (HBM) temperature (°C) above which the `GpuMemoryTemperatureHigh` alert fires after 5
# minutes; our default, not AMD's limit: set your platform's.
gpu_alert_memory_celsius = 90

# Time to first token the SLO holds each model's requests to, in seconds; it must be a bucket
# bound of `vllm:time_to_first_token_seconds` in the pinned vLLM (or of its `--custom-histogram-
# buckets`), since Prometheus counts requests only at a bound (`slo-ttft-bucket`).
slo_ttft_seconds = 2.5

# Fraction of each model's requests whose first token comes within `slo_ttft_seconds` (the TTFT
# SLO; 1 minus it is the error budget the burn-rate alerts spend).
slo_ttft_objective = 0.99

# Fraction of each model's finished requests that do not end in error (`vllm:request_success`
# with `finished_reason="error"`, which vLLM has from 0.22.0; on an older pin the success alerts
# are said, not written).
slo_success_objective = 0.999

# The multiwindow burn-rate alerts of each SLO (`instinct-fleet targets --alerts`): each fires
# while the error budget burns `burn` times too fast over both `long` and `short`; every window
# must fit in `prometheus_retention` and `short` must be below `long` (`slo-window`).
slo_burn_alerts = [
    {"severity": "page", "burn": 14.4, "long": "1h", "short": "5m"},
    {"severity": "page", "burn": 6, "long": "6h", "short": "30m"},
    {"severity": "ticket", "burn": 1, "long": "3d", "short": "2h"},
]

# How long your Prometheus keeps samples (its `--storage.tsdb.retention.time`, 15d by default):
# a burn-rate window longer than it never fills.
prometheus_retention = "15d"

# How long an instance's `/metrics` target must be down before `VllmInstanceDown` pages (its
# Prometheus `for`): a restart of the roll or the watch takes less.
alert_down_for = "2m"

# Where Alertmanager delivers the fleet's alerts (a webhook receiver; `instinct-fleet targets
# --alertmanager` writes its config). `None`: no Alertmanager config.
alert_webhook_url = None

# Automatic re-admissions of a host's quarantined instances within `gpu_health_readmit_window`;
# once the evidence clears after that, they stay out until `instinct-fleet admit` (`quarantine-
# held`; the AMD GPU Operator's bound).
gpu_health_readmit_max = 3

# Seconds over which `gpu_health_readmit_max` is counted (15 minutes, as the AMD GPU Operator
# counts its remediations).
gpu_health_readmit_window = 900

# Another severity for a rule about what vLLM starts with, though not as you meant (it warns and
# ignores a variable, or emulates a format), as `{"env-unknown": "error"}`: an error stops the
# run before any connection. Only those rules: what vLLM refuses to start with is always an
# error.
validation_levels = {}

# Another severity for a `gpu-*` rule on these hosts, as `{"gpu-pcie-speed": "warning"}`: an
# error quarantines, a warning is shown, `off` is not judged.
gpu_health_levels = {}

# File on the host holding the Hugging Face token; it is mounted read-only and never put in a
# unit, env file or argv.
hf_token_path = "/etc/instinct-fleet/hf-token"

# Where the control machine reads the Hugging Face token: `env:NAME` (an environment variable of
# the deploy) or a file path (relative: to the project). The deploy then writes it to
# `hf_token_path` on every host, root's alone (0600), never through argv, a unit or a diff.
# `None`: the token file on each host is yours to place.
hf_token_source = None

# Root-only file on each host holding the API key vLLM then requires on its /v1 routes; mounted
# read-only and exported as VLLM_API_KEY inside the container just before `vllm serve`, so it
# never reaches a unit, argv, an env file or `docker inspect`. `None`: no key.
vllm_api_key_path = None

# Host directory mounted as the Hugging Face cache.
hf_cache_dir = "/var/lib/instinct-fleet/huggingface"

# Root of the compile and JIT caches kept on each host, one directory per image (VLLM_CACHE_ROOT
# for torch.compile and Triton, AITER_JIT_DIR, the TunableOp results), mounted at the same path
# inside the container: a cache copied between hosts stays valid only at the path it was built
# at.
compile_cache_dir = "/var/cache/instinct-fleet/compile"

# How many images' compile caches each host keeps: a unit's start removes the least recently
# used beyond this, never one a running container uses.
compile_cache_keep = 2

# In a roll, the first host that restarts a compile configuration sends its compile cache
# (checked, through the control machine) to the hosts that restart the same configuration, on
# the same image and GPU architecture, in later batches, so they start warm; the first Ray
# cluster's head sends to the later heads, its worker to their workers. `False`: every host
# compiles its own. One value for the whole fleet.
compile_cache_spread = True

# Seconds to wait for each instance's /health and /v1/models after a (re)start.
health_timeout = 1800

# Seconds any one command may take on a host before that host fails as hung (image pulls and
# health waits have their own limits).
command_timeout = 600

# Seconds the pull of the vLLM image (20+ GB) may take on a host.
image_pull_timeout = 3600

# Set kernel.numa_balancing=0 now and in /etc/sysctl.d (004:171, after AMD MAD).
tune_numa_balancing = True

# Add iommu=pt and pci=realloc=off to the kernel command line through a GRUB drop-in. No seed
# has this step: it comes from AMD's MI300X system optimization guide (ROCm documentation, GRUB
# settings), which the project follows.
tune_kernel_cmdline = True

# Reboot when the kernel command line changed; when False the deploy reports that a reboot is
# required.
tune_reboot = False

# Disable deep CPU C-states (cpupower idle-set -d 2) from a oneshot unit. Not in the seeds:
# AMD's MI300X system optimization guide (ROCm documentation), which the project follows.
tune_cpu_idle = True

# Locked-memory limit for dockerd and the vLLM containers: `True` is unlimited (RCCL pins
# buffers), a number is bytes, `False` leaves it alone.
tune_memlock = True

# System user that owns the service files; added to the render and video groups.
service_user = "vllm"

# Registry mirrors written to /etc/docker/daemon.json.
docker_registry_mirrors = []

# Registries dockerd may reach over plain HTTP (daemon.json).
docker_insecure_registries = []

# CA certificates of private registries: `{"registry.example:5000": "certs/ca.crt"}`, copied
# from the control machine to /etc/docker/certs.d/<registry>/ca.crt.
docker_registry_ca_certs = {}

# Path on the control machine (relative: to the project) to a docker config.json with registry
# credentials; copied to root's ~/.docker with mode 0600.
docker_credentials_file = None

# Name of the Ray cluster the host belongs to; the hosts that share it serve one multi-node vLLM
# instance (`vllm_nodes` of them).
ray_cluster = None

# `head` or `worker` within `ray_cluster`; exactly one head, which also runs the vLLM unit.
ray_role = None

# Every port Ray listens on, pinned so that the firewall can close them to non-members
# (`client_server` is Ray's fixed default); override single keys.
ray_ports = {
    "gcs": 6379,
    "object_manager": 8076,
    "node_manager": 8077,
    "client_server": 10001,
    "min_worker": 10002,
    "max_worker": 10999,
    "dashboard_agent_listen": 52365,
    "dashboard_agent_grpc": 52366,
    "metrics_export": 52367,
    "runtime_env_agent": 52368,
}

# Seconds the vLLM unit on the head waits for every node and GPU of the cluster to join Ray.
ray_ready_timeout = 600

# Interface RCCL and Gloo use between nodes (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME); its
# address becomes VLLM_HOST_IP and the Ray node IP. Required in a cluster.
cluster_nic = None

# RDMA NICs for RCCL, e.g. `"mlx5_0,mlx5_1"` (NCCL_IB_HCA); unset, RCCL falls back to TCP
# sockets.
nccl_ib_hca = None

# RoCE GID index (NCCL_IB_GID_INDEX), usually 3 for RoCE v2.
nccl_ib_gid_index = None

# GPUDirect RDMA level (NCCL_NET_GDR_LEVEL), e.g. 3 or `PHB`. 002:584 writes
# `RCCL_NET_GDR_LEVEL=2`; RCCL keeps NCCL's variable names and documents this one as
# NCCL_NET_GDR_LEVEL, so set 2 here to follow 002.
nccl_net_gdr_level = None

# NCCL_MIN_NCHANNELS in a cluster: more channels for MI300X collectives (002:17).
nccl_min_nchannels = 112

# Pass /dev/infiniband into the Ray and vLLM containers with the IPC_LOCK capability (RDMA).
infiniband = False

# Manage the nftables table `inet instinct_fleet`, which denies by default: only the ports the
# host serves are open, each to who needs it (SSH to `ssh_allow_from`, Ray and the collectives
# to cluster members, vLLM to `vllm_allow_from`, the router's clients to `router_allow_from`,
# its worker API to its pools' serving hosts and `router_admin_from`), and every other port, one
# opened at run time included, is closed.
firewall = True

# Addresses or networks allowed to reach SSH (the port sshd answers the deploy on) when the
# firewall is on; `None`: anyone, so that no firewall change can lock a team out. Set it to your
# control machines and bastions.
ssh_allow_from = None

# Addresses or networks allowed to reach the vLLM ports (`["10.0.0.0/8"]`), besides loopback and
# cluster members; `None` leaves them open.
vllm_allow_from = None

# Address other machines reach this host at: Prometheus scrapes its vLLM `/metrics` and exporter
# there (`instinct-fleet targets`), and `instinct-fleet bench --client` sends load there; `None`
# uses `ssh_hostname`, else the inventory name.
scrape_address = None

# Addresses or networks of the Prometheus servers allowed to scrape the vLLM `/metrics` ports
# and the device metrics exporter, when the firewall is on; `None` adds no rule.
prometheus_allow_from = None

# Run AMD's device-metrics-exporter as the systemd unit `amd-metrics-exporter.service` (GPU
# utilisation, power, temperatures, VRAM, ECC).
metrics_exporter = False

# The device-metrics-exporter image, pinned like the vLLM image.
metrics_exporter_image = "rocm/device-metrics-exporter:v1.2.0"

# Port the exporter serves `/metrics` on (its config file's `ServerPort`).
metrics_exporter_port = 5000

# The exporter's `GPUConfig.Fields`: which GPU metrics it exports (names as in its
# documentation, for example `GPU_GFX_ACTIVITY` becomes `gpu_gfx_activity`).
metrics_exporter_fields = [
    "GPU_GFX_ACTIVITY",
    "GPU_UMC_ACTIVITY",
    "GPU_PACKAGE_POWER",
    "GPU_JUNCTION_TEMPERATURE",
    "GPU_HBM_TEMPERATURE",
    "GPU_USED_VRAM",
    "GPU_TOTAL_VRAM",
    "GPU_ECC_UNCORRECT_TOTAL",
    "GPU_MEMORY_TEMPERATURE",
    "PCIE_SPEED",
    "PCIE_MAX_SPEED",
    "PCIE_RECOVERY_COUNT",
]

# Run the watch on every serving host (`instinct-fleet-watch.service`): it reads each instance's
# `/metrics` every `watch_interval` seconds, and an instance with requests running or waiting
# whose engine steps stop for `watch_stall_seconds` is taken out of its router pools, restarted
# and put back once its gate passes (docs/rolling.md, Live engines).
watch = True

# Port of the watch's read-only state (`/state`, JSON) and Prometheus `/metrics`; the firewall
# lets in exactly who may reach the vLLM ports.
watch_port = 9401

# Seconds between two readings of an instance's step counters; must be below
# `watch_stall_seconds`.
watch_interval = 5

# Seconds an instance with requests running or waiting may go without one engine step before the
# watch restarts it; must exceed the instance's longest step (a whole `--max-num-batched-tokens`
# prefill, or `--max-model-len` with chunked prefill off, at `watch_prefill_tokens_per_second`).
watch_stall_seconds = 60

# Prompt tokens per second one instance prefills at the least, for the check of
# `watch_stall_seconds` against its longest engine step; `None`: estimated from the model's size
# in its name (`...-70B-...`) as the instance's GPUs x 250 TFLOP/s (a fifth of an MI300X's dense
# FP16 peak) over 2 FLOPs per parameter and token, and not checked for a name without a size.
watch_prefill_tokens_per_second = None

# Restarts of one instance the watch makes within `watch_restart_window`; a stall after that
# leaves the instance out of its pools, running, until an operator re-admits it
# (docs/rolling.md, Live engines).
watch_max_restarts = 3

# Seconds over which `watch_max_restarts` is counted (the AMD GPU Operator's bound: 3
# remediations per 15 minutes).
watch_restart_window = 900

# Seconds between two readings of the GPUs' amd-smi evidence by the watch (with `gpu_health`):
# an error on a GPU quarantines its instances at once, between deploys (AMD's device metrics
# exporter checks every 30 s; docs/gpu-health.md).
watch_gpu_interval = 30

# A directory on every host holding a Hugging Face cache (`hub/models--org--name`), typically a
# shared mount: each model is copied from it into `hf_cache_dir` before its first start. `None`:
# vLLM downloads on first start.
weights_source = None

# With `weights_source`: a model missing there is downloaded into it once, by one host, from the
# instance's image; `False` fails such hosts instead (a fleet without internet access).
weights_download = True

# Your own `instinct-fleet bench` profiles beside the built-in ones, e.g. `{"long-ctx":
# {"input_len": 32768, "output_len": 512, "num_prompts": 40, "concurrency": [4]}}`.
bench_profiles = {}

# Serving units (a single-node host, or a whole Ray cluster) that may restart at once during a
# re-tune: a number, or a percentage of the fleet's serving units such as `"25%"`. One value for
# the whole fleet.
rolling_batch = 1

# Batches that may fail their health gate before the roll stops; the units not yet rolled keep
# their old configuration. One value for the whole fleet.
rolling_max_failures = 0

# What a batch that fails does: `"rollback"` puts its units back to their last healthy
# generation (unit and env files, byte for byte), gates them again, then stops the roll;
# `"stop"` leaves them as they failed. Either way the run exits non-zero.
rolling_on_failure = "rollback"

# Generations (the serving unit and env files a host ran) each host keeps under
# /var/lib/instinct-fleet/generations, besides the last healthy one; `instinct-fleet rollback`
# and `rolling_on_failure` go back to them.
rolling_keep_generations = 3

# A bench profile (built-in or from `bench_profiles`) that makes a re-tune's first restart batch
# one canary serving unit (the smallest, first by name), benchmarked before it stops and after
# its gate, and asked the accuracy probe (`canary_accuracy`). The built-in `canary` (16 prompts
# of 512 tokens, 64 out, 4 at a time) is sized down to an instance's `--max-model-len`. `None`:
# no canary, a warning in `plan`. One value for the whole fleet.
canary_profile = "canary"

# Percent by which the canary's output throughput may fall, or its median TPOT or median TTFT
# rise, before it can count as a regression; it counts only when the change is also beyond
# `canary_floors` and beyond the noise of the repeated runs (`canary_alpha`). A regression is a
# failed batch (rolled back with `rolling_on_failure`, and the roll stops).
canary_max_regression = 10

# The smallest change of each canary figure that counts, whatever its percentage:
# `output_throughput` (tok/s), `median_tpot_ms`, `median_ttft_ms`; override single keys.
canary_floors = {"output_throughput": 10.0, "median_tpot_ms": 0.5, "median_ttft_ms": 2.0}

# Runs of the canary profile before and after the change. Every run is kept; the figures
# compared are the medians over the runs, and the run is the unit of the noise test
# (`canary_alpha`), so one run a side gives no verdict beyond inconclusive. Three tell a 1.5x
# slowdown up to 5% run-to-run variation and a 4x one up to 15%; more tell smaller changes on
# noisier hosts.
canary_runs = 3

# Requests sent to each canary instance before its measured runs, before and after the change,
# whose results are discarded: the first requests after a restart are slow for reasons the
# change does not cause. 0: none.
canary_warmup = 8

# The most often a harmless change may be judged a regression by the noise test: split evenly
# over the three figures judged (Bonferroni), each a one-sided Student's t-test on the
# logarithms of the runs' figures, with a Mann-Whitney U test over the requests as a second
# condition where vLLM recorded them. `tune` splits it over the points it picks the best of.
canary_alpha = 0.01

# What a canary does whose figures moved beyond `canary_max_regression` and `canary_floors` but
# not beyond the noise: `"proceed"` rolls on and says so in the summary; `"rollback"` treats it
# as a regression.
canary_inconclusive = "proceed"

# Every canary also asks the accuracy probe of each canary instance, before the change and after
# its gate: greedy answers (temperature 0, seed 0) through the OpenAI API, checked item by item;
# a paired loss beyond `canary_probe_floor` and `canary_probe_alpha` is a failed batch, as a
# speed regression is. `False`: speed only.
canary_accuracy = True

# Your own golden prompts: a JSONL file on the control machine (relative to the project), one
# `{"prompt": ..., "answer": "42"}` (the last number of the reply must equal it) or `{"prompt":
# ..., "pattern": "regex"}` per line; `None`: the built-in set of 250 arithmetic items
# (instinct_fleet/model/probe.py).
canary_probe = None

# Items of the probe asked on each side of the change (the first of the set; all of them when
# the set is smaller).
canary_probe_size = 200

# Points of accuracy (percent of the items) the probe may lose before the loss can count,
# whatever its significance.
canary_probe_floor = 2.0

# Significance level of the probe's paired test for the whole canary, split evenly over its
# instances (Bonferroni: each of two instances is judged at half of it): an exact one-sided
# McNemar test on the items right before and wrong after against the reverse. A loss beyond the
# floor but not significant is inconclusive (`canary_inconclusive`).
canary_probe_alpha = 0.001

# `max_tokens` of each probe request: enough for the model to reach its final number (a
# reasoning model thinks first); a reply cut short is simply wrong on both sides.
canary_probe_max_tokens = 512

# Seconds a stopping instance gets to finish in-flight requests: vLLM's `--shutdown-timeout`
# where the pinned version has it, and the `docker stop` grace (plus 30 s) in any case.
rolling_drain_timeout = 60

# Hook before a serving unit's instances stop, to take them out of a load balancer: `{"host":
# "cmd"}` runs on the serving host, `{"control": "cmd"}` on the machine running the deploy. The
# command sees INSTINCT_FLEET_HOST, INSTINCT_FLEET_UNITS and INSTINCT_FLEET_PORTS; a failure
# stops that unit's roll.
rolling_pre_stop = None

# Run vLLM's router (`vllm-router`) on this host, one systemd unit per pool: every serving
# instance of the pool's model in the inventory (single-node, or a cluster's head) behind one
# address. Put it in `group_data/routers.py` for a router group. The roll takes a unit out of
# every pool before it stops and puts it back after its health gate.
router = False

# The pinned `vllm-router` release: the controller downloads its wheel once (or reads
# `router_wheel`), checks its sha256 against the shipped table, and copies the router's files to
# router hosts, which need Python 3 but no package index.
router_version = "0.1.17"

# Path on the controller to the `vllm-router` wheel of `router_version` (a controller without
# index access); `None`: pip downloads it into `~/.cache/instinct-fleet/wheels`.
router_wheel = None

# Served model names this router has a pool for, one unit each, the first on `router_port` and
# `router_metrics_port`, the next on each plus one, and so on; `None`: every model the inventory
# serves, in name order.
router_models = None

# Port of the first pool's router for its clients (the router's own default): a front that
# passes on the OpenAI routes (`/v1/completions`, `/v1/chat/completions`, `/v1/embeddings`,
# `/v1/responses`, `/v1/rerank`, `/v1/models`) and `/health`, and answers 404 to any other, the
# router's worker API above all (`router_admin_port`).
router_port = 30000

# Port of the first pool's router itself, the next pool's on this plus one, and so on: its
# worker API (`/add_worker`, `/remove_worker`, `/list_workers`, ...) and every other route.
# vllm-router checks no key there, so clients never reach it: `router_port` is a front that
# passes on the OpenAI routes alone, and the firewall keeps this port to loopback, the serving
# hosts of its pool (their roll and watch take an instance out and put it back) and
# `router_admin_from`.
router_admin_port = 31000

# Addresses or networks, besides loopback and the serving hosts of the pools, allowed to reach
# `router_admin_port` (an operator's machine that calls the worker API); empty: nobody else.
router_admin_from = []

# Port of the first pool's router Prometheus `/metrics` (`--prometheus-port`); the router's own
# default.
router_metrics_port = 29000

# `--policy`: how the router picks an instance (checked against the pinned router's choices:
# `round_robin`, `power_of_two`, `cache_aware`, `consistent_hash`, ...).
router_policy = "cache_aware"

# `--health-check-interval-secs`: seconds between the router's health checks of each instance;
# with `router_health_failure_threshold` it bounds how long a dead instance still gets requests.
router_health_check_interval = 5

# `--health-failure-threshold`: failed checks in a row before the router stops sending to an
# instance.
router_health_failure_threshold = 2

# `--health-success-threshold`: passed checks in a row before an instance gets requests again.
router_health_success_threshold = 2

# `--retry-max-retries`: attempts the router makes on other instances when one fails a request
# before it answers.
router_retries = 5

# `--request-timeout-secs`: the longest a request may take through the router.
router_request_timeout = 1800

# Addresses or networks of the router's clients: they alone reach `router_port` (the OpenAI
# routes) and `router_metrics_port` (also open to `prometheus_allow_from`); `None`: clients from
# anywhere. Never the worker API, which is on `router_admin_port`. The router checks no key: the
# instances behind it do.
router_allow_from = None

# Any other `vllm-router` option, as `{"--cache-threshold": 0.5}` (a switch as `True`), checked
# against the pinned router's own CLI. `--api-key` is refused: the router passes a client's
# `Authorization` header on to the instances, so clients of instances with `vllm_api_key_path`
# send that key to the router.
router_flags = {}

# Hook after a serving unit's instances passed health, to put them back in a load balancer; same
# form and variables as `rolling_pre_stop`.
rolling_post_start = None
