"""Preflight on captured MI300X output: parsing, render-node mapping and the hard checks."""

from __future__ import annotations

import json
import os
import socketserver
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instinct_fleet.converge import content, evaluate, firewall, health, hostchecks, preflight, probe, state
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.model import paths
from instinct_fleet.model.inventory import HostData
from instinct_fleet.model.spec import resolve_host
from instinct_fleet.roll import roll
from instinct_fleet.roll.plan import plan_inventory
from tests.unit import smi
from tests.unit.files import unit_files

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STATIC = (FIXTURES / "amd-smi-static-json_mi300x-x8_rocm7.2.1_amdsmi26.2.2.json").read_text()
VERSION = (FIXTURES / "amd-smi-version-json_rocm7.2.1_amdsmi26.2.2.json").read_text()
BDFS = [gpu["bus"]["bdf"] for gpu in json.loads(STATIC)["gpu_data"]]


def body(path: str) -> str:
    """A fixture's captured output, without its # header block."""
    return (FIXTURES / path).read_text().split("# ---- verbatim output follows ----\n", 1)[1]


def output(**sections: str) -> str:
    """What probe.SCRIPT prints on a host, section by section (amd-smi JSON has no final newline)."""
    return "".join(f"\n{probe.MARK}{name.replace('_', '-')}\n{text}" for name, text in sections.items())


def docker_section(ids: dict[str, str], version: str = "26.1.3") -> str:
    """The docker section as the CLI fallback prints it (probe.docker_probe): the version, then each image's id
    (empty: docker lacks it) and its ``@@image:`` line."""
    return "\n".join([f"Server: Docker/{version}", *(f"{found}\n{probe.IMAGE_MARK}{ref}" for ref, found in ids.items())])


def mi300x_host(**changes: str) -> str:
    sections = {
        "amd_smi_static": STATIC,
        "amd_smi_version": VERSION,
        **{k: v for k, v in smi.sections().items() if k != "amd_smi_static"},  # healthy GPUs (the stand-in amd-smi)
        "kfd": "present",
        "render_nodes": "\n".join(f"renderD{128 + i}" for i in range(8)),
        "render_by_path": "\n".join(
            f"lrwxrwxrwx 1 root root 13 Nov 22 10:32 pci-{bdf}-render -> ../renderD{128 + i}" for i, bdf in enumerate(BDFS)
        ),
        "amdgpu_initstate": "live",
        "partitions": "\n".join(["SPX NPS1"] * 8),
        "cmdline": "BOOT_IMAGE=/vmlinuz-6.8.0-107-generic root=/dev/sda1 ro quiet iommu=pt",
        "sysctls": "kernel.numa_balancing|1",
        "docker": docker_section({}),
        "os_release": 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"',
        "groups": "render:x:993:\nvideo:x:44:",
        "commands": "curl",
        "units": "/etc/systemd/system/vllm-old.service\n/etc/systemd/system/ray-worker.service",
        "hf_token": "present",
    }
    sections.update(changes)
    return output(**sections)


def spec(**data: object) -> object:
    host, findings = resolve_host("h1", data)
    assert not findings
    return host


def test_captured_mi300x_host_parses_completely() -> None:
    report = preflight.parse_report(mi300x_host())
    assert report.smi == "amd-smi" and report.smi_error is None
    assert [g.model for g in report.gpus] == ["MI300X"] * 8
    assert [g.render_node for g in report.gpus] == [f"renderD{128 + i}" for i in range(8)]
    assert report.gpus[0].bdf == "0000:1b:00.0" and report.gpus[0].firmware == "00159017"
    assert report.gpu_arch == "gfx942"  # every GPU's asic.target_graphics_version: where a compile cache may go
    assert (report.rocm_version, report.amdgpu_version) == ("7.2.1", "6.16.13")
    assert (report.compute_partition, report.memory_partition) == ("SPX", "NPS1")
    assert report.missing_kernel_args == ("pci=realloc=off",)
    assert report.group_ids == {"render": 993, "video": 44}
    assert report.is_debian_family and report.hf_token and report.kfd and report.amdgpu_loaded
    assert report.managed_units == ("vllm-old", "ray-worker")
    assert hostchecks.hard_problems(report, spec()) == []  # type: ignore[arg-type]


def test_render_nodes_follow_the_pci_address_not_the_listing_order() -> None:
    by_path = "\n".join(f"pci-{bdf}-render -> ../renderD{135 - i}" for i, bdf in enumerate(BDFS))
    report = preflight.parse_report(mi300x_host(render_by_path=by_path))
    assert preflight.render_nodes(report, (0, 7)) == ["/dev/dri/renderD135", "/dev/dri/renderD128"]


def test_without_by_path_links_render_nodes_follow_pci_order() -> None:
    report = preflight.parse_report(mi300x_host(render_by_path=""))
    assert preflight.render_nodes(report, (2,)) == ["/dev/dri/renderD130"]


def test_amd_smi_without_root_says_so() -> None:
    report = preflight.parse_report(mi300x_host(amd_smi_static=body("amd-smi-static-json-nonroot_mi300x-x8_rocm7.2.1_amdsmi26.2.2.txt")))
    problems = hostchecks.hard_problems(report, spec())  # type: ignore[arg-type]
    assert [(p.rule, p.message) for p in problems] == [
        ("host-gpu", "amd-smi answered N/A for every GPU: it needs root (run pyinfra with --sudo or as root)")
    ]


def test_rocm_smi_is_the_fallback() -> None:
    text = mi300x_host(amd_smi_static="", amd_smi_version="", rocm_smi=body("rocm-smi-showproductname_mi300x-oam_rocm6.1.2_rocm-blog.txt"))
    report = preflight.parse_report(text)
    assert report.smi == "rocm-smi"
    assert [(g.model, g.render_node) for g in report.gpus] == [("MI300X", "renderD128")]
    assert report.gpu_arch is None  # rocm-smi names no architecture: such a host neither sends nor receives a compile cache
    problems = hostchecks.hard_problems(report, spec(gpu_count=1))  # type: ignore[arg-type]
    assert problems == []


def test_host_without_gpu_fails_with_how_to_fix() -> None:
    report = preflight.parse_report(output(os_release="ID=debian", cmdline="ro quiet"))
    problems = hostchecks.hard_problems(report, spec())  # type: ignore[arg-type]
    assert problems[0].message.startswith("no AMD GPU found: neither amd-smi nor rocm-smi is installed. Install ROCm")
    assert problems[1].message.startswith("/dev/kfd is missing")
    assert [p.rule for p in problems] == ["host-gpu", "host-driver"] and all(p.host == "h1" for p in problems)


@pytest.mark.parametrize(
    ("data", "fragment", "rule", "key"),
    [
        ({"gpu_model": "MI355X"}, "gpu_model is MI355X but amd-smi reports MI300X", "host-gpu-model", "gpu_model"),
        ({"gpu_count": 16}, "8 GPUs visible, but gpu_count is 16", "host-gpu-count", "gpu_count"),
        ({"vllm_instances": [{"name": "x", "gpus": [9]}]}, "instances use GPU indices up to 9", "host-gpu-count", "gpu_count"),
    ],
)
def test_mismatched_hosts_fail_with_the_variable_to_change(data: dict[str, object], fragment: str, rule: str, key: str) -> None:
    report = preflight.parse_report(mi300x_host())
    host, _ = resolve_host("h1", data)
    problems = hostchecks.hard_problems(report, host)
    assert any(fragment in p.message and p.rule == rule and p.key == key for p in problems), problems


def test_other_distributions_are_refused_plainly() -> None:
    report = preflight.parse_report(mi300x_host(os_release='ID="ol"\nID_LIKE="fedora"'))
    problems = hostchecks.hard_problems(report, spec())  # type: ignore[arg-type]
    assert [(p.rule, p.message) for p in problems] == [
        ("host-os", "the host runs ol; instinct-fleet installs packages and regenerates GRUB on Debian and Ubuntu only")
    ]


def plan(data: dict[str, object], report: preflight.HostReport) -> HostPlan:
    return plan_inventory([HostData("h1", ("gpu",), data)], {"h1"}, lambda specs: dict.fromkeys(specs, report))["h1"]


def test_plan_reports_warnings_packages_and_stale_units() -> None:
    report = preflight.parse_report(mi300x_host(docker="", hf_token=""))
    plan_ = plan({"vllm_instances": [{"name": "main"}]}, report)
    assert plan_.ok
    assert content.missing_packages(plan_) == ["docker.io", "nftables", "linux-tools-common", "linux-tools-generic"]
    assert plan_.stale_units == ["ray-worker", "vllm-old"]  # this host left its cluster too
    assert {w.rule for w in plan_.warnings} == {"host-reboot-required", "host-hf-token"}
    assert any("reboot required" in w.message for w in plan_.warnings)
    assert plan_.group_ids == [44, 993]


def test_invalid_input_stops_the_plan_before_the_host_is_judged() -> None:
    report = preflight.parse_report(output())
    plan_ = plan({"vllm_args": {"tensor-paralel-size": 2}}, report)
    assert [e.rule for e in plan_.errors] == ["flag-unknown"]


CLUSTER = {"ray_cluster": "c", "cluster_nic": "eth0", "vllm_recipe": "llama-3.1-405b-pp2", "vllm_nodes": 2, "nccl_ib_hca": "mlx5_0"}


def interfaces(ip: str) -> str:
    return f"1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet {ip}/16 brd 172.17.255.255 scope global eth0"


def cluster_plans(worker_interfaces: str) -> dict[str, HostPlan]:
    hosts = [HostData("head", (), {**CLUSTER, "ray_role": "head"}), HostData("w1", (), {**CLUSTER, "ray_role": "worker"})]
    reports = {
        "head": preflight.parse_report(mi300x_host(interfaces=interfaces("172.17.0.5"))),
        "w1": preflight.parse_report(mi300x_host(interfaces=worker_interfaces)),
    }
    return plan_inventory(hosts, {"w1"}, lambda specs: {name: reports[name] for name in specs})


def test_cluster_members_learn_addresses_from_facts() -> None:
    plans = cluster_plans(interfaces("172.17.0.6"))
    assert set(plans) == {"head", "w1"}  # the worker's head is planned with it
    worker, head = plans["w1"], plans["head"]
    assert worker.ok and worker.cluster is not None
    assert (worker.cluster.node_ip, worker.cluster.head_ip, worker.cluster.member_ips) == (
        "172.17.0.6",
        "172.17.0.5",
        ("172.17.0.5", "172.17.0.6"),
    )
    assert worker.serves == () and head.serves == head.spec.services
    assert worker.stale_units == ["vllm-old"]  # its own ray-worker unit stays
    assert worker.env(worker.spec.services[0])["VLLM_HOST_IP"] == "172.17.0.6"
    assert "--address=172.17.0.5:6379" in content.ray_argv(worker) and "--num-gpus=8" in content.ray_argv(worker)
    assert len(head.devices(head.spec.services[0])) == 8  # Ray gets the whole node
    unit = content.unit_vars(head, head.spec.services[0])
    assert unit["ray_unit"] == "ray-head" and "python3 - 2 16 600" in unit["ray_ready"]
    ruleset = firewall.firewall(worker)
    assert ruleset is not None and "172.17.0.5, 172.17.0.6" in ruleset


def test_cluster_member_with_more_gpus_than_gpu_count_is_refused() -> None:
    report = preflight.parse_report(mi300x_host(interfaces=interfaces("172.17.0.6")))
    host, _ = resolve_host("w1", {**CLUSTER, "ray_role": "worker", "gpu_count": 4, "vllm_args": {"tensor-parallel-size": 4}})
    assert any("8 GPUs visible but gpu_count is 4" in p.message for p in hostchecks.hard_problems(report, host))


def test_cluster_member_without_the_nic_fails_with_its_interfaces() -> None:
    plans = cluster_plans("2: ib0    inet 10.9.0.6/16 scope global ib0")
    assert not plans["w1"].ok
    assert any(
        "cluster_nic eth0 has no IPv4 address on this host (interfaces: ib0)" in e.message and e.rule == "host-cluster-nic"
        for e in plans["w1"].errors
    )


def test_script_probes_the_configured_token_path_and_what_the_deploy_manages() -> None:
    host, _ = resolve_host("h1", {"hf_cache_dir": "/data/hf-cache"})
    text = probe.script("/secrets/hf token", evaluate.probe(host))
    assert "test -r '/secrets/hf token'" in text
    assert "stat -c '%a|%U|%G|%F|%n'" in text and "/data/hf-cache" in text and "/etc/systemd/system/vllm-main.service" in text
    assert health.serving(8080, "openai/gpt-oss-120b", None) in text


def as_found(plan_: HostPlan) -> str:
    """The fact's output on a host that is exactly what ``plan_.desired`` says."""
    want = plan_.desired
    files = [f for f in want.files if f.content is not None]
    stat = [f"{f.mode}|{f.owner}|{f.group}|regular {'empty ' if not f.content else ''}file|{f.path}" for f in files]
    stat += [f"{d.mode or '1777'}|{d.owner}|{d.group}|directory|{d.path}" for d in want.directories]
    running = [u.name for u in want.units if u.running]
    user = want.user
    assert user is not None
    return mi300x_host(
        cmdline="ro iommu=pt pci=realloc=off",
        files="\n".join(f"{f.sha256}  {f.path}" for f in files),
        stat="\n".join(stat),
        active="\n".join(f"{paths.service(u)} loaded active running" for u in running),
        enabled="\n".join(f"{paths.service(u.name)} enabled enabled" for u in want.units if u.enabled),
        user=f"{user.name}:x:999:999::{user.home}:{user.shell}\n{user.name} {' '.join(user.groups)}",
        docker=docker_section({i.ref: "sha256:" + "a" * 64 for i in want.images}),
        healthy=" ".join(str(e.port) for e in want.endpoints),
        tables="\n".join(t.name for t in want.tables),
        sysctls="\n".join(f"{s.key}|{s.value}" for s in want.sysctls),
        units="\n".join(paths.unit_path(n) for n in unit_files(plan_)),
    )


@pytest.mark.parametrize("data", [{}, {"vllm_allow_from": ["10.0.0.0/8"], "vllm_instances": [{"name": "a"}, {"name": "b"}]}])
def test_a_host_exactly_as_desired_has_nothing_to_do(data: dict[str, object]) -> None:
    first = plan(data, preflight.parse_report(mi300x_host()))
    again = plan(data, preflight.parse_report(as_found(first)))
    want = again.desired
    assert [f.path for f in want.files if again.drifted(f.path)] == []
    assert [d.path for d in want.directories if again.drifted(d.path)] == []
    assert [u.name for u in want.units if again.unit_drifted(u.name)] == []
    assert want.user is not None and not state.user_drifts(want.user, again.report)
    assert again.report.image_ids and again.report.tables == tuple(t.name for t in want.tables) and not again.pulls_image
    assert all(again.serving_in_place(unit) for unit in unit_files(again)) and roll.kind(again) == "unchanged"
    # ...and each kind of drift is seen.
    moved = preflight.parse_report(
        as_found(first).replace("644|root|root|regular file|/etc/sysctl.d", "600|root|root|regular file|/etc/sysctl.d")
    )
    assert plan(data, moved).drifted(paths.SYSCTL_FILE)
    stopped = preflight.parse_report(as_found(first).replace("vllm-main.service loaded active running", ""))
    if "vllm-main" in unit_files(first):
        assert not plan(data, stopped).serving_in_place("vllm-main")


@given(
    st.dictionaries(st.sampled_from(["amd_smi_static", "amd_smi_version", "render_by_path", "partitions", "groups", "rocm_smi"]), st.text())
)
@settings(max_examples=300, deadline=None)
def test_any_probe_output_parses_without_raising(sections: dict[str, str]) -> None:
    report = preflight.parse_report(output(**sections))
    assert isinstance(hostchecks.hard_problems(report, spec()), list)  # type: ignore[arg-type]


@given(st.recursive(st.none() | st.text() | st.integers(), lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids)))
@settings(max_examples=300, deadline=None)
def test_any_amd_smi_json_shape_parses_without_raising(value: object) -> None:
    report = preflight.parse_report(mi300x_host(amd_smi_static=json.dumps(value), amd_smi_version=json.dumps(value)))
    assert report.smi == "amd-smi"


def test_a_kernel_without_numa_balancing_is_a_warning_not_a_failure() -> None:
    plan_ = plan({}, preflight.parse_report(mi300x_host(sysctls="")))
    assert plan_.ok and "host-numa-balancing" in {w.rule for w in plan_.warnings}


def test_an_unreachable_member_stops_its_cluster_with_the_members_name() -> None:
    hosts = [HostData("head", (), {**CLUSTER, "ray_role": "head"}), HostData("w1", (), {**CLUSTER, "ray_role": "worker"})]
    head = preflight.parse_report(mi300x_host(interfaces=interfaces("172.17.0.5")))
    plans = plan_inventory(hosts, {"head"}, lambda specs: {"head": head, "w1": None})
    (error,) = plans["head"].errors
    assert (error.rule, error.host, error.key) == ("host-cluster-member", "head", "ray_cluster") and "w1" in error.message


@pytest.mark.parametrize(
    ("api_key", "says"),
    [
        (None, "/etc/instinct-fleet/api-key does not exist"),
        ("644|root|33", "is mode 644, owner root: only root may read it"),
        ("600|vllm|33", "is mode 600, owner vllm: only root may read it"),
        ("600|root|0", "is empty"),
    ],
)
def test_the_api_key_file_must_be_roots_alone(api_key: str | None, says: str) -> None:
    """host-api-key: a key file that is missing, readable by others or empty fails its host before anything changes."""
    key = {"vllm_api_key_path": "/etc/instinct-fleet/api-key"}
    changes = {} if api_key is None else {"api_key": api_key}
    problems = hostchecks.hard_problems(preflight.parse_report(mi300x_host(**changes)), spec(**key))  # type: ignore[arg-type]
    assert [p.rule for p in problems] == ["host-api-key"] and says in problems[0].message and problems[0].key == "vllm_api_key_path"
    good = preflight.parse_report(mi300x_host(api_key="600|root|33"))
    assert hostchecks.hard_problems(good, spec(**key)) == []  # type: ignore[arg-type]
    assert hostchecks.hard_problems(preflight.parse_report(mi300x_host()), spec()) == []  # type: ignore[arg-type]


def test_the_fact_reads_v1_with_the_key_from_its_file_never_in_argv() -> None:
    reads = evaluate.probe(spec(vllm_api_key_path="/etc/instinct-fleet/api-key"))  # type: ignore[arg-type]
    text = probe.script("/etc/instinct-fleet/hf-token", reads)
    assert "read -r key 2>/dev/null </etc/instinct-fleet/api-key" in text and "-K -" in text and "Authorization: Bearer %s" in text
    assert "stat -c '%a|%U|%s' /etc/instinct-fleet/api-key" in text


@pytest.mark.parametrize(
    "faults", [{}, {"noise": True, "shape": "list", "gpus": {"3": {"uncorrectable": 2, "width": 8, "xgmi_down": [5]}}}]
)
def test_the_hardware_probe_puts_each_amd_smi_json_on_one_line_with_one_awk(tmp_path: Path, faults: dict[str, object]) -> None:
    """probe.SCRIPT as a shell runs it, with the fleet's stand-in amd-smi (its indented JSON, a warning on stderr,
    a fault): each of the four JSON sections comes back as one line, the text the stand-in printed with each line's
    indentation off (what a no-op run reads from every host), while amd-smi's version keeps its lines; the parser
    gets every GPU and the injected faults."""
    fault_file = tmp_path / "faults.json"
    fault_file.write_text(json.dumps(faults))
    smi_script = tmp_path / "amd-smi"
    smi_script.write_text(f'#!/bin/sh\nexec {sys.executable} {smi.STANDIN} "$@"\n')
    smi_script.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "STANDIN_AMD_SMI_DATA": smi.data(),
        "STANDIN_AMD_SMI_FAULTS": str(fault_file),
    }
    done = subprocess.run(["/bin/sh", "-c", probe.SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    found = preflight.sections(done.stdout)
    expected = smi.sections(faults)
    for name in probe.ONE_LINE:
        assert len(found[name].splitlines()) == 1 and found[name] == expected[name.replace("-", "_")], name
    assert json.loads(found["amd-smi-version"]) == json.loads(VERSION) and len(found["amd-smi-version"].splitlines()) > 1
    report = preflight.parse_report(done.stdout)
    assert [g.model for g in report.gpus] == ["MI300X"] * 8 and report.gpu_arch == "gfx942" and report.smi_error is None
    assert report.evidence.unread == () and len(report.evidence.gpus) == 8
    if faults:
        gpu = report.evidence.gpus[3]
        assert (gpu.ecc.uncorrectable, gpu.width, gpu.xgmi[5]) == (2, 8, "D")


def test_the_fact_reads_sysctls_and_the_quarantine_record_with_the_shell_s_read(tmp_path: Path) -> None:
    """Each kernel setting's value (a multi-value one keeps its tabs), a missing one empty; the quarantine record on
    one line, and a host without one prints nothing, and no error."""
    reads = probe.Probe(
        paths=(), units=(), user="vllm", images=(), endpoints=(), sysctls=("kernel.numa_balancing", "net.ipv4.tcp_rmem", "vm.absent")
    )
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "numa_balancing").write_text("0\n")
    (tmp_path / "net" / "ipv4").mkdir(parents=True)
    (tmp_path / "net" / "ipv4" / "tcp_rmem").write_text("4096\t131072\t6291456\n")
    record = tmp_path / "quarantine.json"
    text = probe.script("/t", reads).replace("/proc/sys/", f"{tmp_path}/").replace(paths.QUARANTINE, str(record))

    def run() -> dict[str, str]:
        done = subprocess.run(["/bin/sh", "-c", text], capture_output=True, text=True, timeout=60)
        assert "quarantine" not in done.stderr and str(tmp_path) not in done.stderr
        return preflight.sections(done.stdout)

    found = run()
    assert found["sysctls"].splitlines() == ["kernel.numa_balancing|0", "net.ipv4.tcp_rmem|4096\t131072\t6291456", "vm.absent|"]
    assert found["quarantine"] == ""
    record.write_text('{\n  "reason": "ECC"\n}\n')
    assert json.loads(run()["quarantine"]) == {"reason": "ECC"}


def test_the_shell_s_own_globs_and_reads_give_what_ls_grep_and_cat_gave(tmp_path: Path) -> None:
    """The render nodes (a glob), their by-path links (ls -l, the parser keeps the -render ones) and one-line
    files (read: a sysfs file without its final newline too), on a copy of the layout: the same report as the
    captured host's. A host without /dev/dri or amdgpu prints nothing for them, and no error."""
    dri = tmp_path / "dev/dri"
    (dri / "by-path").mkdir(parents=True)
    for i, bdf in enumerate(BDFS):
        (dri / f"renderD{128 + i}").touch()
        (dri / f"card{i}").touch()
        (dri / "by-path" / f"pci-{bdf}-render").symlink_to(f"../renderD{128 + i}")
        (dri / "by-path" / f"pci-{bdf}-card").symlink_to(f"../card{i}")
    (tmp_path / "initstate").write_text("live")
    commands = dict(probe.HARDWARE)

    def run(name: str, root: Path) -> str:
        command = commands[name].replace(paths.DRI, str(root / "dev/dri")).replace("/sys/module/amdgpu/initstate", str(root / "initstate"))
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30)
        assert done.stderr == ""
        return done.stdout

    names = ("render-nodes", "render-by-path", "amdgpu-initstate")
    found = preflight.parse_report(mi300x_host(**{n.replace("-", "_"): run(n, tmp_path) for n in names}))
    assert found.gpus == preflight.parse_report(mi300x_host()).gpus and found.amdgpu_loaded
    assert [run(n, tmp_path / "none") for n in names] == ["", "", ""]


def test_the_partition_probe_pairs_each_device_s_compute_and_memory_mode(tmp_path: Path) -> None:
    """The probe's awk, on a copy of the amdgpu driver's sysfs layout (one directory per PCI device): one
    "COMPUTE MEMORY" line per device, read as preflight reads it; no device, no line (and no error)."""
    sysfs = tmp_path / "sys/module/amdgpu/drivers/pci:amdgpu"
    for bdf, compute, memory in (("0000:1b:00.0", "CPX", "NPS4"), ("0000:3d:00.0", "CPX", "NPS4"), ("0000:4e:00.0", "SPX", "NPS1")):
        (sysfs / bdf).mkdir(parents=True)
        (sysfs / bdf / "current_compute_partition").write_text(compute + "\n")
        (sysfs / bdf / "current_memory_partition").write_text(memory + "\n")
    command = dict(probe.HARDWARE)["partitions"].replace("/sys/module", str(tmp_path / "sys/module"))
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert sorted(done.stdout.splitlines()) == ["CPX NPS4", "CPX NPS4", "SPX NPS1"]
    report = preflight.parse_report(mi300x_host(partitions=done.stdout))
    assert (report.compute_partition, report.memory_partition) == ("CPX/SPX", "NPS1/NPS4")
    empty = subprocess.run(["/bin/sh", "-c", command.replace(str(tmp_path), str(tmp_path / "none"))], capture_output=True, text=True)
    assert empty.stdout == "" and empty.returncode != 0


def _dockerd(socket_path: Path, images: dict[str, str]) -> socketserver.UnixStreamServer:
    """dockerd's API on a unix socket, as far as the probe asks it: ``HEAD /_ping`` (its Server header) and
    ``GET /images/<reference>/json`` (inspect JSON, or 404 and a message for an image it lacks)."""

    class Handler(BaseHTTPRequestHandler):
        def address_string(self) -> str:
            return "dockerd"

        def answer(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Server", "Docker/26.1.3 (linux)")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:
            self.answer(200 if self.path == "/_ping" else 404, b"")

        def do_GET(self) -> None:
            reference = self.path.removeprefix("/images/").removesuffix("/json")
            if reference in images:
                self.answer(
                    200, json.dumps({"Id": images[reference], "RepoTags": [reference], "Config": {"Env": ["A=b|c"]}}).encode() + b"\n"
                )
            else:
                self.answer(404, json.dumps({"message": f"No such image: {reference}"}).encode() + b"\n")

        def log_message(self, *_args: object) -> None:
            return

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    server = Server(str(socket_path), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_docker_s_answers_read_the_same_from_its_api_and_from_its_cli(tmp_path: Path) -> None:
    """The probe asks dockerd's socket with one curl and falls back to the docker CLI (no curl, no socket):
    run by sh against a stand-in dockerd and a stand-in CLI, both give the same version and ids."""
    image, other = "registry.example.com/vllm/vllm-openai-rocm:v0.22.0", "registry.example.com/other:1"
    digest = "sha256:" + "a" * 64
    sock = tmp_path / "docker.sock"
    server = _dockerd(sock, {image: digest})
    command = probe.docker_probe((image, other)).replace(paths.DOCKER_SOCKET, str(sock))
    try:
        api = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30, check=True).stdout
    finally:
        server.shutdown()
        server.server_close()
    cli_bin = tmp_path / "bin"
    cli_bin.mkdir()
    (cli_bin / "docker").write_text(
        f'#!/bin/sh\ncase "$1" in version) echo 26.1.3 ;; image) [ "$5" = {image} ] && echo {digest} || exit 1 ;; esac\n'
    )
    (cli_bin / "docker").chmod(0o755)
    cli = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30, env={"PATH": str(cli_bin)}).stdout
    for answer in (api, cli):
        report = preflight.parse_report(mi300x_host(docker=answer))
        assert (report.docker_version, report.image_ids) == ("26.1.3", {image: digest})
    nothing = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30, env={"PATH": str(tmp_path / "none")})
    report = preflight.parse_report(mi300x_host(docker=nothing.stdout))
    assert (report.docker_version, report.image_ids) == (None, {})
