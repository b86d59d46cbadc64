"""Input safety: every class of wrong or hostile value is refused with the host, the key and the rule."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instinct_fleet.converge import content
from instinct_fleet.model import render
from instinct_fleet.model.inventory import HostData
from instinct_fleet.roll.plan import plan_inventory

from .conftest import check

G = {"vllm_recipe": "gpt-oss-120b"}
ROOT = Path(__file__).resolve().parents[2]

# (data, the key named, the rule)
BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"vllm_env": {"FOO": "1\nHF_TOKEN=stolen"}}, "vllm_env.FOO", "unsafe-value"),
    ({"vllm_model": "org/m\nExecStartPre=/bin/sh"}, "vllm_model", "unsafe-value"),
    ({"vllm_args": {"served-model-name": "a\rb"}}, "vllm_args.served-model-name", "unsafe-value"),
    ({"hf_cache_dir": "/data\nUser=root"}, "hf_cache_dir", "unsafe-value"),
    ({"vllm_args": {"served-model-name": "a\x85b"}}, "vllm_args.served-model-name", "unsafe-value"),
    ({"vllm_env": {"X": "a\u2028b"}}, "vllm_env.X", "unsafe-value"),
    ({"vllm_instances": [{"name": "main", "env": {"X": "\x00"}}]}, "vllm_instances[0].env.X", "unsafe-value"),
    ({"rolling_pre_stop": {"host": "drain\nrm -rf /"}}, "rolling_pre_stop.host", "unsafe-value"),
    ({"vllm_env": {"HF_TOKEN": "hf_abc"}}, "vllm_env.HF_TOKEN", "secret-inline"),
    ({"vllm_env": {"HUGGING_FACE_HUB_TOKEN": "hf_abc"}}, "vllm_env.HUGGING_FACE_HUB_TOKEN", "secret-inline"),
    ({"vllm_args": {"hf-token": "hf_abc"}}, "vllm_args.hf-token", "secret-inline"),
    ({"docker_registry_ca_certs": {"../../../root": str(ROOT / "README.md")}}, "docker_registry_ca_certs.../../../root", "value-format"),
    ({"hf_cache_dir": "hf-cache"}, "hf_cache_dir", "value-format"),
    ({"hf_token_path": "secrets/token"}, "hf_token_path", "value-format"),
    ({"hf_cache_dir": "/var/lib/../../etc"}, "hf_cache_dir", "value-format"),
    # docker's -v reads "/data:/etc" as a source and a target; $( and blanks would reach a shell, % systemd.
    ({"hf_cache_dir": "/data:/etc"}, "hf_cache_dir", "value-format"),
    ({"hf_token_path": "/etc/$(id)"}, "hf_token_path", "value-format"),
    ({"hf_token_path": "/etc/hf token"}, "hf_token_path", "value-format"),
    ({"vllm_api_key_path": "/etc/key;rm"}, "vllm_api_key_path", "value-format"),
    ({"weights_source": "/mnt/%h"}, "weights_source", "value-format"),
    ({"vllm_model": "/models/a`id`"}, "vllm_model", "value-format"),
    ({"docker_registry_mirrors": ["mirror.local:5000"]}, "docker_registry_mirrors[0]", "value-format"),
    ({"docker_insecure_registries": ["reg local"]}, "docker_insecure_registries[0]", "value-format"),
    ({"vllm_image": "Vllm/Vllm-openai-rocm:v0.22.0"}, "vllm_image", "value-format"),
    ({"vllm_image": "vllm/vllm-openai-rocm:v0.22.0 --privileged"}, "vllm_image", "value-format"),
    ({"vllm_image": "vllm/vllm-openai-rocm@sha256:xyz"}, "vllm_image", "value-format"),
    ({"vllm_model": ""}, "vllm_model", "value-format"),
    ({"vllm_model": "org/model name"}, "vllm_model", "value-format"),
    ({"vllm_model": "../../etc/passwd"}, "vllm_model", "value-format"),
    ({"vllm_args": {"shutdown-timeout": 900}}, "vllm_args.shutdown-timeout", "timeouts"),  # past command_timeout (600)
    ({"vllm_instances": [{"name": "main", "args": {"shutdown-timeout": 590}}]}, "vllm_instances[0].args.shutdown-timeout", "timeouts"),
    ({"bench_profiles": {"chat": {"dataset": "sharegpt"}}}, "bench_profiles.chat", "bench-profile"),
    ({"bench_profiles": {"chat": {"dataset_path": "/data/sharegpt.json"}}}, "bench_profiles.chat", "bench-profile"),
    (
        {"bench_profiles": {"chat": {"dataset": "sharegpt", "dataset_path": "/d/s.json", "input_len": 512}}},
        "bench_profiles.chat",
        "bench-profile",
    ),
    # Absent, --max-num-seqs is 1024 on an MI300X (vLLM 0.22.0's EngineArgs), above these batched tokens.
    (
        {"vllm_args": {"max-num-seqs": None, "enable-chunked-prefill": None, "max-num-batched-tokens": 512}},
        "main.args.--max-num-batched-tokens",
        "scheduler-batched-below-seqs",
    ),
    # Absent, --max-num-batched-tokens is 8192 there: below these sequences.
    ({"vllm_args": {"max-num-seqs": 16384}}, "main.args.--max-num-seqs", "scheduler-batched-below-seqs"),
    (
        {"vllm_args": {"cudagraph-capture-sizes": "[1, 2]", "compilation-config": '{"cudagraph_capture_sizes": [4]}'}},
        "main.args.--cudagraph-capture-sizes",
        "flag-config-exclusive",
    ),
    # Keys of JSON-config flags: --quantization-config's config (forward-referenced, beside a dict), and the
    # plain dict flags, which vLLM reads with json.loads.
    ({"vllm_args": {"quantization-config": '{"linaer": "fp8"}'}}, "main.args.--quantization-config.linaer", "value-domain"),
    ({"vllm_args": {"override-generation-config": "temperature=0.2"}}, "main.args.--override-generation-config", "value-domain"),
    ({"vllm_args": {"mm-processor-kwargs": "[1, 2]"}}, "main.args.--mm-processor-kwargs", "value-domain"),
    ({"vllm_args": {"additional-config": '{"a": }'}}, "main.args.--additional-config", "value-domain"),
    # The executor vLLM picks without --distributed-executor-backend: uni for one GPU, mp for more.
    ({"vllm_args": {"ray-workers-use-nsight": True}}, "main.args.--ray-workers-use-nsight", "executor-nsight-needs-ray"),
    (
        {"vllm_args": {"nnodes": 2, "data-parallel-size": 2, "data-parallel-backend": "ray"}, "gpu_count": 8},
        "main.args.--nnodes",
        "executor-nnodes-backend",
    ),
    ({"vllm_model": "org/team/model"}, "vllm_model", "value-format"),  # neither a repo id nor a path
    ({"vllm_model": "org/model--v2"}, "vllm_model", "value-format"),
    ({"vllm_model": "org/-model"}, "vllm_model", "value-format"),
    ({"vllm_model": "org/model.git"}, "vllm_model", "value-format"),
    ({"vllm_model": "./Meta-Llama-3-8B"}, "vllm_model", "value-format"),
    ({"vllm_model": "org/" + "m" * 97}, "vllm_model", "value-format"),
    ({"vllm_shm_size": "16g"}, "vllm_shm_size", "unknown-variable"),
    ({"service_user": "Root User"}, "service_user", "value-format"),
    ({"vllm_env": {"VLLM_ROCM_USE_AITER": "yes"}}, "vllm_env.VLLM_ROCM_USE_AITER", "value-format"),
    ({"gpu_model": "MI250X"}, "gpu_model", "value-format"),
    (
        {"vllm_env": {"vllm_rocm_use_aiter": "1"}, "validation_levels": {"env-unknown": "error"}},
        "vllm_env.vllm_rocm_use_aiter",
        "env-unknown",
    ),
    ({"gpu_count": 0}, "gpu_count", "value-format"),
    ({"gpu_count": 4096}, "gpu_count", "value-format"),
    ({"gpu_count": "8"}, "gpu_count", "schema"),
    ({"tune_numa_balancing": "yes"}, "tune_numa_balancing", "schema"),
    ({"vllm_instances": [{"name": "a", "model": "org/m x"}]}, "vllm_instances[0].model", "value-format"),
    ({"vllm_instances": [{"name": "a", "port": 70000}]}, "vllm_instances[0].port", "value-format"),
    ({"vllm_instances": [{"name": "Main"}]}, "vllm_instances[0].name", "value-format"),
    ({"vllm_instances": [{"name": "a", "gpu": [0]}]}, "vllm_instances[0].gpu", "unknown-variable"),
    ({"rolling_pre_stop": "drain.sh"}, "rolling_pre_stop", "schema"),
    ({"scrape_address": "10.0.0.1; reboot"}, "scrape_address", "value-format"),
    ({"rolling_pre_stop": {"hots": "drain.sh"}}, "rolling_pre_stop.hots", "unknown-variable"),
    ({"vllm_allow_from": ["10.0.0.0/33"]}, "vllm_allow_from[0]", "allow-from"),
    ({"vllm_instances": [{"name": "a", "gpus": [0]}, {"name": "a", "gpus": [1]}]}, "vllm_instances", "instance-unique"),
    ({"vllm_args": {"tensor-parallel-size": 2}, "vllm_instances": [{"name": "a", "gpus": [3, 3]}]}, "a.gpus", "instance-unique"),
]

CLUSTER = {
    "ray_cluster": "c",
    "ray_role": "head",
    "cluster_nic": "eth0",
    "vllm_recipe": "llama-3.1-405b-pp2",
    "vllm_nodes": 2,
    "nccl_ib_hca": "mlx5_0",
}
BAD_CLUSTER: list[tuple[dict[str, Any], str, str]] = [
    ({"cluster_nic": "eth0; reboot"}, "cluster_nic", "value-format"),
    ({"cluster_nic": "a-very-long-interface-name"}, "cluster_nic", "value-format"),
    ({"nccl_net_gdr_level": "HIGH"}, "nccl_net_gdr_level", "value-format"),
    ({"nccl_ib_gid_index": 999}, "nccl_ib_gid_index", "value-format"),
    ({"nccl_min_nchannels": 0}, "nccl_min_nchannels", "value-format"),
    ({"nccl_ib_hca": "mlx5_0 mlx5_1"}, "nccl_ib_hca", "value-format"),
    ({"ray_ports": {"object_manager": 6379}}, "ray_ports.object_manager", "ray-ports"),
]


@pytest.mark.parametrize(("data", "key", "rule"), BAD, ids=[f"{r}:{k}" for _, k, r in BAD])
def test_each_bad_value_names_the_host_the_key_and_the_rule(data: dict[str, Any], key: str, rule: str) -> None:
    _, findings = check({**G, **data})
    hits = [f for f in findings if f.rule == rule and f.key == key]
    assert hits, [str(f) for f in findings]
    # Messages are filled in: no template placeholder such as {shown} is left for the user to read.
    assert not [f.message for f in findings if re.search(r"\{[a-z_!]+\}", f.message)]
    assert all(f.host == "h1" and f.severity == "error" and f"[{rule}]" in str(f) for f in hits)


@pytest.mark.parametrize(("data", "key", "rule"), BAD_CLUSTER, ids=[f"{r}:{k}" for _, k, r in BAD_CLUSTER])
def test_each_bad_cluster_value_is_refused(data: dict[str, Any], key: str, rule: str) -> None:
    _, findings = check({**CLUSTER, **data})
    assert [f for f in findings if f.rule == rule and f.key == key], [str(f) for f in findings]


def test_good_values_pass() -> None:
    data = {
        **G,
        "vllm_image": "registry.example.com:5000/team/vllm-openai-rocm:v0.22.0",
        "hf_cache_dir": "/data/hf",
        "docker_registry_mirrors": ["https://mirror.example.com"],
        "docker_insecure_registries": ["10.0.0.5:5000"],
        "vllm_env": {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MHA": "false"},
        "vllm_model": "/models/gpt-oss-120b",
    }
    _, findings = check(data)
    assert [str(f) for f in findings if f.severity == "error"] == []


hostile = st.text(alphabet=st.sampled_from(list("ab=\n\r\t\"'$()`;\\% \x00é")), min_size=1, max_size=12)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(st.text(alphabet=st.sampled_from(list("aZ9_-./é ")), min_size=1, max_size=12), st.sampled_from(["a" * 96, "o/" + "a" * 97]))
)
def test_a_model_id_the_validator_accepts_is_one_huggingface_hub_accepts(model: str) -> None:
    """vLLM hands a model that is not a local directory to huggingface_hub; its validate_repo_id is the reader,
    so the validator accepts exactly the repo ids it accepts (and absolute paths besides)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
        hub = True
    except HFValidationError:
        hub = False
    _, findings = check({**G, "vllm_model": model})
    refused = any(f.rule == "value-format" and f.key == "vllm_model" for f in findings)
    assert refused != hub or model.startswith("/"), (model, hub, [str(f) for f in findings])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=hostile,
    where=st.sampled_from(["env", "model", "served", "cache", "instance-env", "allow"]),
)
def test_no_value_ever_adds_a_line_to_a_rendered_file(value: str, where: str) -> None:
    data: dict[str, Any] = {**G}
    if where == "env":
        data["vllm_env"] = {"FOO": value}
    elif where == "model":
        data["vllm_model"] = value
    elif where == "served":
        data["vllm_args"] = {"served-model-name": value}
    elif where == "cache":
        data["hf_cache_dir"] = "/data/" + value
    elif where == "instance-env":
        data["vllm_instances"] = [{"name": "main", "env": {"BAR": value}}]
    else:
        data["vllm_allow_from"] = [value]
    spec, findings = check(data)
    if any(f.severity == "error" for f in findings):
        return  # refused before anything is rendered
    svc = spec.services[0]
    env = render.env_file(dict(svc.env), with_token=True)
    assert env.count("\n") == len(svc.env) + 1
    container = content.vllm_container(svc, ["/dev/dri/renderD128"], 60)
    line = render.exec_line(content.docker_run(container, spec.vars, [44], with_token=True))
    assert all(part.startswith("    ") for part in line.split("\n")[1:]), line


@contextmanager
def ssh_port() -> Iterator[tuple[int, list[bool]]]:
    """A listener standing in for a host's SSH port; the list says, afterwards, whether anything connected."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    contacted: list[bool] = []
    try:
        yield listener.getsockname()[1], contacted
        try:
            listener.accept()[0].close()  # a connection made during the run waits in the backlog
            contacted.append(True)
        except TimeoutError:
            pass
    finally:
        listener.close()


def test_bad_input_contacts_no_host(tmp_path: Path) -> None:
    """Validation runs before pyinfra connects: a listener on the host's SSH port sees no connection."""
    (tmp_path / "inventories").mkdir()
    (tmp_path / "group_data").mkdir()
    with ssh_port() as (port, contacted):
        (tmp_path / "inventories" / "bad.py").write_text(
            f"hosts = [('gpu-1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}, 'vllm_env': {{'HF_TOKEN': 'hf_x'}}}})]\n"
        )
        done = subprocess.run(
            [sys.executable, "-m", "instinct_fleet.cli", "deploy", str(tmp_path / "inventories" / "bad.py")], capture_output=True, text=True
        )
    assert done.returncode == 1 and "gpu-1: vllm_env.HF_TOKEN" in done.stderr and "[secret-inline]" in done.stderr
    assert not contacted and "Traceback" not in done.stderr


def test_a_host_with_unreadable_facts_gets_a_plan_that_says_so() -> None:
    plans = plan_inventory([HostData("h1", (), {})], {"h1"}, lambda specs: dict.fromkeys(specs))
    assert not plans["h1"].ok and "no preflight facts" in plans["h1"].errors[0].message
    assert plans["h1"].errors[0].rule == "host-unreachable"


def test_plain_pyinfra_refuses_bad_input_before_connecting(tmp_path: Path) -> None:
    """config.py's gate: the documented pyinfra command validates before its first connection."""
    inventory = tmp_path / "bad.py"
    with ssh_port() as (port, contacted):
        inventory.write_text(
            f"hosts = [('gpu-1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}, 'vllm_env': {{'FOO': 'a\\nB=c'}}}})]\n"
        )
        done = subprocess.run(
            [sys.executable, "-m", "pyinfra", "-y", str(inventory), "deploy.py"], cwd=ROOT, capture_output=True, text=True
        )
    assert done.returncode == 1 and "gpu-1: vllm_env.FOO" in done.stderr and "[unsafe-value]" in done.stderr, done.stderr[-2000:]
    assert "no host was contacted" in done.stderr and not contacted and "Traceback" not in done.stderr


TWO_CLUSTERS = """
c1 = [('h1', {{'ray_cluster': 'a', 'ray_role': 'head', **SSH}}), ('h2', {{'ray_cluster': 'a', 'ray_role': 'worker', **SSH}})]
c2 = [('h1', {{'ray_cluster': 'b', 'ray_role': 'worker', **SSH}}), ('h3', {{'ray_cluster': 'b', 'ray_role': 'head', **SSH}})]
"""


def test_a_host_in_two_clusters_is_named_itself(tmp_path: Path) -> None:
    """pyinfra merges the two entries of h1 silently; the finding names h1 and both groups, not its peers."""
    inventory = tmp_path / "inventories" / "two.py"
    inventory.parent.mkdir()
    with ssh_port() as (port, contacted):
        inventory.write_text(f"SSH = {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}}}\n" + TWO_CLUSTERS.format())
        planned = subprocess.run([sys.executable, "-m", "instinct_fleet.cli", "plan", str(inventory)], capture_output=True, text=True)
        plain = subprocess.run(
            [sys.executable, "-m", "pyinfra", "-y", str(inventory), "deploy.py"], cwd=ROOT, capture_output=True, text=True
        )
    for done in (planned, plain):
        line = next(x for x in done.stdout.splitlines() + done.stderr.splitlines() if "ray_cluster: groups give different values" in x)
        assert line.startswith("error: h1: ray_cluster:") and "c1: 'a'" in line and "c2: 'b'" in line and "[inventory-conflict]" in line
        assert done.returncode == 1 and "Traceback" not in done.stderr
    assert not contacted


def test_limit_to_one_member_still_refuses_a_peer_with_bad_data(tmp_path: Path) -> None:
    """A limited run reads its cluster peers, so their data is validated as if they were chosen."""
    inventory = tmp_path / "inventories" / "cluster.py"
    inventory.parent.mkdir()
    with ssh_port() as (port, contacted):
        ssh = f"'ssh_hostname': '127.0.0.1', 'ssh_port': {port}"
        common = "'ray_cluster': 'c', 'cluster_nic': 'eth0', 'nccl_ib_hca': 'mlx5_0', 'vllm_recipe': 'llama-3.1-405b-pp2', 'vllm_nodes': 2"
        inventory.write_text(
            f"hosts = [('head', {{{ssh}, {common}, 'ray_role': 'head'}}), ('w1', {{{ssh}, {common}, 'ray_role': 'worker', 'cluster_nic': 'eth0;x'}})]\n"
        )
        done = subprocess.run(
            [sys.executable, "-m", "pyinfra", "-y", "--limit", "head", str(inventory), "deploy.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    assert done.returncode == 1 and "w1: cluster_nic" in done.stderr and "[value-format]" in done.stderr, done.stderr[-2000:]
    assert not contacted and "Traceback" not in done.stderr


def refused_before_contact(tmp_path: Path, cases: list[tuple[dict[str, Any], str, str]], ssh_of: Any = None) -> None:
    """All ``cases`` at once, one host each, through `instinct-fleet deploy`: each host named with its key and rule, none contacted.

    ``ssh_of(data, port)`` gives a host's ssh_port (default: the listener's), for cases about the SSH port itself.
    """
    inventory = tmp_path / "inventories" / "bad.py"
    inventory.parent.mkdir(exist_ok=True)
    with ssh_port() as (port, contacted):
        hosts = []
        for i, (data, _, _) in enumerate(cases):
            ssh = ssh_of(data, port) if ssh_of else port
            hosts.append((f"bad-{i}", {"ssh_hostname": "127.0.0.1", "ssh_port": ssh, **G, **data}))
        inventory.write_text(f"hosts = {hosts!r}\n")
        done = subprocess.run(
            [sys.executable, "-m", "instinct_fleet.cli", "deploy", str(inventory)], cwd=ROOT, capture_output=True, text=True
        )
    assert done.returncode == 1 and "Traceback" not in done.stderr and not contacted
    lines = done.stderr.splitlines()
    for i, (_, key, rule) in enumerate(cases):
        assert any(line.startswith(f"error: bad-{i}: {key}: ") and line.endswith(f"[{rule}]") for line in lines), (i, key, rule)


def test_every_bad_value_is_refused_by_the_cli_before_any_contact(tmp_path: Path) -> None:
    """All of BAD at once, one host each, through `instinct-fleet deploy`: each host named with its key and rule."""
    refused_before_contact(tmp_path, BAD)


@pytest.mark.parametrize("recipe", ["gpt-oss-120b", "llama-3.1-70b"])
def test_an_instance_with_no_gpu_gets_findings_never_an_internal_error(recipe: str) -> None:
    """The watch's stall rule divided by a prefill rate made from the instance's GPUs: with none, float division by
    zero ended plan and deploy (issue 61). It now leaves such an instance to the rule that refuses it."""
    from instinct_fleet.model.inventory import plan_hosts

    ((_, findings),) = plan_hosts([HostData("h", (), {"vllm_recipe": recipe, "vllm_instances": [{"name": "main", "gpus": []}]})])
    assert [(f.rule, f.severity) for f in findings] == [("parallel-size", "error")]
