"""Validation: every rule of :mod:`instinct_fleet.model.rules`, run before any connection.

Functions here only read typed specs and return findings; they never raise on
bad input, so the CLI and the deploy can always print a message instead of a
traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from pydantic import BaseModel

from instinct_fleet.model import knowledge, liveness, probe, secrets, startup, workload
from instinct_fleet.model.crosscheck import member, unpinned_image, validate_crossings
from instinct_fleet.model.defaults import default_image, duration_seconds, tag_version
from instinct_fleet.model.inputs import validate_inputs
from instinct_fleet.model.knowledge import TTFT
from instinct_fleet.model.launch import TRUE
from instinct_fleet.model.rules import Finding, finding
from instinct_fleet.model.spec import HostSpec, ServiceSpec

QUICK_REDUCE_LEVELS = ("NONE", "FP", "INT8", "INT6", "INT4")
POSITIVE_INT_FLAGS = (
    "max-model-len",
    "max-num-seqs",
    "max-num-batched-tokens",
    "tensor-parallel-size",
    "pipeline-parallel-size",
    "data-parallel-size",
    "block-size",
)
HUMAN_INT = re.compile(r"^[1-9][0-9]*[kKmMgG]?$")
OBJECT_SHAPED = re.compile(r"(?s)^\s*{.*}\s*$")  # what vLLM's union_dict_and_str hands to json.loads
MANAGED_ENV = {"CUDA_VISIBLE_DEVICES": "gpus", "ROCR_VISIBLE_DEVICES": "gpus"}
# Set from compile_cache_dir (render.compile_cache_env): a second value would split the cache from its mount.
CACHE_ENV = ("VLLM_CACHE_ROOT", "AITER_JIT_DIR", "PYTORCH_TUNABLEOP_FILENAME")
MANAGED_FLAGS = {"port": "port", "model": "model"}
XGMI_ISLAND = 8
GPU_MEMORY_HIGH = 0.95  # 000:73: "0.95+ on MI300X with AITER active can trigger OOM"


def check_image(host: str | None, image: str, version: str) -> list[Finding]:
    unpinned = unpinned_image(host, "vllm_image", image, default_image(version))
    if unpinned:
        return unpinned
    named = tag_version(image)
    if named is not None and named != version:
        # Set both and different: the checks would read one version's table while the image runs another's.
        said = finding(
            "image-version-mismatch",
            host,
            "vllm_version",
            f"is {version!r} but vllm_image {image!r} runs vLLM {named}: remove vllm_version (the image's tag decides it) or make the two agree",
        )
        return [dataclasses.replace(said, also=("vllm_image",))]
    return []


def _env_findings(svc: ServiceSpec, table: knowledge.VllmKnowledge | None) -> list[Finding]:
    found: list[Finding] = []
    host, key = svc.host, f"{svc.name}.env"
    _, removed_env = knowledge.replacements()
    for name in svc.env:
        if name == "HIP_VISIBLE_DEVICES":
            found.append(
                finding("hip-visible-devices", host, f"{key}.{name}", "remove it; the instance's GPUs come from vllm_instances[].gpus")
            )
        elif name in MANAGED_ENV:
            found.append(finding("managed-key", host, f"{key}.{name}", f"set vllm_instances[].{MANAGED_ENV[name]} instead"))
        elif name in CACHE_ENV:
            found.append(finding("managed-key", host, f"{key}.{name}", "set compile_cache_dir instead: each image's caches live under it"))
        elif table is not None and name in table.env_unread:
            found.append(
                finding(
                    "env-unread",
                    host,
                    f"{key}.{name}",
                    f"vLLM {table.version} defines it but no code reads it, so it has no effect{_unread_hint(name)}",
                )
            )
        elif name.startswith("VLLM_") and table is not None and name not in table.env_vars:
            # vLLM warns and starts (envs.py), unless the instance asks it to refuse (--fail-on-environ-validation).
            refuses = svc.args.get("fail-on-environ-validation") is True
            if name in removed_env:
                r = removed_env[name]
                said = f"vLLM {table.version} does not read it ({r.why}); use {r.replacement}"
            else:
                close = table.suggest_env(name)
                said = f"vLLM {table.version} does not know this variable" + (f"; did you mean {' or '.join(close)}?" if close else "")
            if refuses:
                found.append(
                    finding("env-refused", host, f"{key}.{name}", f"{said}. With --fail-on-environ-validation it refuses to start")
                )
            else:
                rule = "env-removed" if name in removed_env else "env-unknown"
                found.append(finding(rule, host, f"{key}.{name}", f"{said}. It starts and ignores it, with a warning"))
    level = svc.env.get("VLLM_ROCM_QUICK_REDUCE_QUANTIZATION")
    if level is not None and level not in QUICK_REDUCE_LEVELS:
        found.append(
            finding(
                "value-domain",
                host,
                f"{key}.VLLM_ROCM_QUICK_REDUCE_QUANTIZATION",
                f"{level!r} is not one of {', '.join(QUICK_REDUCE_LEVELS)}",
            )
        )
    if svc.env.get("VLLM_ROCM_USE_AITER") not in TRUE:
        for name in svc.env:
            if name.startswith("VLLM_ROCM_USE_AITER_"):
                found.append(
                    finding(
                        "aiter-subflag-inert",
                        host,
                        f"{key}.{name}",
                        "has no effect while VLLM_ROCM_USE_AITER is not 1; set the master switch or drop it",
                    )
                )
    for unified in ("VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION", "VLLM_USE_AITER_UNIFIED_ATTENTION"):
        if table is not None and unified not in table.env_vars - table.env_unread:
            continue  # env-removed or env-unread already says it does nothing
        if svc.env.get(unified) in TRUE and svc.env.get("VLLM_ROCM_USE_AITER_MHA") != "0":
            found.append(
                finding(
                    "unified-attention-needs-mha-off",
                    host,
                    f"{key}.{unified}",
                    "also set VLLM_ROCM_USE_AITER_MHA=0, or unified attention never activates",
                )
            )
    if level not in (None, "NONE") and svc.world_size == 1:
        found.append(
            finding(
                "quick-reduce-tp1",
                host,
                f"{key}.VLLM_ROCM_QUICK_REDUCE_QUANTIZATION",
                "this instance runs on one GPU: no all-reduce happens, so quick reduce does nothing; drop it",
            )
        )
    if "NCCL_MIN_NCHANNELS" in svc.env and svc.world_size == 1:
        found.append(finding("nccl-single-gpu", host, f"{key}.NCCL_MIN_NCHANNELS", "this instance runs on one GPU; drop it"))
    return found


UNREAD_HINTS = {
    "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION": "--attention-backend ROCM_AITER_UNIFIED_ATTN",
}


def _unread_hint(name: str) -> str:
    return f"; use {UNREAD_HINTS[name]}" if name in UNREAD_HINTS else "; drop it"


def _flag_findings(svc: ServiceSpec, table: knowledge.VllmKnowledge | None) -> list[Finding]:
    found: list[Finding] = []
    host, key = svc.host, f"{svc.name}.args"
    removed_flags, _ = knowledge.replacements()
    for flag, value in svc.args.items():
        where = f"{key}.--{flag}"
        if flag in MANAGED_FLAGS:
            found.append(finding("managed-key", host, where, f"set vllm_instances[].{MANAGED_FLAGS[flag]} instead"))
            continue
        if table is None:
            continue
        if f"--{flag}" not in table.flags:
            gone = table.removed(flag, removed_flags)
            if gone is not None:
                name, r = gone
                found.append(
                    finding("flag-removed", host, where, f"--{name} is not in vLLM {table.version} ({r.why}); use {r.replacement}")
                )
            else:
                close = table.suggest_flag(flag)
                hint = f"; did you mean {' or '.join('--' + c for c in close)}?" if close else ""
                found.append(finding("flag-unknown", host, where, f"vLLM {table.version} has no such flag{hint}"))
            continue
        spec = table.flag(flag)
        if isinstance(value, bool) and spec.kind not in ("bool", "switch", "optional_value"):
            found.append(finding("flag-not-boolean", host, where, f"takes a value, not {str(value).lower()}"))
        elif spec.kind in ("bool", "switch") and not isinstance(value, bool):
            found.append(finding("value-domain", host, where, f"is a switch: use true or false, not {value!r}"))
        elif isinstance(value, str) and knowledge.is_option(value):
            why = f"vLLM's argparse reads {value!r} as another option, so --{flag} would get no value and vLLM would not start"
            found.append(finding("value-domain", host, where, why))
        elif spec.choices and not spec.accepts(str(value)):
            found.append(finding("value-domain", host, where, _not_a_choice(str(value), spec, table.version)))
        elif spec.json_fields is not None and not isinstance(value, bool):
            found += _json_config_findings(host, where, str(value), spec.json_fields, table.version)
        elif spec.json is not None and not isinstance(value, bool) and (spec.json == "object" or OBJECT_SHAPED.match(str(value))):
            # A dict flag: argparse's json.loads, or, where a string is also allowed (union_dict_and_str), for a
            # value shaped {...}; any other such value is kept as that string.
            why = _json_object(str(value))[1]
            if why:
                found.append(finding("value-domain", host, where, why))
    return found


def _json_object(value: str) -> tuple[dict[str, object], str]:
    """A dict flag's value as vLLM's argparse reads it, with json.loads; the why ("" when it is a JSON object)."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        return {}, f"is not valid JSON ({exc.msg} at character {exc.pos}): {value!r}"
    if not isinstance(parsed, dict):
        return {}, f'must be a JSON object such as {{"key": value}}, got {value!r}'
    return parsed, ""


def _not_a_choice(value: str, spec: knowledge.Flag, version: str) -> str:
    close = difflib.get_close_matches(value.upper() if spec.upper_case else value, spec.choices, n=2)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    shown = ", ".join(spec.choices) if len(spec.choices) <= 12 else f"{', '.join(spec.choices[:12])}, ... ({len(spec.choices)} in all)"
    return f"{value!r} is not a choice in vLLM {version}{hint} Choices: {shown}"


def _json_config_findings(host: str | None, where: str, value: str, fields: dict[str, knowledge.Flag], version: str) -> list[Finding]:
    """A JSON config flag: vLLM parses it into a config that forbids unknown keys, nested configs included, at start-up."""
    parsed, why = _json_object(value)
    if why:
        return [finding("value-domain", host, where, why)]
    return _json_keys(host, where, parsed, fields, version)


def _json_keys(host: str | None, where: str, parsed: dict[str, object], fields: dict[str, knowledge.Flag], version: str) -> list[Finding]:
    found: list[Finding] = []
    for key, item in parsed.items():
        field = fields.get(key)
        if field is None:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            found.append(finding("value-domain", host, f"{where}.{key}", f"vLLM {version} has no such key{hint}"))
        elif field.json_fields is not None and isinstance(item, dict):
            found += _json_keys(host, f"{where}.{key}", item, field.json_fields, version)
        elif field.choices and isinstance(item, str) and not field.accepts(item):
            found.append(finding("value-domain", host, f"{where}.{key}", _not_a_choice(item, field, version)))
    return found


def _domain_findings(svc: ServiceSpec) -> list[Finding]:
    found: list[Finding] = []
    host, key = svc.host, f"{svc.name}.args"
    for flag in POSITIVE_INT_FLAGS:
        if flag in svc.args:
            value = svc.args[flag]
            ok = (isinstance(value, int) and not isinstance(value, bool) and value > 0) or (
                isinstance(value, str) and bool(HUMAN_INT.match(value))
            )
            if not ok:
                found.append(finding("value-domain", host, f"{key}.--{flag}", f"must be a positive integer, got {value!r}"))
    if "gpu-memory-utilization" in svc.args:
        raw = svc.args["gpu-memory-utilization"]
        try:
            util = float(raw) if not isinstance(raw, bool) else float("nan")
        except ValueError:
            util = float("nan")
        if not 0 < util <= 1:
            found.append(finding("value-domain", host, f"{key}.--gpu-memory-utilization", f"must be in (0, 1], got {raw!r}"))
        elif util >= GPU_MEMORY_HIGH and svc.env.get("VLLM_ROCM_USE_AITER") in TRUE:
            found.append(
                finding(
                    "gpu-memory-high",
                    host,
                    f"{key}.--gpu-memory-utilization",
                    f"{util} with AITER on: 000:73 finds 0.95+ can OOM when AITER's workspace spikes during concurrent large prefills; "
                    "0.92 is its aggressive but stable value",
                )
            )
    if not 0 < svc.port < 65536:
        found.append(finding("value-domain", host, f"{svc.name}.port", f"must be 1-65535, got {svc.port}"))
    return found


def _parallel_findings(svc: ServiceSpec, gpu_count: int, table: knowledge.VllmKnowledge | None) -> list[Finding]:
    found: list[Finding] = []
    host, key = svc.host, f"{svc.name}"
    tp, pp, dp = (svc.size(f) for f in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"))
    shape = f"TP {tp} x PP {pp} x DP {dp} = {svc.world_size}"
    if svc.nodes == 1 and svc.world_size != len(svc.gpus):
        found.append(
            finding(
                "parallel-size",
                host,
                f"{key}.gpus",
                f"{shape} but the instance has {len(svc.gpus)} GPU(s) {list(svc.gpus)}"
                + (
                    f"; the host has {gpu_count}, so this needs vllm_nodes={-(-svc.world_size // gpu_count)}"
                    if svc.world_size > gpu_count
                    else ""
                ),
            )
        )
    elif svc.nodes > 1 and svc.world_size != svc.nodes * gpu_count:
        found.append(
            finding(
                "parallel-size",
                host,
                f"{key}.args",
                f"{shape} but the cluster has {svc.nodes} nodes x {gpu_count} GPUs = {svc.nodes * gpu_count}",
            )
        )
    if tp > XGMI_ISLAND:
        found.append(
            finding(
                "tp-beyond-xgmi",
                host,
                f"{key}.args.--tensor-parallel-size",
                f"TP {tp} spans more than one 8-GPU XGMI island; use TP 8 with PP across nodes",
            )
        )
    bad = [g for g in svc.gpus if not 0 <= g < gpu_count]
    if bad:
        found.append(finding("gpu-out-of-range", host, f"{key}.gpus", f"{bad} not in 0..{gpu_count - 1} (gpu_count={gpu_count})"))
    if dp > 1 and table is not None:
        missing = []
        if "--disable-nccl-for-dp-synchronization" in table.flags and svc.args.get("disable-nccl-for-dp-synchronization") is not True:
            missing.append("--disable-nccl-for-dp-synchronization")
        # allgather_reducescatter is the default of every supported version: only another choice is a problem.
        if "--all2all-backend" in table.flags:
            backend = svc.args.get("all2all-backend", table.flag("all2all-backend").default)
            if backend not in (None, "allgather_reducescatter"):
                missing.append("--all2all-backend allgather_reducescatter")
        elif svc.env.get("VLLM_ALL2ALL_BACKEND", "allgather_reducescatter") != "allgather_reducescatter":
            missing.append("VLLM_ALL2ALL_BACKEND=allgather_reducescatter")
        if missing:
            found.append(
                finding("dp-rocm-settings", host, f"{key}.args.--data-parallel-size", f"DP {dp} on ROCm also needs {' and '.join(missing)}")
            )
    return found


MAX_SPECULATIVE_TOKENS = 2  # 002:577: more draft tokens lower the acceptance rate and the throughput
AWQ_DTYPES = ("auto", "float16", "half")


def _quantization_findings(svc: ServiceSpec, table: knowledge.VllmKnowledge | None) -> list[Finding]:
    """Settings a quantization method or a draft model needs on ROCm (002:494, 002:579)."""
    found: list[Finding] = []
    host, key = svc.host, f"{svc.name}.args"
    if str(svc.args.get("quantization", "")).lower() == "awq":
        dtype = str(svc.args.get("dtype", "auto"))
        if dtype not in AWQ_DTYPES:
            found.append(
                finding(
                    "awq-rocm", host, f"{key}.--dtype", f"AWQ kernels take float16 activations: use --dtype auto or float16, not {dtype}"
                )
            )
        if svc.env.get("VLLM_USE_TRITON_AWQ") not in TRUE and (
            table is None or "VLLM_USE_TRITON_AWQ" not in table.quantization.rocm_sets_env
        ):
            found.append(
                finding("awq-rocm", host, f"{svc.name}.env.VLLM_USE_TRITON_AWQ", "set it to 1: ROCm runs AWQ with the Triton kernels")
            )
    raw = svc.args.get("speculative-config")
    if isinstance(raw, str):
        try:
            spec = json.loads(raw)
        except json.JSONDecodeError:
            spec = None  # a flag that does not parse is value-domain's business
        tokens = spec.get("num_speculative_tokens") if isinstance(spec, dict) else None
        if isinstance(tokens, int) and tokens > MAX_SPECULATIVE_TOKENS:
            found.append(
                finding(
                    "spec-tokens",
                    host,
                    f"{key}.--speculative-config.num_speculative_tokens",
                    f"{tokens} draft tokens: more tokens lower the acceptance rate and the throughput; keep it at {MAX_SPECULATIVE_TOKENS} or below",
                )
            )
    return found


def validate_service(svc: ServiceSpec, gpu_count: int, gpu_model: str) -> list[Finding]:
    table = svc.table  # None: reported once per host by spec.resolve_host
    return [
        *_env_findings(svc, table),
        *_flag_findings(svc, table),
        *_domain_findings(svc),
        *_quantization_findings(svc, table),
        *_parallel_findings(svc, gpu_count, table),
        *(startup.findings(svc, table, gpu_model) if table is not None else []),
    ]


def _utilization(svc: ServiceSpec) -> float | None:
    raw = svc.args.get("gpu-memory-utilization")
    try:
        return float(raw) if raw is not None and not isinstance(raw, bool) else None
    except ValueError:
        return None


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is no file on this machine, or None (a name the system refuses, too long, is a reason too)."""
    try:
        return None if path.is_file() else "does not exist on this machine"
    except OSError as exc:
        return f"is no path on this machine: {exc.strerror}"


def validate_local_files(spec: HostSpec) -> list[Finding]:
    """Files and secrets the deploy uploads must be readable on the control machine before any host is touched; a
    relative path is the project's, as the deploy reads it (HostSpec.local), wherever the command was started."""
    v = spec.vars
    wanted = [("docker_credentials_file", v.docker_credentials_file)]
    wanted += [(f"docker_registry_ca_certs.{registry}", path) for registry, path in sorted(v.docker_registry_ca_certs.items())]
    found = [
        finding("local-file", spec.host, key, f"{path!r} {problem} ({spec.local(path)})")
        for key, path in wanted
        if path is not None and (problem := _not_a_file(spec.local(path))) is not None
    ]
    _, wrong = secrets.hf_token(spec)
    if wrong is not None:
        found.append(finding("hf-token-source", spec.host, "hf_token_source", wrong))
    return found


def validate_network(spec: HostSpec) -> list[Finding]:
    """Cluster membership, RCCL settings, Ray ports and the vLLM allow-list of one host."""
    found: list[Finding] = []
    cluster = spec.cluster
    role = spec.vars.ray_role
    if cluster is None:
        if role is not None:
            found.append(
                finding(
                    "cluster-topology",
                    spec.host,
                    "ray_role",
                    f"ray_role is {role!r} but the host has no ray_cluster: set ray_cluster, or remove ray_role",
                )
            )
        return found
    if role is None:
        found.append(
            finding(
                "cluster-topology",
                spec.host,
                "ray_role",
                f"a member of ray_cluster {cluster.name!r} needs ray_role 'head' or 'worker'",
            )
        )
    if cluster.nic is None:
        found.append(
            finding("cluster-nic", spec.host, "cluster_nic", f"ray_cluster {cluster.name!r} needs cluster_nic, the interface between nodes")
        )
    if cluster.ib_hca is None:
        found.append(
            finding(
                "rccl-unset",
                spec.host,
                "nccl_ib_hca",
                f"ray_cluster {cluster.name!r} sets no nccl_ib_hca: RCCL will use TCP sockets on {cluster.nic or 'some interface'}",
            )
        )
    return found


def validate_clusters(specs: list[HostSpec]) -> list[Finding]:
    """The rules across the hosts of each Ray cluster, before any host is contacted."""
    found: list[Finding] = []
    members: dict[str, list[HostSpec]] = defaultdict(list)
    for spec in specs:
        cluster = spec.cluster
        if cluster is not None:
            members[cluster.name].append(spec)
        else:
            for svc in spec.services:
                if svc.nodes > 1:
                    found.append(
                        finding(
                            "cluster-topology",
                            spec.host,
                            "vllm_nodes",
                            f"{svc.name} spans {svc.nodes} nodes but the host is in no ray_cluster; put {svc.nodes} hosts in one",
                        )
                    )
    for name, hosts in sorted(members.items()):
        heads = [h for h in hosts if h.cluster is not None and h.cluster.role == "head"]
        listed = ", ".join(str(h.host) for h in hosts)
        if len(heads) != 1:
            for h in hosts:
                found.append(
                    finding("cluster-topology", h.host, "ray_role", f"ray_cluster {name!r} has {len(heads)} heads ({listed}); it needs one")
                )
            continue
        head = heads[0]
        if len(head.services) != 1:
            found.append(
                finding(
                    "cluster-topology",
                    head.host,
                    "vllm_instances",
                    f"the head of {name!r} runs one vLLM instance, not {len(head.services)}",
                )
            )
            continue
        svc = head.services[0]
        if svc.nodes != len(hosts):
            found.append(
                finding(
                    "cluster-topology",
                    head.host,
                    "vllm_nodes",
                    f"vllm_nodes is {svc.nodes} but ray_cluster {name!r} has {len(hosts)} hosts: {listed}",
                )
            )
        wanted = member(head)
        for other in hosts:
            mine = member(other)
            for key in wanted:
                if mine[key] != wanted[key]:
                    found.append(
                        finding(
                            "cluster-mismatch", other.host, key, f"{mine[key]!r} here, {wanted[key]!r} on the head {head.host} of {name!r}"
                        )
                    )
    return found


# The variables one roll reads for the whole fleet: its pace, the canary's measurement and verdict, and whether
# compile caches travel between its hosts.
ROLLING_FLEET_KEYS = (
    "rolling_batch",
    "compile_cache_spread",
    "rolling_max_failures",
    "rolling_on_failure",
    "canary_profile",
    "canary_max_regression",
    "canary_floors",
    "canary_runs",
    "canary_warmup",
    "canary_alpha",
    "canary_inconclusive",
    "canary_accuracy",
    "canary_probe",
    "canary_probe_size",
    "canary_probe_floor",
    "canary_probe_alpha",
    "canary_probe_max_tokens",
)


# The variables of the fleet's SLOs and their alerts (commands/slo.py): one objective per model, one rule file.
SLO_FLEET_KEYS = (
    "slo_ttft_seconds",
    "slo_ttft_objective",
    "slo_success_objective",
    "slo_burn_alerts",
    "prometheus_retention",
    "alert_down_for",
    "alert_webhook_url",
)


def _as_written(value: object) -> object:
    if isinstance(value, list):
        return [_as_written(item) for item in value]
    return value.model_dump() if isinstance(value, BaseModel) else value


def validate_rolling(specs: list[HostSpec]) -> list[Finding]:
    """One roll paces the whole fleet: hosts that disagree on its pace are named with the value most hosts have. A host
    with no instance (a router's, one on its way out) has no serving unit to roll: its settings are not the roll's."""
    return _one_value([s for s in specs if s.services or s.cluster is not None], ROLLING_FLEET_KEYS, "rolling-fleet")


def validate_slo_fleet(specs: list[HostSpec]) -> list[Finding]:
    """The fleet's SLOs and alert windows are one set: hosts that disagree are named with the value most hosts have."""
    return _one_value(specs, SLO_FLEET_KEYS, "slo-fleet")


def _one_value(specs: list[HostSpec], names: tuple[str, ...], rule: str) -> list[Finding]:
    found: list[Finding] = []
    for key in names:
        # A settings model (canary_floors) is compared and named as group_data writes it, a dict.
        written = {str(spec.host): _as_written(getattr(spec.vars, key)) for spec in specs}
        keys = {host: json.dumps(value, sort_keys=True) for host, value in written.items()}
        counts = Counter(keys.values())
        if len(counts) < 2:
            continue
        most = max(counts, key=lambda k: counts[k])
        common = next(written[host] for host, k in keys.items() if k == most)
        for spec in specs:
            value = written[str(spec.host)]
            if keys[str(spec.host)] != most:
                found.append(finding(rule, spec.host, key, f"{value!r} here, {common!r} on most hosts; one value for the fleet"))
    return found


def validate_canary(spec: HostSpec) -> list[Finding]:
    """``canary_profile`` names a profile every instance of this host can run (workload.jobs' own refusals), and the
    accuracy probe (the canary's, and ``bench --accuracy``'s) can be scored (probe.read's refusals)."""
    found = []
    name = spec.vars.canary_profile
    if name is None and spec.serves:
        found.append(
            finding(
                "canary-off",
                spec.host,
                "canary_profile",
                "no canary: a re-tune that slows the engine or corrupts its answers rolls through every batch unchecked; "
                "remove canary_profile = None to have the built-in canary",
            )
        )
    try:
        for svc in spec.serves if name is not None else ():
            workload.jobs(spec, svc, str(name), None, None)
    except workload.BenchRequestError as exc:
        found.append(finding("canary-profile", spec.host, "canary_profile", str(exc)))
    runs = spec.vars.canary_runs
    if name is not None and runs < 3 and spec.vars.canary_inconclusive == "proceed":
        said = "no slowdown can fail the canary" if runs == 1 else "few slowdowns fail the canary"
        found.append(
            finding(
                "canary-runs", spec.host, "canary_runs", f"{runs} run(s) a side: {said}; set 3 or more, or canary_inconclusive = 'rollback'"
            )
        )
    _, _, wrong = probe.of(spec)
    if wrong is not None:
        found.append(finding("canary-probe", spec.host, "canary_probe", wrong))
    return found


# A low estimate of what one GPU gives a prefill: a fifth of an MI300X's dense FP16 peak (1307 TFLOP/s).
PREFILL_FLOPS_PER_GPU = 250e12
_SIZE = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")


def prefill_estimate(svc: ServiceSpec) -> float | None:
    """Prompt tokens per second the instance prefills at the least: its GPUs' PREFILL_FLOPS_PER_GPU over 2 FLOPs per
    parameter and token, with the parameters read from the model's name (``Llama-3.1-70B``); None without a size there."""
    sizes = _SIZE.findall(svc.model.rsplit("/", 1)[-1])
    if not sizes or not svc.gpus or float(sizes[-1]) <= 0:  # no GPU (its own rule refuses it) or no size: no estimate
        return None
    return len(svc.gpus) * svc.nodes * PREFILL_FLOPS_PER_GPU / (2 * float(sizes[-1]) * 1e9)


def validate_watch(spec: HostSpec) -> list[Finding]:
    """The watch can judge this host's instances (liveness.series of the pinned vLLM's metrics), reads them more often
    than its stall window, and its window outlasts each instance's longest engine step at the stated prefill rate."""
    v = spec.vars
    if not v.watch or not spec.serves:
        return []
    if spec.table is None:  # a version deployed unvalidated (vllm_version_unvalidated): its metric names are unknown
        version = spec.vars.vllm_version
        why = (
            f"the watch reads the pinned vLLM's own metric names, and there is no table for vLLM {version}: extract it with "
            f"`instinct-fleet vllm-facts {version}`, or set watch = False"
        )
        return [finding("watch-metrics", spec.host, "watch", why)]
    if liveness.series(spec.table.metrics) is None:
        why = (
            f"the vLLM {spec.table.version} table lists no step counter or request gauges among its metrics, so the watch "
            f"cannot tell a hung engine from an idle one: re-extract it with `instinct-fleet vllm-facts {spec.table.version}`, or set watch = False"
        )
        return [finding("watch-metrics", spec.host, "watch", why)]
    found = []
    if v.watch_interval >= v.watch_stall_seconds:
        why = f"watch_interval {v.watch_interval} s is not below watch_stall_seconds {v.watch_stall_seconds} s: a stall would be seen one reading late or never"
        found.append(finding("watch-timing", spec.host, "watch_interval", why))
    for svc in spec.serves:
        tokens = startup.step_tokens(svc, spec.table, spec.gpu_model)
        rate = v.watch_prefill_tokens_per_second or prefill_estimate(svc)
        if tokens is None or not rate:
            continue
        longest = tokens / rate
        if longest >= v.watch_stall_seconds:
            said = "watch_prefill_tokens_per_second" if v.watch_prefill_tokens_per_second else "an estimate from the model's size"
            why = (
                f"instance {svc.name}'s longest engine step carries {tokens:g} prompt tokens (--max-num-batched-tokens, or "
                f"--max-model-len with chunked prefill off): about {longest:.0f} s at {rate:.0f} tokens/s ({said}), not below watch_stall_seconds {v.watch_stall_seconds} s, so the watch "
                f"may restart a healthy instance in the middle of one long prefill; raise watch_stall_seconds above {longest:.0f}, "
                "or state the model's own rate in watch_prefill_tokens_per_second"
            )
            found.append(finding("watch-stall-step", spec.host, "watch_stall_seconds", why))
    return found


def validate_gpu_health(spec: HostSpec) -> list[Finding]:
    """The GPU health thresholds hold together (each alone is bounded by its type)."""
    v = spec.vars
    if v.gpu_health and v.gpu_health_recovery_warning > v.gpu_health_recovery_error:
        why = (
            f"gpu_health_recovery_warning {v.gpu_health_recovery_warning} is above gpu_health_recovery_error "
            f"{v.gpu_health_recovery_error}: lower the warning bound, or raise the error bound"
        )
        return [finding("gpu-health-thresholds", spec.host, "gpu_health_recovery_warning", why)]
    return []


def validate_slo(spec: HostSpec) -> list[Finding]:
    """Each burn-rate window fits in Prometheus's retention and its short window is below its long one; the TTFT
    threshold is a bucket bound of every instance's ``vllm:time_to_first_token_seconds`` (its pinned vLLM's, or its
    ``--custom-histogram-buckets``), the only places Prometheus counts a request as in or over it."""
    v = spec.vars
    found: list[Finding] = []
    keep = duration_seconds(v.prometheus_retention)
    for i, alert in enumerate(v.slo_burn_alerts):
        if duration_seconds(alert.long) > keep:
            why = (
                f"slo_burn_alerts[{i}] ({alert.severity}, {alert.burn:g}x) reads {alert.long} of samples, more than "
                f"prometheus_retention {v.prometheus_retention} keeps: its window never fills; shorten it, or raise "
                "prometheus_retention with your Prometheus's --storage.tsdb.retention.time"
            )
            found.append(finding("slo-window", spec.host, "slo_burn_alerts", why))
        if duration_seconds(alert.short) >= duration_seconds(alert.long):
            why = (
                f"slo_burn_alerts[{i}] ({alert.severity}, {alert.burn:g}x): its short window {alert.short} is not below "
                f"its long window {alert.long}; the short one ends the alert soon after the burn stops (workbook: a twelfth of it)"
            )
            found.append(finding("slo-window", spec.host, "slo_burn_alerts", why))
    # (version, bounds, whether --custom-histogram-buckets set them, whether it could) -> the instances
    missed: dict[tuple[str, tuple[float, ...], bool, bool], list[str]] = defaultdict(list)
    for svc in spec.serves:
        if svc.table is None:
            continue
        ttft = svc.table.histograms.get(TTFT)
        if ttft is None:
            why = (
                f"the vLLM {svc.table.version} table gives no bucket bounds for {TTFT}, so a TTFT SLO cannot be checked "
                f"against them: re-extract it with `instinct-fleet vllm-facts {svc.table.version}`"
            )
            found.append(finding("slo-ttft-bucket", spec.host, "slo_ttft_seconds", why))
            continue
        custom = _custom_buckets(svc) or {}
        bounds = ttft.bounds(custom)
        if float(v.slo_ttft_seconds) not in bounds:
            missed[(svc.table.version, bounds, ttft.family in custom, ttft.family is not None)].append(svc.name)
    for (version, bounds, customized, replaceable), names in sorted(missed.items()):
        below = max((b for b in bounds if b < v.slo_ttft_seconds), default=None)
        above = min((b for b in bounds if b > v.slo_ttft_seconds), default=None)
        near = " and ".join(f"{b:g}" for b in (below, above) if b is not None)
        why = (
            f"slo_ttft_seconds {v.slo_ttft_seconds:g} is no bucket bound of {TTFT} for {', '.join(names)} (vLLM {version}"
            f"{', its --custom-histogram-buckets' if customized else ''}): Prometheus counts requests only at a bound, so that "
            f"SLO cannot be measured; the nearest bounds are {near}"
            + (", or add it to --custom-histogram-buckets' time_to_first_token list" if replaceable else "")
        )
        found.append(finding("slo-ttft-bucket", spec.host, "slo_ttft_seconds", why))
    return found


def _custom_buckets(svc: ServiceSpec) -> dict[str, list[float]] | None:
    """The instance's ``--custom-histogram-buckets`` as a mapping (group_data may write it as a dict or as JSON text);
    None when unset or not a mapping (the flag's own checks say so)."""
    raw = svc.args.get("custom-histogram-buckets")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict):
        return None
    return {str(k): [float(b) for b in v] for k, v in raw.items() if isinstance(v, list) and all(isinstance(b, int | float) for b in v)}


def validate_host(spec: HostSpec) -> list[Finding]:
    """All per-service rules plus the rules across the instances of one host."""
    found: list[Finding] = [
        *validate_inputs(spec),
        *validate_network(spec),
        *validate_local_files(spec),
        *validate_crossings(spec),
        *validate_canary(spec),
        *validate_watch(spec),
        *validate_gpu_health(spec),
        *validate_slo(spec),
    ]
    if spec.services:
        found += check_image(spec.host, spec.services[0].image, spec.services[0].version)
    for svc in spec.services:
        found += validate_service(svc, spec.gpu_count, spec.gpu_model)
    sharing: dict[int, list[ServiceSpec]] = defaultdict(list)
    for svc in spec.services:
        for gpu in svc.gpus:
            sharing[gpu].append(svc)
    for gpu, users in sorted(sharing.items()):
        if len(users) < 2:
            continue
        utils = [_utilization(u) for u in users]
        names = ", ".join(u.name for u in users)
        if any(u is None for u in utils):
            found.append(
                finding(
                    "gpu-overlap",
                    spec.host,
                    "vllm_instances",
                    f"GPU {gpu} is shared by {names}; give each a --gpu-memory-utilization or disjoint gpus",
                )
            )
        elif sum(u for u in utils if u is not None) > 1.0:
            found.append(
                finding(
                    "gpu-overlap",
                    spec.host,
                    "vllm_instances",
                    f"GPU {gpu} is shared by {names} whose --gpu-memory-utilization add up to more than 1.0",
                )
            )
    return found
