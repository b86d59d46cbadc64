"""GPU health: the evidence as the preflight fact reads it (both amd-smi shapes, N/A, noisy stderr, the sysfs fallback),
every gpu-* rule on it, the fleet's majority with ties, the thresholds refused before any host, and the quarantine the
plan makes of an error: its units stopped after their drain, not rolled, their files kept, the record written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from instinct_fleet import cli
from instinct_fleet.commands import status
from instinct_fleet.converge import evidence, gpuhealth, preflight, probe
from instinct_fleet.converge.evidence import Ecc, Evidence, GpuEvidence
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.model import paths
from instinct_fleet.model.hostrules import GPU_RULES
from instinct_fleet.model.inventory import HostData
from instinct_fleet.model.rules import RULES
from instinct_fleet.model.validate import validate_gpu_health
from instinct_fleet.roll.plan import FleetPlan, plan_inventory
from instinct_fleet.roll.run import summary_rows
from tests.unit import smi
from tests.unit.test_preflight import mi300x_host, spec


def report(faults: dict[str, Any] | None = None, **changes: str) -> preflight.HostReport:
    sections = smi.sections(faults)
    return preflight.parse_report(mi300x_host(**sections, **changes))


def rules(found: list[gpuhealth.Judged]) -> dict[str, list[int | None]]:
    out: dict[str, list[int | None]] = {}
    for j in found:
        out.setdefault(j.finding.rule, []).append(j.gpu)
    return out


def judged(faults: dict[str, Any] | None = None, data: dict[str, Any] | None = None, **changes: str) -> list[gpuhealth.Judged]:
    r = report(faults, **changes)
    return gpuhealth.judge(r, spec(**(data or {})), gpuhealth.majority([r]))  # type: ignore[arg-type]


def test_a_healthy_captured_host_gives_every_gpu_full_evidence_and_no_finding() -> None:
    r = report()
    assert len(r.evidence.gpus) == 8 and r.evidence.unread == ()
    g = r.evidence.gpus[0]
    assert (g.width, g.speed, g.max_width, g.max_speed) == (16, 32.0, 16, 32.0)
    assert g.ecc == Ecc(0, 0, 0) and len(g.blocks) == 19 and g.blocks["UMC"] == Ecc(0, 0, 0)
    assert (g.retired, g.pending, g.bad_page_threshold, g.threshold_exceeded) == (0, 0, 128, False)
    assert g.xgmi == ("SELF", *["U"] * 7) and g.firmware == "00159017" and g.driver == "6.16.13"
    assert g.xgmi_rate == "32 Gb/s"  # the captures' MI300X bit rate (amd-smi-xgmi_mi300x-class-x8_*.txt)
    assert (g.compute_units, g.arch) == (304, "gfx942")
    assert judged() == []


@pytest.mark.parametrize(
    ("fault", "rule", "severity"),
    [
        ({"uncorrectable": 2}, "gpu-ecc-uncorrectable", "error"),
        ({"correctable": 5}, "gpu-ecc-correctable", "warning"),
        ({"deferred": 1}, "gpu-ecc-deferred", "warning"),
        ({"retired": 128}, "gpu-bad-pages", "error"),
        ({"exceeded": True}, "gpu-bad-pages", "error"),
        ({"retired": 110, "pending": 6}, "gpu-bad-pages-near", "warning"),
        ({"width": 8}, "gpu-pcie-width", "error"),
        ({"speed": 16}, "gpu-pcie-speed", "error"),
        ({"recoveries": 4}, "gpu-pcie-recovery", "error"),
        ({"recoveries": 2}, "gpu-pcie-recovery-warning", "warning"),
        ({"replays": 1}, "gpu-pcie-replay", "warning"),
        ({"naks": 1}, "gpu-pcie-nak", "warning"),
        ({"xgmi_down": [5]}, "gpu-xgmi-down", "error"),
    ],
)
@pytest.mark.parametrize("shape", ["gpu_data", "list"])
def test_each_rule_names_its_gpu_at_its_severity_in_both_shapes(fault: dict[str, Any], rule: str, severity: str, shape: str) -> None:
    found = judged({"shape": shape, "noise": True, "gpus": {"3": fault}})
    assert rules(found) == {rule: [3]}, [j.finding for j in found]
    (one,) = found
    assert one.finding.severity == severity == RULES[rule].severity and one.finding.key == "preflight.gpu3"
    assert one.finding.message.startswith("GPU 3: ")


def test_boundaries_are_node_scraper_s() -> None:
    # More than 3 recoveries is an error, more than 1 a warning; 3 is a warning and 1 nothing.
    assert rules(judged({"gpus": {"0": {"recoveries": 3}}})) == {"gpu-pcie-recovery-warning": [0]}
    assert judged({"gpus": {"0": {"recoveries": 1}}}) == []
    # Bad pages: 90% of 128 is 115.2; 115 is below, 116 is near, 128 is over.
    assert judged({"gpus": {"0": {"retired": 115}}}) == []
    assert rules(judged({"gpus": {"0": {"retired": 116}}})) == {"gpu-bad-pages-near": [0]}
    assert rules(judged({"gpus": {"0": {"retired": 127, "pending": 1}}})) == {"gpu-bad-pages": [0]}
    # The block alone counts where the total says nothing.
    g = GpuEvidence(0, blocks={"XGMI_WAFL": Ecc(0, 1, 0)})
    r = preflight.HostReport(**{**report().__dict__, "evidence": Evidence((g,))})
    (one,) = gpuhealth.judge(r, spec(), gpuhealth.Majority({}, {}))  # type: ignore[arg-type]
    assert one.finding.rule == "gpu-ecc-uncorrectable" and "XGMI_WAFL 1" in one.finding.message


def test_thresholds_and_levels_are_the_host_s() -> None:
    # A host whose slots are x8 by design: the x8 GPU is right, the x16 ones are not what it states.
    assert rules(judged({"gpus": {"2": {"width": 8}}}, {"gpu_health_pcie_width": 8})) == {"gpu-pcie-width": [0, 1, 3, 4, 5, 6, 7]}
    assert judged({"gpus": {"2": {"recoveries": 4}}}, {"gpu_health_recovery_error": 4, "gpu_health_recovery_warning": 4}) == []
    lowered = judged({"gpus": {"2": {"speed": 16}}}, {"gpu_health_levels": {"gpu-pcie-speed": "warning"}})
    assert [(j.finding.rule, j.finding.severity) for j in lowered] == [("gpu-pcie-speed", "warning")]
    assert judged({"gpus": {"2": {"speed": 16}}}, {"gpu_health_levels": {"gpu-pcie-speed": "off"}}) == []
    raised = judged({"gpus": {"2": {"replays": 1}}}, {"gpu_health_levels": {"gpu-pcie-replay": "error"}})
    assert [j.finding.severity for j in raised] == ["error"]
    assert judged({"gpus": {"2": {"uncorrectable": 9}}}, {"gpu_health": False}) == []


def test_na_fields_and_noise_are_no_data_and_a_command_without_data_is_a_warning() -> None:
    sections = smi.sections({"noise": True})
    na = json.loads(sections["amd_smi_metric"][sections["amd_smi_metric"].index("{") :])
    for row in na["gpu_data"]:
        row["pcie"] = {k: "N/A" for k in row["pcie"]}
        row["ecc"] = "N/A"
        row["ecc_blocks"] = "N/A"
    found = evidence.parse(
        {
            "amd-smi-static": sections["amd_smi_static"],
            "amd-smi-metric": "WARNING: [render] group missing " + json.dumps(na) + "Traceback (most recent call last): KeyError: 'x'",
            "amd-smi-bad-pages": "ERROR:root:AttributeError: 'NoneType' object has no attribute 'get'",
            "amd-smi-xgmi": "",
            # sysfs's link of GPU 0, where amd-smi gave N/A: as lspci's LnkSta says "Speed 16GT/s (downgraded), Width x8".
            "pcie-links": "0000:1b:00.0 8 16.0 GT/s PCIe\n0000:3d:00.0 16 32.0 GT/s PCIe",
        }
    )
    g0 = found.gpus[0]
    assert g0.ecc == Ecc() and g0.blocks == {} and g0.retired is None and g0.xgmi == ()
    assert (g0.width, g0.speed, g0.link_source) == (8, 16.0, "sysfs")
    assert found.gpus[2].width is None  # neither amd-smi nor sysfs
    assert [u.split(" gave")[0] for u in found.unread] == ["amd-smi bad-pages --json"]
    assert "AttributeError" in found.unread[0]
    r = preflight.HostReport(**{**report().__dict__, "evidence": found})
    out = gpuhealth.judge(r, spec(), gpuhealth.majority([r]))  # type: ignore[arg-type]
    assert rules(out) == {"gpu-evidence": [None], "gpu-pcie-width": [0], "gpu-pcie-speed": [0]}
    assert "(read from sysfs)" in next(j.finding.message for j in out if j.finding.rule == "gpu-pcie-width")
    # A host whose amd-smi static answers nothing has no evidence to judge (preflight's host-gpu says why).
    assert evidence.parse({"amd-smi-static": "Traceback ... PermissionError"}) == Evidence()


def test_the_probe_s_sysfs_read_gives_each_device_its_link(tmp_path: Any) -> None:
    (command,) = [c for name, c in probe.HARDWARE if name == "pcie-links"]
    root = tmp_path / "sys/module/amdgpu/drivers/pci:amdgpu"
    for bdf, width, speed in (("0000:1b:00.0", "16", "32.0 GT/s PCIe"), ("0000:3d:00.0", "8", "16.0 GT/s PCIe")):
        (root / bdf).mkdir(parents=True)
        (root / bdf / "current_link_width").write_text(width + "\n")
        (root / bdf / "current_link_speed").write_text(speed + "\n")
    done = subprocess.run(["sh", "-c", command.replace("/sys/module", str(tmp_path / "sys/module"))], capture_output=True, text=True)
    assert sorted(done.stdout.splitlines()) == ["0000:1b:00.0 16 32.0 GT/s PCIe", "0000:3d:00.0 8 16.0 GT/s PCIe"]


def _hosts(firmwares: list[str | None], data: dict[str, Any] | None = None) -> dict[str, list[gpuhealth.Judged]]:
    reports = {f"h{i}": report({"gpus": {"0": {"firmware": fw}}} if fw else None) for i, fw in enumerate(firmwares)}
    most = gpuhealth.majority(reports.values())
    return {h: gpuhealth.judge(r, spec(**(data or {})), most) for h, r in reports.items()}  # type: ignore[arg-type]


def test_the_fleet_s_majority_names_the_host_that_drifts_with_both_values_and_a_tie_names_no_one() -> None:
    # GPU 0 of h2 runs other firmware: 23 GPUs against 1.
    found = _hosts([None, None, "00159999"])
    assert found["h0"] == [] and found["h1"] == []
    (drift,) = found["h2"]
    assert drift.finding.rule == "gpu-fleet-drift" and drift.gpu == 0
    assert "firmware 00159999, where the fleet's majority is 00159017" in drift.finding.message
    # Pinned: every GPU that differs is named, majority or not.
    pinned = _hosts([None, "00159999"], {"gpu_health_expected": {"firmware": "00159999"}})
    assert {h: rules(j) for h, j in pinned.items()} == {
        "h0": {"gpu-fleet-drift": list(range(8))},
        "h1": {"gpu-fleet-drift": list(range(1, 8))},
    }
    # A tie: two values, eight GPUs each.
    reports = [report(), report({"gpus": {str(i): {"firmware": "00159999"} for i in range(8)}})]
    most = gpuhealth.majority(reports)
    assert most.split == {"firmware": ("00159017", "00159999")} and "firmware" not in most.values
    tied = gpuhealth.judge(reports[0], spec(), most)  # type: ignore[arg-type]
    assert rules(tied) == {"gpu-fleet-split": [None]} and tied[0].finding.severity == "warning"
    assert "00159017 and 00159999" in tied[0].finding.message
    # Partition modes are one value per host.
    other = preflight.parse_report(mi300x_host(**smi.sections(), partitions="\n".join(["CPX NPS4"] * 8)))
    most = gpuhealth.majority([report(), report(), other])
    assert rules(gpuhealth.judge(other, spec(), most)) == {"gpu-fleet-drift": [None, None]}  # type: ignore[arg-type]


def test_an_xgmi_link_at_another_bit_rate_than_the_fleet_s_is_named_with_both_rates() -> None:
    # node-scraper compares each GPU's XGMI bit_rate with its reference host's; here, with the fleet's majority.
    reports = {"h0": report(), "h1": report(), "h2": report({"gpus": {"4": {"xgmi_rate": 16}}})}
    assert reports["h2"].evidence.gpus[4].xgmi_rate == "16 Gb/s"
    most = gpuhealth.majority(reports.values())
    assert most.values["xgmi_rate"] == "32 Gb/s"
    found = {h: gpuhealth.judge(r, spec(), most) for h, r in reports.items()}  # type: ignore[arg-type]
    assert found["h0"] == [] and rules(found["h2"]) == {"gpu-fleet-drift": [4]}
    assert "XGMI bit rate 16 Gb/s, where the fleet's majority is 32 Gb/s" in found["h2"][0].finding.message
    # Pinned, it is compared with the pin: every GPU of a fleet at 32 Gb/s is named.
    pinned = gpuhealth.judge(reports["h0"], spec(gpu_health_expected={"xgmi_rate": "36 Gb/s"}), most)  # type: ignore[arg-type]
    assert rules(pinned) == {"gpu-fleet-drift": list(range(8))}


def test_gpus_of_one_node_must_agree() -> None:
    r = report()
    odd = [g if g.index != 4 else GpuEvidence(**{**g.__dict__, "compute_units": 228}) for g in r.evidence.gpus]
    mixed = preflight.HostReport(**{**r.__dict__, "evidence": Evidence(tuple(odd))})
    (one,) = gpuhealth.judge(mixed, spec(), gpuhealth.majority([r]))  # type: ignore[arg-type]
    assert one.finding.rule == "gpu-node-mismatch" and "compute units: 228, 304" in one.finding.message


def test_bad_thresholds_are_refused_before_any_host() -> None:
    crossed = spec(gpu_health_recovery_warning=5, gpu_health_recovery_error=3)
    (one,) = validate_gpu_health(crossed)  # type: ignore[arg-type]
    assert one.rule == "gpu-health-thresholds" and one.key == "gpu_health_recovery_warning"
    from instinct_fleet.model.spec import resolve_host

    for key, value in (
        ("gpu_health_pcie_width", 0),
        ("gpu_health_pcie_speed", -1),
        ("gpu_health_bad_page_warning", 1.5),
        ("gpu_health_recovery_error", -1),
        ("gpu_health_levels", {"gpu-pcie-sped": "warning"}),
        ("gpu_health_levels", {"gpu-pcie-speed": "loud"}),
        ("gpu_health_expected", {"firmwre": "1"}),
    ):
        _, findings = resolve_host("h1", {key: value})
        assert findings and all(f.severity == "error" and f.key.startswith(key) for f in findings), (key, findings)
    assert {r.id for r in GPU_RULES} <= set(RULES)


# The plan: what an error quarantines.

TP4 = {"tensor-parallel-size": 4}
TWO = [{"name": "a", "gpus": [0, 1, 2, 3], "port": 8000, "args": TP4}, {"name": "b", "gpus": [4, 5, 6, 7], "port": 8001, "args": TP4}]


def plan(faults: dict[str, Any] | None, data: dict[str, Any] | None = None) -> tuple[HostPlan, FleetPlan]:
    r = report(faults)
    hosts = [HostData("h1", ("gpu",), {"vllm_instances": TWO, **(data or {})})]
    plans = plan_inventory(hosts, {"h1"}, lambda specs: dict.fromkeys(specs, r))
    return plans["h1"], FleetPlan.of(plans)


def test_an_error_on_one_gpu_quarantines_the_instance_on_it_and_the_other_serves() -> None:
    p, fleet = plan({"gpus": {"5": {"uncorrectable": 2}}})
    assert p.ok and p.quarantine is not None and set(p.quarantine.units) == {"vllm-b"}
    assert [f.rule for f in p.health] == ["gpu-ecc-uncorrectable"]
    # vllm-b: stopped and disabled in the services stage, not rolled, its files left as they are, no endpoint.
    (stop,) = [u for u in p.desired.units if u.name == "vllm-b"]
    assert (stop.stage, stop.running, stop.enabled) == ("services", False, False) and "quarantined: GPU 5" in stop.why
    assert p.desired.serving == ("vllm-a",) and [e.unit for e in p.desired.endpoints] == ["vllm-a"]
    assert not p.serving_in_place("vllm-b")  # tune and the roll never take it for a serving unit
    assert not [f for f in p.desired.files if f.path in (paths.unit_path("vllm-b"), paths.unit_env_path("vllm-b"))]
    (record,) = [f for f in p.desired.files if f.path == paths.QUARANTINE]
    assert record.content is not None and record.stage == "services"
    held = json.loads(record.content)
    assert list(held["units"]) == ["vllm-b"] and "GPU 5: 2 uncorrectable ECC" in held["units"]["vllm-b"][0]
    rows = summary_rows(fleet, ["h1"], set(), ran=False)
    assert [(r["instance"], r["status"]) for r in rows][-1] == ("vllm-b", "quarantined")
    assert "GPU 5" in rows[-1]["why"]


def test_a_host_wide_error_quarantines_every_instance_and_cleared_evidence_removes_the_record() -> None:
    p, _ = plan({"gpus": {str(i): {"firmware": "00159999"} for i in range(8)}}, {"gpu_health_expected": {"driver": "6.16.14"}})
    assert p.quarantine is not None and set(p.quarantine.units) == {"vllm-a", "vllm-b"} and p.desired.serving == ()
    healthy, _ = plan(None)
    assert healthy.quarantine is None and healthy.health == ()
    (record,) = [f for f in healthy.desired.files if f.path == paths.QUARANTINE]
    assert record.content is None  # the deploy removes it: the roll starts both behind their gate
    assert {u.name: (u.stage, u.running) for u in healthy.desired.units if u.name in ("vllm-a", "vllm-b")} == {
        "vllm-a": ("roll", True),
        "vllm-b": ("roll", True),
    }


def test_an_error_on_a_gpu_no_instance_uses_quarantines_nothing_but_is_shown() -> None:
    p, _ = plan(
        {"gpus": {"7": {"width": 8}}},
        {"vllm_instances": [{"name": "a", "gpus": [0, 1], "port": 8000, "args": {"tensor-parallel-size": 2}}]},
    )
    assert p.quarantine is None and [f.rule for f in p.health] == ["gpu-pcie-width"]


def test_a_cluster_member_in_error_fails_alone_with_its_cluster_named() -> None:
    r = report({"gpus": {"1": {"xgmi_down": [2]}}}, interfaces="2: eth0    inet 10.0.0.1/24 brd 10.0.0.255 scope global eth0")
    data = {"vllm_nodes": 2, "ray_cluster": "big", "cluster_nic": "eth0"}
    hosts = [
        HostData(
            "c1",
            (),
            {
                **data,
                "ray_role": "head",
                "vllm_instances": [{"name": "x", "args": {"tensor-parallel-size": 8, "pipeline-parallel-size": 2}}],
            },
        ),
        HostData(
            "c2",
            (),
            {
                **data,
                "ray_role": "worker",
                "vllm_instances": [{"name": "x", "args": {"tensor-parallel-size": 8, "pipeline-parallel-size": 2}}],
            },
        ),
    ]
    plans = plan_inventory(hosts, {"c1", "c2"}, lambda specs: dict.fromkeys(specs, r))
    wrong = [f for f in plans["c1"].errors if f.rule == "gpu-xgmi-down"]
    assert wrong and "the Ray cluster big cannot serve without this member" in wrong[0].message and plans["c1"].quarantine is None


def replan(
    faults: dict[str, Any] | None, previous: bytes | None, now: float, ask: gpuhealth.Ask | None = None, data: dict[str, Any] | None = None
) -> HostPlan:
    """The plan of a host whose last deploy left ``previous`` as its quarantine record (the fact reads it)."""
    r = report(faults, quarantine=previous.decode() if previous else "")
    hosts = [HostData("h1", ("gpu",), {"vllm_instances": TWO, **(data or {})})]
    return plan_inventory(hosts, {"h1"}, lambda specs: dict.fromkeys(specs, r), ask=ask, now=now)["h1"]


def record(p: HostPlan) -> dict[str, Any] | None:
    (f,) = [f for f in p.desired.files if f.path == paths.QUARANTINE]
    return None if f.content is None else dict(json.loads(f.content))


def test_a_rerun_keeps_the_record_byte_for_byte_and_a_flapping_gpu_stays_out_after_three_re_admissions() -> None:
    bad = {"gpus": {"5": {"uncorrectable": 1}}}
    first = replan(bad, None, now=1000)
    held = first.quarantine
    assert held is not None and record(first) == {
        "state": "quarantined",
        "units": {"vllm-b": list(held.units["vllm-b"])},
        "since": {"vllm-b": 1000},
        "operator": [],
        "readmitted": [],
    }
    # The same evidence later: the same record (its time is when it began), nothing to write.
    again = replan(bad, held.record, now=1100)
    assert again.quarantine is not None and again.quarantine.record == held.record
    # Cleared (a reset): re-admitted, and counted; then it flaps. Three re-admissions within 900 s are let through.
    previous, t = held.record, 1200
    for n in range(1, 4):
        cleared = replan(None, previous, now=t)
        assert cleared.quarantine is not None and cleared.quarantine.units == {} and cleared.desired.serving == ("vllm-a", "vllm-b")
        assert len(record(cleared)["readmitted"]) == n  # type: ignore[index]
        failing = replan(bad, cleared.quarantine.record, now=t + 60)
        assert failing.quarantine is not None
        previous, t = failing.quarantine.record, t + 120
    # The fourth time the evidence clears within the window, it stays out: a person admits it.
    stuck = replan(None, previous, now=t)
    assert stuck.quarantine is not None and "vllm-b" in stuck.quarantine.units
    assert "[quarantine-held]" in stuck.quarantine.reason("vllm-b") and "instinct-fleet admit INVENTORY h1" in stuck.quarantine.reason(
        "vllm-b"
    )
    # Past the window, the count is gone: re-admitted, and the record with it once nothing is left to remember.
    later = replan(None, stuck.quarantine.record, now=t + 900 + 1)
    assert later.quarantine is not None and later.quarantine.units == {} and record(later)["readmitted"] == [t + 901]  # type: ignore[index]
    gone = replan(None, later.quarantine.record, now=t + 2000)
    assert gone.quarantine is None and record(gone) is None


def test_an_operator_quarantines_a_gpu_and_admit_refuses_while_the_evidence_is_bad() -> None:
    ask = gpuhealth.Ask({"h1": (2, "fans loud, RMA ticket 41")})
    p = replan(None, None, now=50, ask=ask)
    assert p.quarantine is not None and set(p.quarantine.units) == {"vllm-a"}
    assert "fans loud, RMA ticket 41 (by an operator) [quarantine-operator]" in p.quarantine.reason("vllm-a")
    # A later plain deploy keeps it: the record holds the operator's entry, and the evidence is clean.
    kept = replan(None, p.quarantine.record, now=500)
    assert kept.quarantine is not None and set(kept.quarantine.units) == {"vllm-a"}
    # admit with bad evidence: refused on that host, nothing rendered for it.
    refused_plan = replan({"gpus": {"1": {"xgmi_down": [2]}}}, kept.quarantine.record, now=600, ask=gpuhealth.Ask(admit=frozenset({"h1"})))
    assert not refused_plan.ok and [f.rule for f in refused_plan.errors] == ["quarantine-admit"]
    assert "GPU 1: XGMI link(s) to GPU 2 down" in refused_plan.errors[0].message
    # admit with clean evidence: the operator's entry and the count go, and the roll starts vllm-a again.
    admitted = replan(None, kept.quarantine.record, now=700, ask=gpuhealth.Ask(admit=frozenset({"h1"})))
    assert admitted.ok and admitted.desired.serving == ("vllm-a", "vllm-b")
    assert admitted.quarantine is not None and admitted.quarantine.units == {} and record(admitted)["readmitted"] == [700]  # type: ignore[index]


def test_every_gpu_rule_and_quarantine_rule_has_a_case() -> None:
    """Each rule this module judges is tripped by a test above: read from the tests' own source, so a new rule
    without a case fails here."""
    text = Path(__file__).read_text()
    judged_here = {r.id for r in GPU_RULES} | {r for r in RULES if r.startswith("quarantine-")}
    assert {r for r in judged_here if f'"{r}"' not in text and f"[{r}]" not in text} == set()


def test_status_reads_the_same_evidence_and_shows_each_host_s_verdict() -> None:
    def text(faults: dict[str, Any] | None) -> str:
        evidence = "".join(f"\n{probe.MARK}{name.replace('_', '-')}\n{body}" for name, body in smi.sections(faults).items())
        return f"{status.MARK}evidence{evidence}\n{probe.MARK}partitions\n" + "\n".join(["SPX NPS1"] * 8)

    s = spec()
    assert all(name in status.script(s) for name in ("amd-smi metric --ecc", "amd-smi bad-pages", "xgmi -m -l", "current_link_width"))
    good, bad = status.evidence_of(text(None)), status.evidence_of(text({"gpus": {"6": {"width": 8}, "1": {"replays": 2}}}))
    assert good is not None and bad is not None and len(bad.evidence.gpus) == 8
    most = gpuhealth.majority([good, bad])
    row = status.health_row("h1", gpuhealth.judge(bad, s, most))  # type: ignore[arg-type]
    assert not row.ok and row.health == "1 error(s), 1 warning(s)"
    assert row.error is not None and "GPU 6: PCIe link trained at x8" in row.error and "GPU 1: 2 PCIe replay(s)" in row.error
    assert status.health_row("h0", gpuhealth.judge(good, s, most)).ok  # type: ignore[arg-type]
    assert "GPU health" in status.table([row]) and status.evidence_of(f"{status.MARK}roll\n") is None


def test_plan_gpus_shows_each_host_s_verdict_per_gpu_from_the_same_evidence() -> None:
    def text(faults: dict[str, Any] | None) -> str:
        evidence = "".join(f"\n{probe.MARK}{name.replace('_', '-')}\n{body}" for name, body in smi.sections(faults).items())
        return f"{status.MARK}evidence{evidence}\n{probe.MARK}partitions\n" + "\n".join(["SPX NPS1"] * 8)

    s = spec()
    assert status.evidence_script() in status.script(s)  # plan --gpus reads what status reads, by the fact's probes
    read = {"h0": (s, text(None)), "h1": (s, text({"gpus": {"2": {"uncorrectable": 1}, "5": {"replays": 1}}})), "h2": (s, "")}
    verdicts: dict[str, Any] = {**status.gpu_verdicts(read), "h3": "unreachable: timed out"}  # type: ignore[arg-type]
    assert verdicts["h0"] == [] and verdicts["h2"] is None
    assert {(j.gpu, j.finding.rule) for j in verdicts["h1"]} == {(2, "gpu-ecc-uncorrectable"), (5, "gpu-pcie-replay")}
    lines = cli._verdict_lines(verdicts)
    assert lines[0].startswith("GPU health, read now") and "  h0: ok" in lines and "  h3: unreachable: timed out" in lines
    assert "  h1: 1 error(s), 1 warning(s)" in lines and "    the next deploy quarantines what these errors touch" in lines
    assert any(line.startswith("    error: GPU 2: 1 uncorrectable ECC") and line.endswith("[gpu-ecc-uncorrectable]") for line in lines)
    assert "  h2: no evidence (amd-smi gave none; see the gpu-evidence rule)" in lines
    shown = cli._verdict_json(verdicts["h1"])
    assert shown["read"] is True and {f["gpu"] for f in shown["findings"]} == {2, 5}
    assert cli._verdict_json("unreachable: timed out") == {"read": False, "error": "unreachable: timed out"}
