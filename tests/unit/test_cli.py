"""The command line: its JSON contract, exit codes and messages."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from instinct_fleet.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_recipes_json_lists_every_required_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "recipes", "--json")
    names = {r["name"] for r in json.loads(out)}
    assert code == 0
    assert {
        "gpt-oss-120b",
        "gpt-oss-120b-unified",
        "gpt-oss-120b-low-latency",
        "gpt-oss-120b-batch",
        "llama-3.1-70b",
        "llama-3.1-405b-pp2",
        "deepseek-r1",
        "deepseek-r1-dp-ep",
    } <= names


def test_render_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "render", "--recipe", "gpt-oss-120b", "--env", "TORCH_BLAS_PREFER_HIPBLASLT=1", "--arg", "max-num-seqs=256", "--json"
    )
    doc = json.loads(out)
    assert code == 0 and doc["errors"] == [] and doc["warnings"] == []
    (svc,) = doc["services"]
    assert set(svc) == {"name", "host", "image", "model", "env", "vllm_args", "argv", "gpus", "port"}
    assert svc["host"] is None and svc["port"] == 8080 and svc["gpus"] == [0]
    assert svc["env"]["TORCH_BLAS_PREFER_HIPBLASLT"] == "1"
    assert svc["vllm_args"][svc["vllm_args"].index("--max-num-seqs") + 1] == "256"


def test_render_negated_flag_and_dashes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "render", "--recipe", "llama-3.1-70b", "--arg", "--enable-chunked-prefill", "--arg", "--no-trust-remote-code", "--json"
    )
    argv = json.loads(out)["services"][0]["vllm_args"]
    assert code == 0
    assert "--enable-chunked-prefill" in argv and "--no-enable-chunked-prefill" not in argv
    assert "--no-trust-remote-code" in argv


def test_render_validation_error_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "render", "--recipe", "gpt-oss-120b", "--env", "HIP_VISIBLE_DEVICES=0,1", "--json")
    doc = json.loads(out)
    assert code == 1
    assert [e["rule"] for e in doc["errors"]] == ["hip-visible-devices"]
    assert "HIP_VISIBLE_DEVICES" in doc["errors"][0]["message"]


def test_render_warning_keeps_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "render", "--recipe", "gpt-oss-120b", "--arg", "gpu-memory-utilization=0.97")
    assert code == 0 and "[gpu-memory-high]" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["render", "--recipe", "nope"],
        ["render", "--recipe", "gpt-oss-120b", "--env", "NOEQUALS"],
        ["plan", "does/not/exist.py"],
        ["plan", "inventories/prod.py", "--limit", "no-such-host"],
    ],
)
def test_usage_errors_exit_2_without_traceback(
    capsys: pytest.CaptureFixture[str], argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err and err.startswith("instinct-fleet: ")


def test_explain_shows_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "render", "--recipe", "gpt-oss-120b", "--explain", "--arg", "max-num-seqs=64")
    assert code == 0
    assert "--kv-cache-dtype: recipe gpt-oss-120b: FP8 KV cache halves KV memory" in out
    assert "--max-num-seqs: group_data: vllm_args" in out
    assert "# recipe gpt-oss-120b: master switch" in out


def test_plan_example_prod_inventory(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    code, out, _ = run(capsys, "plan", "inventories/prod.py", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["errors"] == []
    hosts = {s["host"] for s in doc["services"]}
    assert hosts == {"mi300x-a01.example.net", "mi300x-a02.example.net", "mi300x-b01.example.net", "mi300x-c01.example.net"}
    assert len([s for s in doc["services"] if s["host"] == "mi300x-a01.example.net"]) == 8
    assert doc["clusters"] == [{"name": "llama405", "head": "mi300x-c01.example.net", "workers": ["mi300x-c02.example.net"]}]
    (head,) = [s for s in doc["services"] if s["host"] == "mi300x-c01.example.net"]
    assert head["env"]["NCCL_SOCKET_IFNAME"] == "ens50f0np0" and head["env"]["NCCL_IB_GID_INDEX"] == "3"
    assert head["vllm_args"][:4] == ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]


def test_plan_resolves_host_over_group_over_all(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "inventories").mkdir()
    (tmp_path / "group_data").mkdir()
    (tmp_path / "inventories" / "t.py").write_text(
        textwrap.dedent(
            """
            llama = [("h1", {"vllm_args": {"max-num-seqs": 64}}), "h2"]
            broken = [("h3", {"vllm_env": {"HIP_VISIBLE_DEVICES": "0"}, "vllm_instanse": []})]
            """
        )
    )
    (tmp_path / "group_data" / "all.py").write_text('vllm_args = {"max-num-seqs": 8}\n')
    (tmp_path / "group_data" / "llama.py").write_text('vllm_recipe = "llama-3.1-70b"\nvllm_args = {"max-num-seqs": 32}\n')
    code, out, _ = run(capsys, "plan", str(tmp_path / "inventories" / "t.py"), "--json", "--project-dir", str(tmp_path))
    doc = json.loads(out)
    seqs = {s["host"]: s["vllm_args"][s["vllm_args"].index("--max-num-seqs") + 1] for s in doc["services"]}
    assert seqs == {"h1": "64", "h2": "32", "h3": "8"}
    assert code == 1
    assert {(e["host"], e["rule"]) for e in doc["errors"]} == {("h3", "hip-visible-devices"), ("h3", "unknown-variable")}
    assert "did you mean 'vllm_instances'" in " ".join(e["message"] for e in doc["errors"])

    code, out, _ = run(capsys, "plan", str(tmp_path / "inventories" / "t.py"), "--json", "--limit", "llama")
    assert code == 0 and {s["host"] for s in json.loads(out)["services"]} == {"h1", "h2"}


def test_broken_inventory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "bad.py").write_text("hosts = [\n")
    code, _, err = run(capsys, "plan", str(tmp_path / "inventories" / "bad.py"))
    assert code == 2 and "cannot load inventory" in err and "Traceback" not in err


def test_render_against_another_vllm_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "render", "--recipe", "gpt-oss-120b-unified", "--vllm-version", "0.11.0", "--json")
    doc = json.loads(out)
    assert code == 1
    assert doc["services"][0]["image"] == "vllm/vllm-openai-rocm:v0.11.0" and doc["warnings"] == []
    assert {e["rule"] for e in doc["errors"]} == {"flag-unknown"}  # 0.11.0 has no --attention-backend


def test_verify_without_its_extra_says_what_to_install(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "testinfra" else real(name, *a))
    assert main(["verify", "inventories/prod.py"]) == 2
    err = capsys.readouterr().err
    assert "pytest-testinfra is not installed" in err and "instinct-fleet[verify]" in err and "Traceback" not in err


def test_empty_and_raising_inventories_say_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.py").write_text("hosts = []\n")
    (tmp_path / "raising.py").write_text("raise FileNotFoundError('.fleet/fleet.json is missing: start the simulated fleet')\n")
    assert main(["plan", str(tmp_path / "empty.py")]) == 2
    assert "lists no host" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "raising.py")]) == 2
    err = capsys.readouterr().err
    assert "FileNotFoundError: .fleet/fleet.json is missing" in err and "limit" not in err and "Traceback" not in err


def test_targets_lists_every_vllm_endpoint_with_its_labels(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    code, out, _ = run(capsys, "targets", "inventories/prod.py")
    groups = json.loads(out)
    # 12 vLLM endpoints (a cluster's worker has none) and the watch of each of the 4 hosts that serve
    assert code == 0 and len(groups) == 8 + 1 + 2 + 1 + 4
    assert sorted(g["targets"][0] for g in groups if g["labels"]["job"] == "instinct-fleet-watch")[0] == "mi300x-a01.example.net:9401"
    by_target = {g["targets"][0]: g["labels"] for g in groups}
    assert by_target["mi300x-a01.example.net:8083"] == {
        "job": "vllm",
        "host": "mi300x-a01.example.net",
        "instance": "gpt-oss-3",
        "model": "openai/gpt-oss-120b",
        "recipe": "gpt-oss-120b",
        "cluster": "",
        "role": "single",
    }
    head = by_target["mi300x-c01.example.net:8000"]
    assert (head["cluster"], head["role"], head["recipe"]) == ("llama405", "head", "llama-3.1-405b-pp2")
    assert not any(t.startswith("mi300x-c02") for t in by_target)


def test_targets_use_the_scrape_address_and_refuse_invalid_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "inventories").mkdir()
    (tmp_path / "group_data").mkdir()
    inventory = tmp_path / "inventories" / "t.py"
    inventory.write_text(
        'hosts = [("h1", {"ssh_hostname": "10.0.0.9", "scrape_address": "10.1.0.9"}), ("h2", {"ssh_hostname": "10.0.0.8"})]\n'
    )
    out_file = tmp_path / "vllm.json"
    code, _, _ = run(capsys, "targets", str(inventory), "-o", str(out_file))
    vllm = [g["targets"] for g in json.loads(out_file.read_text()) if g["labels"]["job"] == "vllm"]
    assert code == 0 and vllm == [["10.1.0.9:8080"], ["10.0.0.8:8080"]]
    bad = tmp_path / "inventories" / "bad.py"
    bad.write_text('hosts = [("h1", {"scrape_address": "10.1.0.9; rm -rf /"})]\n')
    code, out, err = run(capsys, "targets", str(bad))
    assert code == 1 and out == "" and "h1: scrape_address" in err and "[value-format]" in err


def _inventory(tmp_path: Path, text: str) -> Path:
    (tmp_path / "inventories").mkdir(exist_ok=True)
    (tmp_path / "group_data").mkdir(exist_ok=True)
    path = tmp_path / "inventories" / "inv.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_targets_output_is_a_file_whose_directories_are_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _inventory(tmp_path, "hosts = ['gpu-1']\n")
    code, _, err = run(capsys, "targets", str(inventory), "-o", str(tmp_path / "no" / "such" / "t.json"))
    assert code == 0 and json.loads((tmp_path / "no" / "such" / "t.json").read_text())[0]["labels"]["host"] == "gpu-1", err
    code, _, err = run(capsys, "targets", str(inventory), "-o", str(tmp_path))
    assert code == 2 and "is a directory; name the file Prometheus's file_sd_configs reads" in err and "Traceback" not in err


def test_inventory_and_project_dir_mistakes_say_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _inventory(tmp_path, "hosts = ['gpu-1']\n")
    code, _, err = run(capsys, "plan", str(tmp_path / "inventories"))
    assert code == 2 and "is a directory; name the inventory file in it" in err
    code, _, err = run(capsys, "plan", str(inventory), "--project-dir", str(tmp_path / "nowhere"))
    assert code == 2 and "--project-dir" in err and "is not a directory" in err


def test_a_raising_group_data_file_is_blamed_not_the_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = _inventory(tmp_path, "hosts = ['gpu-1']\n")
    (tmp_path / "group_data" / "all.py").write_text("vllm_recipe = 'gpt-oss-120b'\nboom = 1 / 0\n")
    monkeypatch.chdir(tmp_path)  # group_data/ is read from the current directory, as pyinfra reads it
    code, _, err = run(capsys, "plan", str(inventory))
    assert code == 2 and "group data" in err and "all.py" in err and "(line 2)" in err and "ZeroDivisionError" in err


def test_a_top_level_list_named_like_a_variable_is_not_taken_for_hosts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _inventory(tmp_path, "hosts = ['gpu-1']\nvllm_allow_from = ['10.0.0.0/8']\n")
    code, _, err = run(capsys, "plan", str(inventory))
    assert code == 2 and "defines vllm_allow_from at its top level" in err and "group_data" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--concurrency", "0"], "--concurrency values must be 1 or more"),
        (["--concurrency", "eight"], "--concurrency takes comma-separated whole numbers"),
        (["--num-prompts", "0"], "--num-prompts must be 1 or more"),
        (["--warmup", "-1"], "--warmup must be 0 or more"),
        (["--profile", "long"], "more than gpu-1/main's --max-model-len 8192"),
    ],
)
def test_bench_checks_its_arguments_before_contacting_any_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    from .test_inputs import ssh_port

    with ssh_port() as (port, contacted):
        inventory = _inventory(
            tmp_path,
            f"hosts = [('gpu-1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}, "
            "'bench_profiles': {'long': {'input_len': 32768, 'output_len': 512}}})]\n",
        )
        code, _, err = run(capsys, "bench", str(inventory), *argv)
    assert code == 2 and says in err and "no host was contacted" in err and "Traceback" not in err and "unexpected error" not in err
    assert not contacted


def test_status_reports_a_host_that_resets_the_connection_without_a_traceback(tmp_path: Path) -> None:
    """A host whose SSH port accepts and then resets: one line for it, no paramiko traceback, exit 1."""
    import socket
    import struct
    import subprocess
    import sys
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]

    def reset_everyone() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"SSH-2.0-OpenSSH_9.2p1\r\n")  # a banner, then the reset: paramiko's transport thread sees it
            conn.recv(4096)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
            conn.close()

    threading.Thread(target=reset_everyone, daemon=True).start()
    inventory = _inventory(tmp_path, f"hosts = [('gpu-1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {port}}})]\n")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "instinct_fleet.cli", "status", str(inventory)], capture_output=True, text=True, timeout=120
        )
    finally:
        server.close()
    assert done.returncode == 1 and "Traceback" not in done.stderr and "unexpected error" not in done.stderr, done.stderr
    assert "gpu-1" in done.stdout and "unreachable" in done.stdout.lower(), done.stdout


def test_a_connection_lost_mid_command_is_that_hosts_result() -> None:
    from instinct_fleet.live import remote

    class Resetting:
        connected = True

        def run_shell_command(self, *args: object, **kwargs: object) -> None:
            raise ConnectionResetError(104, "Connection reset by peer")

    hosts = remote.Hosts.__new__(remote.Hosts)
    hosts.inventory = type("Inventory", (), {"get_host": lambda self, name: Resetting()})()
    result = hosts.run("gpu-1", "true", 5)
    assert not result.ok and result.error == "connection lost: [Errno 104] Connection reset by peer"


def test_plan_explain_lists_each_managed_thing_with_its_stage_and_what_a_change_runs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    code, out, _ = run(capsys, "plan", "inventories/prod.py", "--explain")
    assert code == 0
    host = out.split("mi300x-a01.example.net manages")[1].split(" manages (")[0]
    for line in (
        "sysctl kernel.numa_balancing  stage tuning",
        "file /etc/default/grub.d/90-instinct-fleet.cfg  644 root:root  stage tuning, a change runs: Regenerate the GRUB configuration",
        "file /etc/instinct-fleet/firewall.nft  600 root:root  stage firewall, a change reloads instinct-fleet-firewall",
        "nftables table inet instinct_fleet  stage firewall, a change reloads instinct-fleet-firewall",
        "file /etc/instinct-fleet/vllm-gpt-oss-0.env  600 root:root  stage roll, a change restarts vllm-gpt-oss-0 in its roll batch",
        "user vllm in render, video  stage tuning",
        "file /etc/instinct-fleet/README  644 root:root  stage services",
    ):
        assert f"  {line}\n" in host, line
    # Only what this host manages: a single node has no Ray files, an exporter that is off is only cleaned up, and
    # the files of settings it does not use (credentials, a token source) are not listed.
    assert "ray-ready.py" not in host and "/var/lib/instinct-fleet/ray" not in host and "/root/.docker/config.json" not in host
    assert "off (metrics_exporter is off): amd-metrics-exporter.service, removed or stopped where an earlier deploy left it" in host
    assert not any(line.startswith("  file /etc/systemd/system/amd-metrics-exporter") for line in host.splitlines())


def test_a_recipe_reason_given_for_another_tp_is_not_shown(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "render", "--recipe", "llama-3.1-70b", "--explain")
    assert code == 0 and "NCCL_MIN_NCHANNELS=112    # recipe llama-3.1-70b: more RCCL channels for TP 4 all-reduces" in out
    code, out, _ = run(capsys, "render", "--recipe", "llama-3.1-70b", "--explain", "--arg", "tensor-parallel-size=8")
    assert code == 0 and "TP 4 all-reduces" not in out
    assert "NCCL_MIN_NCHANNELS=112    # recipe llama-3.1-70b: its reason was given for TP 4, and this instance runs TP 8" in out


def test_warm_refuses_an_invalid_inventory_before_contacting_any_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """instinct-fleet warm is a deploy: the same validation first, and nothing runs on an error (no pyinfra, no SSH)."""
    inventory = _inventory(tmp_path, "hosts = [('gpu-1', {'ssh_hostname': '192.0.2.1', 'compile_cache_keep': 0})]\n")
    (tmp_path / "deploy.py").write_text("from instinct_fleet.deploys import fleet\nfleet()\n")
    code, _, err = run(capsys, "warm", str(inventory), "--project-dir", str(tmp_path), "-y")
    assert code == 1 and "compile_cache_keep" in err and "nothing was warmed and no host was contacted" in err
    assert "Traceback" not in err
    off = inventory.with_name("off.py")
    off.write_text("hosts = [('gpu-1', {'ssh_hostname': '192.0.2.1', 'compile_cache_spread': False})]\n")
    code, _, err = run(capsys, "warm", str(off), "--project-dir", str(tmp_path), "-y")
    assert code == 2 and "compile_cache_spread is False" in err and "Traceback" not in err


def _inventory_commands() -> dict[str, list[str]]:
    """Every subcommand that takes an inventory, read off the parser, with the arguments it needs besides it."""
    from instinct_fleet.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    needs = {"tune": ["--instance", "main", "--vary", "max-num-seqs=8,16"], "quarantine": ["gpu-1", "--reason", "RMA"], "admit": ["gpu-1"]}
    return {
        name: needs.get(name, [])
        for name, sub in subparsers.choices.items()  # type: ignore[union-attr]
        if any(a.dest == "inventory" and not a.option_strings for a in sub._actions)  # vllm-facts' --inventory is optional
    }


def test_every_command_with_an_inventory_is_covered() -> None:
    assert set(_inventory_commands()) == {
        *("plan", "deploy", "verify", "rollback", "warm", "status", "bench", "targets", "tune", "quarantine", "admit"),
    }


@pytest.mark.parametrize("command", sorted(_inventory_commands()))
def test_every_command_reads_the_inventorys_project_wherever_it_starts(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From another directory, each command reads the group data of the project the inventory sits in (here a mistake
    in it stops the command before any contact); an inventory in no project, run from no project, is refused."""
    from instinct_fleet import scaffold

    project = tmp_path / "infra"
    scaffold.init(project)
    inventory = project / "inventories" / "t.py"
    inventory.write_text("gpu = ['gpu-1']\n")
    (project / "group_data" / "gpu.py").write_text("vllm_recipe = 'llama-3.1-70b'\nvllm_argz = {}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    extra = _inventory_commands()[command]
    code, _, err = run(capsys, command, str(inventory), *extra)
    assert code == 1 and "gpu-1" in err and "vllm_argz" in err and "[unknown-variable]" in err, err

    lone = elsewhere / "hosts.py"
    lone.write_text("hosts = ['gpu-1']\n")
    code, _, err = run(capsys, command, str(lone), *extra)
    assert code == 2 and f"no project for {lone}" in err and "--project-dir" in err, err


def test_plan_from_elsewhere_sees_what_plan_in_the_project_sees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from instinct_fleet import scaffold

    project = tmp_path / "infra"
    scaffold.init(project)
    (project / "inventories" / "t.py").write_text("gpu = ['gpu-1']\n")
    (project / "group_data" / "gpu.py").write_text("vllm_recipe = 'llama-3.1-70b'\n")
    monkeypatch.chdir(project)
    inside = run(capsys, "plan", "inventories/t.py", "--json")
    monkeypatch.chdir(tmp_path)
    outside = run(capsys, "plan", "infra/inventories/t.py", "--json")
    assert inside == outside and json.loads(inside[1])["services"][0]["name"] == "main"
    assert "--max-num-seqs" in json.loads(outside[1])["services"][0]["vllm_args"]  # the Llama recipe's, not gpt-oss's


def test_targets_of_hosts_that_serve_nothing_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty selection says so: an empty file_sd would leave Prometheus scraping nothing, silently."""
    inventory = _inventory(tmp_path, "hosts = [('cpu-1', {'vllm_instances': []})]\n")
    out_file = tmp_path / "t.json"
    code, _, err = run(capsys, "targets", str(inventory), "-o", str(out_file))
    assert code == 2 and "serve no vLLM instance, metrics exporter or router" in err and not out_file.exists()


def test_quarantine_and_admit_name_one_host_of_the_inventory_before_any_contact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from instinct_fleet import scaffold

    project = tmp_path / "infra"
    scaffold.init(project)
    inventory = project / "inventories" / "t.py"
    inventory.write_text("gpu = ['gpu-1', 'gpu-2']\n")
    monkeypatch.chdir(project)
    for argv, said in (
        (["quarantine", str(inventory), "gpu-9", "--reason", "x"], "gpu-9 is not a host of"),
        (["admit", str(inventory), "gpu"], "gpu is not a host of"),
        (["quarantine", str(inventory), "gpu-1", "--gpu", "8", "--reason", "x"], "gpu-1 has GPUs 0 to 7 (gpu_count), not 8"),
    ):
        code, _, err = run(capsys, *argv)
        assert code == 2 and said in err, (argv, err)
    with pytest.raises(SystemExit):
        run(capsys, "quarantine", str(inventory), "gpu-1")  # --reason is required
    assert "--reason" in capsys.readouterr().err


def test_the_image_decides_the_version_from_an_init_project(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new user's AMD image with no vllm_version: validated as 0.11.1, which has no table, so plan and deploy refuse
    plainly before any contact; a vllm_version that disagrees with the tag names both files; the opt-in deploys it
    unchecked, said on every plan."""
    from instinct_fleet import scaffold

    image = "rocm/vllm:rocm7.0.0_vllm_0.11.1_20251103"

    def project(name: str, gpu: str, version_in_all: bool = False) -> Path:
        root = tmp_path / name  # a project each: pyinfra reads a group_data file once per process
        scaffold.init(root)
        (root / "inventories" / "t.py").write_text("gpu = [('gpu-1', {'ssh_hostname': '192.0.2.1'})]\n")
        (root / "group_data" / "gpu.py").write_text(gpu)
        if version_in_all:
            all_py = root / "group_data" / "all.py"
            all_py.write_text(all_py.read_text().replace("# vllm_version = '0.22.0'", "vllm_version = '0.22.0'"))
        monkeypatch.chdir(root)
        return root

    project("tag", f"vllm_image = {image!r}\n")
    code, out, err = run(capsys, "plan", "inventories/t.py")
    assert code == 1 and "error: gpu-1: vllm_version: not validated: no table for vLLM 0.11.1" in err, err
    assert "vLLM 0.11.1: not validated: no table (instinct-fleet vllm-facts 0.11.1)" in out
    code, _, err = run(capsys, "deploy", "inventories/t.py", "-y")
    assert code == 1 and "no table for vLLM 0.11.1" in err and "nothing was deployed and no host was contacted" in err
    root = project("both", f"vllm_image = {image!r}\n", version_in_all=True)
    line = (root / "group_data" / "all.py").read_text().splitlines().index("vllm_version = '0.22.0'") + 1
    code, _, err = run(capsys, "plan", "inventories/t.py")
    assert code == 1 and f"vllm_version: is '0.22.0' but vllm_image {image!r} runs vLLM 0.11.1" in err, err
    assert f"(set in group_data/all.py line {line}; vllm_image set in group_data/gpu.py line 1) [image-version-mismatch]" in err
    project("unvalidated", f"vllm_image = {image!r}\nvllm_version_unvalidated = True\n")
    code, _, err = run(capsys, "plan", "inventories/t.py")  # the watch reads the version's own metric names
    assert code == 1 and "error: gpu-1: watch: the watch reads the pinned vLLM's own metric names" in err, err
    project("unwatched", f"vllm_image = {image!r}\nvllm_version_unvalidated = True\nwatch = False\n")
    code, out, err = run(capsys, "plan", "inventories/t.py", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["tables"] == {"0.11.1": "none"} and [w["rule"] for w in doc["warnings"]] == ["version-unsupported"]


def test_the_command_line_suggests_and_refuses_before_any_side_effect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt command or option gets the closest one, even where argparse would first miss an argument; --version;
    vllm-facts takes a git tag's spelling, refuses a non-version before pip runs, and shows a shipped table."""
    from instinct_fleet import __version__, scaffold

    def usage(*argv: str) -> str:
        with pytest.raises(SystemExit) as stop:
            main(list(argv))
        assert stop.value.code == 2
        return capsys.readouterr().err

    assert "no command 'plna'; did you mean 'plan'?" in usage("plna")
    assert "plan takes no option --expalin; did you mean --explain?" in usage("plan", "--expalin")
    assert "plan takes no option --expalin; did you mean --explain?" in usage("plan", "inventories/t.py", "--expalin")
    assert "deploy takes no option --dyr; did you mean --dry?" in usage("deploy", "inv.py", "--dyr", "--", "--debug")
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"instinct-fleet {__version__}\n"
    project = tmp_path / "infra"
    scaffold.init(project)
    monkeypatch.chdir(project)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip ran"))  # no download for any of these
    code, _, err = run(capsys, "vllm-facts", "v0.22.0")
    assert code == 2 and "vLLM 0.22.0 is shipped" in err and "`instinct-fleet vllm-facts 0.22.0 --show`" in err
    code, _, err = run(capsys, "vllm-facts", "latest")
    assert code == 2 and "'latest' is not a vLLM version" in err
    code, out, err = run(capsys, "vllm-facts", "v0.22.0", "--show")
    assert code == 0 and json.loads(out)["version"] == "0.22.0" and "shipped with instinct-fleet" in err
    code, _, err = run(capsys, "vllm-facts", "0.11.1", "--show")
    assert code == 2 and "no table for vLLM 0.11.1" in err
    assert not (project / "vllm-facts").exists()


def test_a_mapping_replaced_at_a_narrower_level_is_said_with_both_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """all.py sets TP 8, a group's vllm_args replaces the mapping: the dropped TP changes the GPUs an instance takes, an
    error naming both files; a dropped flag that changes nothing is a warning; repeating the keys ends it; --explain
    names the file and line of every flag the inventory set."""
    from instinct_fleet import scaffold

    def project(name: str, everyone: str, gpu: str, host: str = "") -> None:
        root = tmp_path / name  # a project and an inventory name each: pyinfra reads a file once per process
        scaffold.init(root)
        all_py = root / "group_data" / "all.py"
        all_py.write_text(all_py.read_text() + everyone)
        (root / "group_data" / "gpu.py").write_text(gpu)
        (root / "inventories" / f"{name}.py").write_text(f"gpu = [('gpu-1', {{'ssh_hostname': '192.0.2.1'{host}}}), 'gpu-2']\n")
        monkeypatch.chdir(root)

    eight = ", 'vllm_instances': [{'name': 'main', 'gpus': list(range(8))}]"
    project("tp", "vllm_args = {'tensor-parallel-size': 8, 'max-model-len': 16384}\n", "vllm_args = {'max-num-seqs': 256}\n", eight)
    line = len((tmp_path / "tp" / "group_data" / "all.py").read_text().splitlines())
    code, _, err = run(capsys, "plan", "inventories/tp.py")
    assert code == 1, err
    dropped = f"vllm_args: replaces the whole mapping set in group_data/all.py line {line}, dropping tensor-parallel-size, max-model-len: "
    assert f"error: gpu-1..2: {dropped}" in err and "[mapping-replaced-parallel]" in err and "(set in group_data/gpu.py line 1)" in err
    project(
        "kept",
        "vllm_args = {'tensor-parallel-size': 8, 'max-model-len': 16384}\n",
        "vllm_args = {'tensor-parallel-size': 8, 'max-num-seqs': 256}\n",
        eight,
    )
    code, out, err = run(capsys, "plan", "inventories/kept.py", "--explain", "--limit", "gpu-1")
    assert code == 0 and "error:" not in err, err
    assert "warning: gpu-1: vllm_args: replaces the whole mapping set in group_data/all.py line" in err
    assert "dropping max-model-len: " in err and "[mapping-replaced]" in err
    assert "--max-num-seqs: group_data: vllm_args, set in group_data/gpu.py line 1" in out
    assert "--tensor-parallel-size: group_data: vllm_args, set in group_data/gpu.py line 1" in out
    code, out, _ = run(capsys, "plan", "inventories/kept.py", "--explain", "--json", "--limit", "gpu-1")
    reasons = json.loads(out)["services"][0]["reasons"]  # the same words in JSON
    assert reasons["--max-num-seqs"] == "group_data: vllm_args, set in group_data/gpu.py line 1"
    assert reasons["VLLM_ROCM_USE_AITER"].startswith("recipe gpt-oss-120b: ")
    code, out, _ = run(capsys, "plan", "inventories/kept.py", "--json", "--limit", "gpu-1")
    assert "reasons" not in json.loads(out)["services"][0]  # the --json contract without --explain is unchanged
    project("all", "vllm_args = {'max-model-len': 16384}\n", "vllm_args = {'max-model-len': 16384, 'max-num-seqs': 256}\n")
    code, _, err = run(capsys, "plan", "inventories/all.py")
    assert code == 0 and "mapping-replaced" not in err, err
