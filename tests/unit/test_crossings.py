"""Where features meet: every class of wrong input around two features is refused with host, key and rule, before any contact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from instinct_fleet.converge import content, firewall
from instinct_fleet.model import paths, workload
from instinct_fleet.model.crosscheck import listeners
from tests.unit.files import unit_files

from .conftest import CLUSTER, check, check_cluster
from .consumers import nft_check
from .test_inputs import refused_before_contact

ROOT = Path(__file__).resolve().parents[2]
G = {"vllm_recipe": "gpt-oss-120b"}
L405 = {"vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2}

# (data, the key named, the rule): each trips exactly where two features meet.
CROSSINGS: list[tuple[dict[str, Any], str, str]] = [
    # One port map per host.
    ({"metrics_exporter": True, "vllm_instances": [{"name": "main", "port": 5000}]}, "main.port", "port-conflict"),
    ({"vllm_instances": [{"name": "main", "port": 22}]}, "main.port", "port-conflict"),
    ({"ssh_port": 2222, "vllm_instances": [{"name": "main", "port": 2222}]}, "main.port", "port-conflict"),
    ({"ssh_port": "2200", "metrics_exporter": True, "metrics_exporter_port": 2200}, "metrics_exporter_port", "port-conflict"),
    ({"metrics_exporter": True, "metrics_exporter_port": 22}, "metrics_exporter_port", "port-conflict"),
    ({"vllm_instances": [{"name": "a", "port": 8000}, {"name": "b", "port": 8000}]}, "vllm_instances", "port-overlap"),
    # Settings the deploy owns.
    ({"vllm_env": {"HF_HOME": "/data/hf"}}, "vllm_env.HF_HOME", "derived-setting"),
    ({"vllm_env": {"HF_TOKEN_PATH": "/tmp/t"}}, "vllm_env.HF_TOKEN_PATH", "derived-setting"),
    ({"weights_source": "/data/hf-cache", "hf_cache_dir": "/data/hf-cache"}, "weights_source", "path-overlap"),
    ({"weights_source": "/data", "hf_cache_dir": "/data/hf-cache"}, "weights_source", "path-overlap"),
    ({"hf_token_path": "/data/hf-cache/token", "hf_cache_dir": "/data/hf-cache"}, "hf_token_path", "path-overlap"),
    # Security inputs never widened or dropped.
    ({"vllm_allow_from": ["10.20.5.17/16"]}, "vllm_allow_from[0]", "allow-from"),
    ({"prometheus_allow_from": ["fd00::1/64"]}, "prometheus_allow_from[0]", "allow-from"),
    ({"firewall": False, "vllm_allow_from": ["10.0.0.0/8"]}, "vllm_allow_from", "firewall-off"),
    ({"firewall": False, "prometheus_allow_from": ["10.0.0.5"]}, "prometheus_allow_from", "firewall-off"),
    ({"vllm_args": {"api-key": "sk-123"}}, "vllm_args.api-key", "secret-inline"),
    ({"vllm_env": {"VLLM_API_KEY": "sk-123"}}, "vllm_env.VLLM_API_KEY", "secret-inline"),
    # vLLM flags that contradict each other.
    ({"vllm_args": {"tp": 1, "tensor-parallel-size": 1}}, "vllm_args.tensor-parallel-size", "flag-twice"),
    ({"vllm_args": {"max_num_seqs": 64, "max-num-seqs": 128}}, "vllm_args.max-num-seqs", "flag-twice"),
    ({"vllm_args": {"max-num-batched-tokens": 256}}, "main.args.--max-num-batched-tokens", "scheduler-batched-below-seqs"),
    ({"vllm_args": {"max-num-batched-tokens": 4096}}, "main.args.--max-num-batched-tokens", "scheduler-batched-below-model-len"),
    # Values that break what reads them.
    ({"scrape_address": "10.0.0.7:9000"}, "scrape_address", "value-format"),
    ({"scrape_address": "10.0.0.999"}, "scrape_address", "value-format"),
    ({"scrape_address": "bad_host"}, "scrape_address", "value-format"),
    (
        {"metrics_exporter": True, "metrics_exporter_image": "rocm/device-metrics-exporter:latest"},
        "metrics_exporter_image",
        "image-unpinned",
    ),
    ({"metrics_exporter": True, "metrics_exporter_image": "rocm/device-metrics-exporter"}, "metrics_exporter_image", "image-unpinned"),
    ({"metrics_exporter_fields": ["GPU_GFX_ACTIVTY"]}, "metrics_exporter_fields[0]", "value-format"),
    ({"rolling_drain_timeout": 600}, "rolling_drain_timeout", "timeouts"),
    ({"rolling_drain_timeout": 580, "command_timeout": 600}, "rolling_drain_timeout", "timeouts"),
]


@pytest.mark.parametrize(("data", "key", "rule"), CROSSINGS, ids=[f"{r}:{k}" for _, k, r in CROSSINGS])
def test_each_crossing_names_the_host_the_key_and_the_rule(data: dict[str, Any], key: str, rule: str) -> None:
    _, findings = check({**G, **data})
    assert any(f.rule == rule and f.key == key and f.host == "h1" and f.severity == "error" for f in findings), [str(f) for f in findings]


def test_every_crossing_is_refused_by_the_cli_before_any_contact(tmp_path: Path) -> None:
    """All of CROSSINGS at once, one host each, through `instinct-fleet deploy`: each host named with its key and rule."""

    def ssh_of(data: dict[str, Any], port: int) -> int:
        # The cases about SSH itself connect on 22, where their instance or exporter also listens.
        ports = [item.get("port") for item in data.get("vllm_instances", [])] + [data.get("metrics_exporter_port")]
        return 22 if 22 in ports else port

    refused_before_contact(tmp_path, CROSSINGS, ssh_of)


def test_good_neighbours_pass() -> None:
    _, findings = check(
        {
            **G,
            "metrics_exporter": True,
            "vllm_allow_from": ["10.20.0.0/16", "10.20.5.17", "fd00::/64"],
            "prometheus_allow_from": ["10.9.0.5"],
            "weights_source": "/mnt/store",
            "hf_cache_dir": "/data/hf-cache",
            "hf_token_path": "/etc/instinct-fleet/hf-token",
            "scrape_address": "gpu-1.example.com",
            "vllm_env": {"NCCL_SOCKET_IFNAME": "eth0"},  # derived only on a cluster node
        }
    )
    assert [str(f) for f in findings if f.severity == "error"] == []


def test_the_ssh_port_is_read_from_pyinfras_host_data() -> None:
    """SSH listens where pyinfra connects: port 22 is free for an instance when SSH is elsewhere, and a bad port is refused."""
    spec, findings = check({**G, "ssh_port": 2222, "vllm_instances": [{"name": "main", "port": 22}]})
    assert spec.ssh_port == 2222 and [str(f) for f in findings if f.severity == "error"] == []
    assert check({**G, "ssh_port": 0})[0].ssh_port == 22  # pyinfra's int(ssh_port or 0): SSH's own default
    _, findings = check({**G, "ssh_port": 70000})
    assert [(f.rule, f.key) for f in findings] == [("schema", "ssh_port")]


def test_a_check_cannot_read_a_key_the_spec_never_holds() -> None:
    """spec.data holds the instinct-fleet variables only: a check that reads another key (ssh_port, say) fails loudly."""
    spec, _ = check({**G, "ssh_port": 2222})
    assert spec.data.get("vllm_recipe") == "gpt-oss-120b" and spec.data["firewall"] is True
    for read in (lambda: spec.data.get("ssh_port", 22), lambda: spec.data["ssh_hostname"]):
        with pytest.raises(KeyError, match="not an instinct-fleet variable"):
            read()


def test_the_port_map_holds_every_listener_of_a_cluster_node() -> None:
    spec = check_cluster({**L405, "metrics_exporter": True}, 2)[0][0]
    kinds = {(x.kind, x.key) for x in listeners(spec)}
    assert ("exporter", "metrics_exporter_port") in kinds and ("ssh", "ssh_port") in kinds
    assert ("ray", "ray_ports.gcs") in kinds and ("ray", "ray_ports.min_worker") in kinds and ("vllm", "main.port") in kinds


@pytest.mark.parametrize(
    ("worker", "key"),
    [
        ({"vllm_env": {"NCCL_MIN_NCHANNELS": "64"}}, "vllm_env"),
        ({"vllm_model": "meta-llama/Llama-3.1-405B-Instruct-FP8"}, "vllm_model"),
        ({"ray_ports": {"gcs": 6390}}, "ray_ports"),
        ({"vllm_args": {"max-model-len": 4096}}, "vllm_args"),
        ({"infiniband": True}, "infiniband"),
        ({"vllm_image": "registry.local:5000/vllm/vllm-openai-rocm:v0.22.0"}, "vllm_image"),
    ],
)
def test_cluster_members_agree_on_everything_a_member_runs(worker: dict[str, Any], key: str, tmp_path: Path) -> None:
    """A worker that differs from its head in anything it runs is named, with what the head has; its own cache path may differ."""
    from instinct_fleet.model.inventory import HostData, plan_hosts

    hosts = [
        HostData("h1", ("all",), {**CLUSTER, **L405, "ray_role": "head"}),
        HostData("h2", ("all",), {**CLUSTER, **L405, "ray_role": "worker", **worker}),
    ]
    planned = plan_hosts(hosts)
    mismatches = [f for _, fs in planned for f in fs if f.rule == "cluster-mismatch"]
    assert [(f.host, f.key) for f in mismatches] == [("h2", key)], [str(f) for f in mismatches]
    assert "on the head h1" in mismatches[0].message


def test_overlapping_allow_list_entries_are_merged_and_load_in_nft(tmp_path: Path) -> None:
    """10.20.5.17 inside 10.20.0.0/16 made `nft -f` refuse the whole ruleset ("conflicting intervals"); merged, it loads."""
    text = firewall.firewall_ruleset(
        [], [], [8000], ("10.20.0.0/16", "10.20.5.17", "fd00::/64", "fd00::5", "10.30.0.1"), ("10.20.0.9",), 5000
    )
    assert "elements = { 10.20.0.0/16, 10.30.0.1/32 }" in text and "elements = { fd00::/64 }" in text
    assert "elements = { 10.20.0.9/32 }" in text
    ruleset = tmp_path / "fw.nft"
    ruleset.write_text(text)
    assert nft_check(ruleset) == ""
    # The reader is real: the unmerged elements are what it refused.
    ruleset.write_text(text.replace("elements = { 10.20.0.0/16, 10.30.0.1/32 }", "elements = { 10.20.0.0/16, 10.20.5.17/32 }"))
    assert "conflicting intervals" in nft_check(ruleset)


def test_the_api_key_reaches_vllm_only_through_its_file() -> None:
    """vllm_api_key_path: the unit mounts the file and a shell exports it just before vllm; no key in any rendered text."""
    from . import test_preflight as pf

    report = pf.preflight.parse_report(pf.mi300x_host(api_key="600|root|33"))
    plan = pf.plan({**G, "vllm_api_key_path": "/etc/instinct-fleet/api-key"}, report)
    assert plan.ok, [str(e) for e in plan.errors]
    (svc,) = plan.serves
    argv = content.vllm_argv(plan, svc)
    entry = argv.index("--entrypoint")
    assert argv[entry + 1 : entry + 4] == ["/bin/sh", svc.image, "-c"]
    assert argv[entry + 4] == 'VLLM_API_KEY="$(cat /run/secrets/vllm-api-key)" exec vllm "$@"'
    assert argv[entry + 5 : entry + 8] == ["vllm", "serve", svc.model]
    assert "/etc/instinct-fleet/api-key:/run/secrets/vllm-api-key:ro" in argv
    unit = next(iter(unit_files(plan)[paths.vllm_unit(svc.name)].values()))
    # systemd unquotes this to the argv above: \" is a quote, $$ a dollar the shell then expands.
    assert '-c "VLLM_API_KEY=\\"$$(cat /run/secrets/vllm-api-key)\\" exec vllm \\"$$@\\"" vllm serve' in unit
    assert consumers_units(unit) == ""


def consumers_units(unit: str) -> str:
    from .consumers import units_check

    return units_check({"/etc/systemd/system/vllm-main.service": unit})


def test_bench_sends_the_key_as_vllm_bench_serve_reads_it() -> None:
    from instinct_fleet.live import bench

    spec, _ = check({**G, "vllm_api_key_path": "/etc/instinct-fleet/api-key"})
    (job,) = workload.jobs(spec, spec.services[0], "latency", None, None)
    text = bench.command(job, "T", None)
    assert "-v /etc/instinct-fleet/api-key:/run/secrets/vllm-api-key:ro" in text
    assert """--entrypoint /bin/sh""" in text and 'OPENAI_API_KEY="$(cat /run/secrets/vllm-api-key)" exec vllm "$@"' in text


def test_a_worker_may_keep_its_cache_elsewhere() -> None:
    from instinct_fleet.model.inventory import HostData, plan_hosts

    worker = {**CLUSTER, **L405, "ray_role": "worker", "hf_cache_dir": "/nvme/hf-cache"}
    planned = plan_hosts([HostData("h1", ("all",), {**CLUSTER, **L405, "ray_role": "head"}), HostData("h2", ("all",), worker)])
    assert [str(f) for _, fs in planned for f in fs if f.severity == "error"] == []


def test_a_ray_worker_does_not_listen_on_its_heads_instance_port() -> None:
    head, worker = (spec for spec, _ in check_cluster(L405, 2))
    assert ("vllm", "main.port") in {(x.kind, x.key) for x in listeners(head)}
    assert "vllm" not in {x.kind for x in listeners(worker)}
