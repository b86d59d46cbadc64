"""Preflight on captured MI300X output: parsing, render-node mapping and the hard checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from instinct_fleet import preflight
from instinct_fleet.hostplan import build_plan
from instinct_fleet.spec import resolve_host

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STATIC = (FIXTURES / "amd-smi-static-json_mi300x-x8_rocm7.2.1_amdsmi26.2.2.json").read_text()
VERSION = (FIXTURES / "amd-smi-version-json_rocm7.2.1_amdsmi26.2.2.json").read_text()
BDFS = [gpu["bus"]["bdf"] for gpu in json.loads(STATIC)["gpu_data"]]


def body(path: str) -> str:
    """A fixture's captured output, without its # header block."""
    return (FIXTURES / path).read_text().split("# ---- verbatim output follows ----\n", 1)[1]


def output(**sections: str) -> str:
    """What preflight.SCRIPT prints on a host, section by section (amd-smi JSON has no final newline)."""
    return "".join(f"\n{preflight.MARK}{name.replace('_', '-')}\n{text}" for name, text in sections.items())


def mi300x_host(**changes: str) -> str:
    sections = {
        "amd_smi_static": STATIC,
        "amd_smi_version": VERSION,
        "kfd": "present",
        "render_nodes": "\n".join(f"renderD{128 + i}" for i in range(8)),
        "render_by_path": "\n".join(
            f"lrwxrwxrwx 1 root root 13 Nov 22 10:32 pci-{bdf}-render -> ../renderD{128 + i}" for i, bdf in enumerate(BDFS)
        ),
        "amdgpu_initstate": "live",
        "partitions": "\n".join(["SPX NPS1"] * 8),
        "cmdline": "BOOT_IMAGE=/vmlinuz-6.8.0-107-generic root=/dev/sda1 ro quiet iommu=pt",
        "numa_balancing": "1",
        "docker": "26.1.3",
        "os_release": 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"',
        "groups": "render:x:993:\nvideo:x:44:",
        "commands": "curl",
        "units": "/etc/systemd/system/vllm-old.service",
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
    assert (report.rocm_version, report.amdgpu_version) == ("7.2.1", "6.16.13")
    assert (report.compute_partition, report.memory_partition) == ("SPX", "NPS1")
    assert report.missing_kernel_args == ("pci=realloc=off",)
    assert report.group_ids == {"render": 993, "video": 44}
    assert report.is_debian_family and report.hf_token and report.kfd and report.amdgpu_loaded
    assert report.managed_units == ("vllm-old",)
    assert preflight.hard_problems(report, spec()) == []  # type: ignore[arg-type]


def test_render_nodes_follow_the_pci_address_not_the_listing_order() -> None:
    by_path = "\n".join(f"pci-{bdf}-render -> ../renderD{135 - i}" for i, bdf in enumerate(BDFS))
    report = preflight.parse_report(mi300x_host(render_by_path=by_path))
    assert preflight.render_nodes(report, (0, 7)) == ["/dev/dri/renderD135", "/dev/dri/renderD128"]


def test_without_by_path_links_render_nodes_follow_pci_order() -> None:
    report = preflight.parse_report(mi300x_host(render_by_path=""))
    assert preflight.render_nodes(report, (2,)) == ["/dev/dri/renderD130"]


def test_amd_smi_without_root_says_so() -> None:
    report = preflight.parse_report(mi300x_host(amd_smi_static=body("amd-smi-static-json-nonroot_mi300x-x8_rocm7.2.1_amdsmi26.2.2.txt")))
    problems = preflight.hard_problems(report, spec())  # type: ignore[arg-type]
    assert problems == ["amd-smi answered N/A for every GPU: it needs root (run pyinfra with --sudo or as root)"]


def test_rocm_smi_is_the_fallback() -> None:
    text = mi300x_host(amd_smi_static="", amd_smi_version="", rocm_smi=body("rocm-smi-showproductname_mi300x-oam_rocm6.1.2_rocm-blog.txt"))
    report = preflight.parse_report(text)
    assert report.smi == "rocm-smi"
    assert [(g.model, g.render_node) for g in report.gpus] == [("MI300X", "renderD128")]
    problems = preflight.hard_problems(report, spec(gpu_count=1))  # type: ignore[arg-type]
    assert problems == []


def test_host_without_gpu_fails_with_how_to_fix() -> None:
    report = preflight.parse_report(output(os_release="ID=debian", cmdline="ro quiet"))
    problems = preflight.hard_problems(report, spec())  # type: ignore[arg-type]
    assert problems[0].startswith("no AMD GPU found: neither amd-smi nor rocm-smi is installed. Install ROCm")
    assert problems[1].startswith("/dev/kfd is missing")
    assert len(problems) == 2


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"gpu_model": "MI355X"}, "gpu_model is MI355X but amd-smi reports MI300X"),
        ({"gpu_count": 16}, "8 GPUs visible, but gpu_count is 16"),
        ({"vllm_instances": [{"name": "x", "gpus": [9]}]}, "instances use GPU indices up to 9"),
    ],
)
def test_mismatched_hosts_fail_with_the_variable_to_change(data: dict[str, object], fragment: str) -> None:
    report = preflight.parse_report(mi300x_host())
    host, _ = resolve_host("h1", data)
    problems = preflight.hard_problems(report, host)
    assert any(fragment in p for p in problems), problems


def test_other_distributions_are_refused_plainly() -> None:
    report = preflight.parse_report(mi300x_host(os_release='ID="ol"\nID_LIKE="fedora"'))
    problems = preflight.hard_problems(report, spec())  # type: ignore[arg-type]
    assert problems == ["the host runs ol; instinct-fleet installs packages and regenerates GRUB on Debian and Ubuntu only"]


def test_plan_reports_warnings_packages_and_stale_units() -> None:
    report = preflight.parse_report(mi300x_host(docker="", hf_token=""))
    plan = build_plan("h1", ("gpu",), {"vllm_instances": [{"name": "main"}]}, report)
    assert plan.ok
    assert plan.missing_packages == ["docker.io", "linux-tools-common", "linux-tools-generic"]
    assert plan.stale_units == ["vllm-old"]
    assert any("reboot required" in w for w in plan.warnings)
    assert any("no Hugging Face token" in w for w in plan.warnings)
    assert plan.group_ids == [44, 993]


def test_invalid_input_stops_the_plan_before_the_host_is_judged() -> None:
    report = preflight.parse_report(output())
    plan = build_plan("h1", (), {"vllm_args": {"tensor-paralel-size": 2}}, report)
    assert len(plan.errors) == 1 and "flag-unknown" in plan.errors[0]


def test_script_probes_the_configured_token_path() -> None:
    assert "test -r '/secrets/hf token'" in preflight.script("/secrets/hf token")


@given(
    st.dictionaries(st.sampled_from(["amd_smi_static", "amd_smi_version", "render_by_path", "partitions", "groups", "rocm_smi"]), st.text())
)
@settings(max_examples=300, deadline=None)
def test_any_probe_output_parses_without_raising(sections: dict[str, str]) -> None:
    report = preflight.parse_report(output(**sections))
    assert isinstance(preflight.hard_problems(report, spec()), list)  # type: ignore[arg-type]


@given(st.recursive(st.none() | st.text() | st.integers(), lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids)))
@settings(max_examples=300, deadline=None)
def test_any_amd_smi_json_shape_parses_without_raising(value: object) -> None:
    report = preflight.parse_report(mi300x_host(amd_smi_static=json.dumps(value), amd_smi_version=json.dumps(value)))
    assert report.smi == "amd-smi"
