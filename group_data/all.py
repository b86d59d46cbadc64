"""Fleet-wide defaults: every instinct-fleet variable, at its default.

pyinfra reads this file for every host; group files (group_data/<group>.py) and
host data in the inventory override it. The README table lists the same
variables; instinct_fleet/defaults.py is where their defaults are defined.
"""

# Built-in recipe each instance starts from (`instinct-fleet recipes` lists them); `None` starts
# from nothing but `vllm_model`, `vllm_env` and `vllm_args`.
vllm_recipe = "gpt-oss-120b"

# vLLM ROCm container image, pinned by tag or digest; `latest` and untagged names are refused.
vllm_image = "vllm/vllm-openai-rocm:v0.22.0"

# vLLM version inside `vllm_image`; selects the table of env vars and flags that validation
# checks against.
vllm_version = "0.22.0"

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

# Size of /dev/shm in the vLLM container (`docker run --shm-size`); RCCL uses it for rendezvous.
vllm_shm_size = "16g"

# File on the host holding the Hugging Face token; it is mounted read-only and never put in a
# unit, env file or argv.
hf_token_path = "/etc/instinct-fleet/hf-token"

# Host directory mounted as the Hugging Face cache.
hf_cache_dir = "/var/lib/instinct-fleet/huggingface"

# Seconds to wait for each instance's /health and /v1/models after a (re)start.
health_timeout = 1800

# Set kernel.numa_balancing=0 now and in /etc/sysctl.d (004, AMD MAD).
tune_numa_balancing = True

# Add iommu=pt and pci=realloc=off to the kernel command line through a GRUB drop-in.
tune_kernel_cmdline = True

# Reboot when the kernel command line changed; when False the deploy reports that a reboot is
# required.
tune_reboot = False

# Disable deep CPU C-states (cpupower idle-set -d 2) from a oneshot unit.
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

# Path on the control machine to a docker config.json with registry credentials; copied to
# root's ~/.docker with mode 0600.
docker_credentials_file = None
