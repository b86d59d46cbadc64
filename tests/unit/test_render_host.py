"""What the deploy writes on a host: unit Exec lines, env files, docker run and daemon.json."""

from __future__ import annotations

import json
import shlex

from instinct_fleet import render
from instinct_fleet.spec import resolve_host


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
    argv = render.docker_run(b, spec.settings, ["/dev/dri/renderD132", "/dev/dri/renderD133"], [44, 993], with_token=True)
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
    assert devices == ["/dev/kfd", "/dev/dri/renderD132", "/dev/dri/renderD133"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--group-add"] == ["44", "993"]
    assert "/etc/instinct-fleet/hf-token:/run/secrets/hf-token:ro" in argv
    assert argv[argv.index("--ulimit") + 1] == "memlock=-1:-1"
    tail = argv[argv.index("--entrypoint") :]
    assert tail[:5] == ["--entrypoint", "vllm", b.image, "serve", b.model]
    assert tail[5:] == render.render_args(b)


def test_env_file_carries_the_token_path_never_the_token() -> None:
    svc = host().services[0]
    assert render.env_file(svc, with_token=True).splitlines()[-1] == "HF_TOKEN_PATH=/run/secrets/hf-token"
    assert "HF_TOKEN" not in render.env_file(svc, with_token=False)


def test_stop_grace_follows_the_shutdown_timeout() -> None:
    assert render.stop_seconds(host().services[0]) == render.STOP_MARGIN_SECONDS
    assert render.stop_seconds(host(vllm_args={"shutdown-timeout": 120}).services[0]) == 120 + render.STOP_MARGIN_SECONDS


def test_daemon_json_holds_only_what_is_set_and_is_stable() -> None:
    settings = host(docker_insecure_registries=["10.0.0.1:5000"], tune_memlock=False).settings
    assert json.loads(render.daemon_json(settings)) == {"insecure-registries": ["10.0.0.1:5000"]}
    limited = host(tune_memlock=8388608).settings
    assert json.loads(render.daemon_json(limited))["default-ulimits"]["memlock"] == {"Name": "memlock", "Hard": 8388608, "Soft": 8388608}
    assert render.memlock_systemd(True) == "infinity" and render.memlock_systemd(False) is None


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
