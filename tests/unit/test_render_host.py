"""What the deploy writes on a host: unit Exec lines, env files, docker run and daemon.json."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from instinct_fleet.converge import content, firewall, system
from instinct_fleet.model import render
from instinct_fleet.model.spec import resolve_host


def host(**data: object):  # type: ignore[no-untyped-def]
    spec, findings = resolve_host("h1", data)
    assert not findings
    return spec


def test_systemd_quoting_keeps_json_values_whole() -> None:
    value = '{"level": 3, "path": "/tmp/50%"}'
    quoted = render.systemd_quote(value)
    assert quoted == '"{\\"level\\": 3, \\"path\\": \\"/tmp/50%%\\"}"'
    # Without % and $ (which systemd expands), systemd's quoting is the shell's double quoting.
    assert shlex.split(render.systemd_quote('{"a": "b c"}')) == ['{"a": "b c"}']
    assert render.systemd_quote("--max-num-seqs") == "--max-num-seqs"
    assert render.systemd_quote("$HOME") == '"$$HOME"'


def test_exec_line_breaks_before_each_flag() -> None:
    line = render.exec_line(["/usr/bin/docker", "run", "--rm", "--name", "vllm-a", "img", "serve", "m", "--port", "8000"])
    assert line == "/usr/bin/docker run \\\n    --rm \\\n    --name vllm-a img serve m \\\n    --port 8000"


def test_docker_run_gives_each_instance_only_its_own_gpus() -> None:
    spec = host(vllm_recipe="llama-3.1-70b", vllm_instances=[{"name": "a"}, {"name": "b"}])
    b = spec.services[1]
    container = content.vllm_container(b, ["/dev/dri/renderD132", "/dev/dri/renderD133"], 60)
    argv = content.docker_run(container, spec.vars, [44, 993], with_token=True)
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
    assert devices == ["/dev/kfd", "/dev/dri/renderD132", "/dev/dri/renderD133"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--group-add"] == ["44", "993"]
    assert "/etc/instinct-fleet/hf-token:/run/secrets/hf-token:ro" in argv
    assert argv[argv.index("--ulimit") + 1] == "memlock=-1:-1"
    tail = argv[argv.index("--entrypoint") :]
    assert tail[:5] == ["--entrypoint", "vllm", b.image, "serve", b.model]
    # The drain comes last: vLLM 0.22.0 has --shutdown-timeout, so SIGTERM lets in-flight requests finish.
    assert tail[5:] == [*render.render_args(b), "--shutdown-timeout", "60"]


def test_drain_uses_shutdown_timeout_only_where_the_version_has_it() -> None:
    own = host(vllm_args={"shutdown-timeout": 120}).services[0]
    assert render.drain_args(own, 60) == []  # the instance's own value is already in its flags
    assert render.stop_seconds(own, 60) == 120 + render.STOP_MARGIN_SECONDS
    old = host(vllm_version="0.11.0", vllm_image="vllm/vllm-openai-rocm:v0.11.0").services[0]
    assert render.drain_args(old, 60) == []  # 0.11.0 has no --shutdown-timeout: docker stop's grace only
    assert render.stop_seconds(old, 60) == 60 + render.STOP_MARGIN_SECONDS


def test_env_file_carries_the_token_path_never_the_token() -> None:
    env = host().services[0].env
    assert render.env_file(env, with_token=True).splitlines()[-1] == "HF_TOKEN_PATH=/run/secrets/hf-token"
    assert "HF_TOKEN" not in render.env_file(env, with_token=False)


def test_stop_grace_follows_the_shutdown_timeout() -> None:
    assert render.stop_seconds(host().services[0], 60) == 60 + render.STOP_MARGIN_SECONDS
    assert render.stop_seconds(host(vllm_args={"shutdown-timeout": 120}).services[0], 60) == 120 + render.STOP_MARGIN_SECONDS


def test_daemon_json_holds_only_what_is_set_and_is_stable() -> None:
    settings = host(docker_insecure_registries=["10.0.0.1:5000"], tune_memlock=False).vars
    assert json.loads(system.daemon_json(settings)) == {"insecure-registries": ["10.0.0.1:5000"]}
    limited = host(tune_memlock=8388608).vars
    assert json.loads(system.daemon_json(limited))["default-ulimits"]["memlock"] == {"Name": "memlock", "Hard": 8388608, "Soft": 8388608}
    assert system.memlock_systemd(True) == "infinity" and system.memlock_systemd(False) is None


def test_served_model_name_wins_for_the_health_check() -> None:
    assert render.served_model(host(vllm_args={"served-model-name": "chat"}).services[0]) == "chat"
    assert render.served_model(host().services[0]) == "openai/gpt-oss-120b"


def test_settings_types_are_checked() -> None:
    _, findings = resolve_host("h1", {"tune_memlock": -5, "health_timeout": "soon", "docker_registry_mirrors": "http://m"})
    assert {(f.rule, f.key) for f in findings} == {
        ("schema", "tune_memlock"),
        ("schema", "health_timeout"),
        ("schema", "docker_registry_mirrors"),
    }


def test_ray_start_pins_every_port() -> None:
    from instinct_fleet.model.defaults import RAY_PORTS
    from instinct_fleet.model.spec import ClusterSpec

    head = ClusterSpec("c", "head", dict(RAY_PORTS), 600, "eth0", None, None, None, 112, False)
    argv = content.ray_start(head, "10.0.0.1", "10.0.0.1", 8)
    assert argv[:4] == ["start", "--block", "--head", "--port=6379"]
    assert "--node-ip-address=10.0.0.1" in argv and "--num-gpus=8" in argv and "--include-dashboard=false" in argv
    pinned = {a.split("=")[0] for a in argv if a.startswith("--") and "port" in a}
    assert len(pinned) == len(RAY_PORTS) - 1  # each Ray port has its flag, but Ray Client's default 10001
    worker = ClusterSpec("c", "worker", dict(RAY_PORTS), 600, "eth0", None, None, None, 112, False)
    assert content.ray_start(worker, "10.0.0.2", "10.0.0.1", 8)[2] == "--address=10.0.0.1:6379"
    assert firewall.ray_ports(head) == ["6379", "8076", "8077", "10001", "52365", "52366", "52367", "52368", "10002-10999"]


def test_firewall_ruleset_names_members_ray_ports_and_allow_list() -> None:
    text = firewall.firewall_ruleset(["10.0.0.2", "10.0.0.1"], ["6379", "10002-10999"], [8000], ("192.168.0.0/16", "fd00::/8"))
    assert "elements = { 10.0.0.2, 10.0.0.1 }" in text
    assert 'tcp dport { 6379, 10002-10999 } counter drop comment "Ray: cluster members only"' in text
    assert "tcp dport { 8000 } ip saddr @vllm_allowed_v4 accept" in text
    assert "elements = { 192.168.0.0/16 }" in text and "elements = { fd00::/8 }" in text
    assert text.index("ip saddr @cluster_members accept") < text.index("counter drop")
    assert text.splitlines()[1:3] == ["table inet instinct_fleet", "flush table inet instinct_fleet"]
    open_ports = firewall.firewall_ruleset([], [], [8000], None)
    # No allow-list: the vLLM port is open to anyone; SSH too; every other port falls to the policy.
    assert 'tcp dport { 8000 } accept comment "vLLM: anyone"' in open_ports and "policy drop;" in open_ports
    assert 'tcp dport { 22 } accept comment "SSH: anyone"' in open_ports and "counter drop" not in open_ports


# A stand-in for `ray start --block` as it behaves when its raylet exits 0: the raylet (a copy of sleep, so
# that its /proc comm reads "raylet") lives until the test ends it, and `ray` blocks on. It notes its
# arguments and a SIGTERM in $NOTES. With $NO_RAYLET it never starts one.
FAKE_RAY = """#!/bin/sh
trap 'echo "ray got TERM" >> "$NOTES"; exit 0' TERM
echo "ray $*" >> "$NOTES"
if [ -z "$NO_RAYLET" ]; then
    cp "$(command -v sleep)" "$NOTES.d/raylet"; "$NOTES.d/raylet" 600 & raylet=$!
fi
while :; do sleep 1; done
"""


def processes() -> list[tuple[int, str, str]]:
    """(pid, comm, command line) of every process still there once read."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            found.append((int(proc.name), (proc / "comm").read_text().strip(), (proc / "cmdline").read_bytes().decode(errors="replace")))
        except OSError:  # it exited between the listing and the read
            continue
    return found


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for the signal (its SigCgt mask in /proc): a shell's trap is set."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def ray_node_in_a_container(tmp_path: Path, no_raylet: bool = False) -> tuple[subprocess.Popen[str], Path]:
    """The Ray node's shell as its container runs it: PID 1 of its own PID namespace, with its own /proc."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ray").write_text(FAKE_RAY)
    (tmp_path / "bin" / "ray").chmod(0o755)
    notes = tmp_path / "notes"
    (tmp_path / "notes.d").mkdir()
    entrypoint, command = content.ray_node(["start", "--block", "--address=10.0.0.1:6379"], poll=1, grace=3)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "NOTES": str(notes),
        **({"NO_RAYLET": "1"} if no_raylet else {}),
    }
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", entrypoint, *command], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 20
    while not (notes.is_file() and "ray start" in notes.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert notes.read_text().startswith("ray start --block --address=10.0.0.1:6379")
    return proc, notes


def test_a_ray_node_whose_raylet_exits_0_exits_1_so_that_systemd_restarts_it(tmp_path: Path) -> None:
    proc, notes = ray_node_in_a_container(tmp_path)  # its raylet lives until the test ends it
    time.sleep(4)  # past the grace of 3 s: the raylet was seen, so the node waits while it lives, however long
    assert proc.poll() is None
    (raylet,) = [pid for pid in processes() if pid[1] == "raylet" and str(tmp_path) in pid[2]]
    os.kill(raylet[0], signal.SIGTERM)  # the raylet shuts itself down; ray start --block runs on
    assert proc.wait(timeout=20) == 1
    assert "this node has no raylet, but ray start --block still runs" in (proc.stderr.read() if proc.stderr else "")
    assert "ray got TERM" in notes.read_text()


def test_a_ray_node_that_never_shows_a_raylet_gives_up_after_its_grace(tmp_path: Path) -> None:
    proc, notes = ray_node_in_a_container(tmp_path, no_raylet=True)
    assert proc.wait(timeout=20) == 1 and "ray got TERM" in notes.read_text()


def test_a_stopped_ray_node_passes_the_stop_on_and_exits_0(tmp_path: Path) -> None:
    proc, notes = ray_node_in_a_container(tmp_path)
    (shell,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()  # PID 1 of the namespace
    deadline = time.monotonic() + 20
    while not catches(int(shell), signal.SIGTERM) and time.monotonic() < deadline:  # its trap is set: ready for a stop
        time.sleep(0.05)
    os.kill(int(shell), signal.SIGTERM)  # docker stop
    assert proc.wait(timeout=20) == 0 and "ray got TERM" in notes.read_text()
