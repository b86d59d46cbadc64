"""What a deployed instinct-fleet host must look like. Read-only: safe to run against production."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Target
from pyinfra.api.util import get_template

from instinct_fleet import render

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def managed_files(target: Target) -> dict[str, str]:
    """Every file the deploy writes from fixed text, with the content it must have for this host's settings."""
    plan = target.plan
    settings = plan.spec.settings
    files = {"/etc/docker/daemon.json": render.daemon_json(settings)}
    if settings.tune_numa_balancing and plan.report.numa_balancing is not None:
        files[render.SYSCTL_FILE] = render.sysctl_file()
    if settings.tune_kernel_cmdline:
        files[render.GRUB_DROP_IN] = render.grub_drop_in()
    memlock = render.memlock_systemd(settings.tune_memlock)
    if memlock:
        files[render.DOCKER_DROP_IN] = get_template(str(TEMPLATES / "docker-limits.conf.j2")).render(memlock=memlock)
    for svc in plan.spec.services:
        files[render.env_path(svc)] = render.env_file(svc, plan.report.hf_token)
        files[f"/etc/systemd/system/{render.unit_name(svc)}.service"] = get_template(str(TEMPLATES / "vllm.service.j2")).render(
            **plan.unit_vars(svc)
        )
    return files


def test_preflight_passes(target: Target) -> None:
    assert target.plan.ok, f"{target.name} fails preflight: {target.plan.errors}"


def test_managed_files_hold_exactly_what_the_deploy_renders(target: Target) -> None:
    for path, content in managed_files(target).items():
        assert target.sh(f"cat {path}") == content, f"{target.name}:{path} differs from what the deploy renders"


def test_env_files_are_root_only(target: Target) -> None:
    for svc in target.plan.spec.services:
        assert target.sh(f"stat -c '%a %U' {render.env_path(svc)}").strip() == "600 root"


def test_host_tuning_is_live(target: Target) -> None:
    settings = target.plan.spec.settings
    if settings.tune_numa_balancing and target.plan.report.numa_balancing is not None:
        assert target.sh("cat /proc/sys/kernel/numa_balancing").strip() == "0"
    if settings.tune_kernel_cmdline:
        generated = target.sh("cat /boot/grub/grub.cfg")
        assert "iommu=pt" in generated and "pci=realloc=off" in generated, "the GRUB config was not regenerated"
    if settings.tune_cpu_idle:
        assert target.host.service(render.CPU_IDLE_UNIT).is_enabled
    groups = target.host.user(settings.service_user).groups
    assert {"render", "video"} <= set(groups), f"{settings.service_user} is in {groups}"


def test_docker_runs_with_the_pinned_image(target: Target) -> None:
    docker = target.host.service("docker")
    assert docker.is_running and docker.is_enabled
    images = {svc.image for svc in target.plan.spec.services}
    for image in images:
        target.sh(f"docker image inspect {image} >/dev/null")


def test_units_pass_systemd_analyze_and_run(target: Target) -> None:
    for svc in target.plan.spec.services:
        unit = render.unit_name(svc)
        target.sh(f"systemd-analyze verify /etc/systemd/system/{unit}.service")
        service = target.host.service(unit)
        assert service.is_enabled and service.is_running, f"{target.name}: {unit} is not enabled and running"


def test_containers_run_exactly_the_rendered_env_and_args(target: Target) -> None:
    for svc in target.plan.spec.services:
        info = target.inspect(render.unit_name(svc))
        config, host_config = info["Config"], info["HostConfig"]
        image_env = set(json.loads(target.sh(f"docker image inspect --format '{{{{json .Config.Env}}}}' {svc.image}")) or [])
        rendered = set(render.env_file(svc, target.plan.report.hf_token).splitlines())
        assert info["State"]["Running"]
        assert config["Image"] == svc.image
        assert config["Entrypoint"] == ["vllm"]
        assert config["Cmd"] == ["serve", svc.model, *render.render_args(svc)]
        assert set(config["Env"]) - image_env == rendered
        assert host_config["NetworkMode"] == "host" and host_config["IpcMode"] == "host"
        devices = {d["PathOnHost"] for d in host_config["Devices"]}
        assert devices == {"/dev/kfd", *target.plan.devices(svc)}, f"{svc.name} sees GPUs other than {list(svc.gpus)}"


def test_endpoints_answer_with_the_model(target: Target) -> None:
    for svc in target.plan.spec.services:
        assert target.sh(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{svc.port}/health") == "200"
        models = json.loads(target.sh(f"curl -s http://127.0.0.1:{svc.port}/v1/models"))
        assert render.served_model(svc) in [card["id"] for card in models["data"]]


def test_token_never_leaves_its_file(target: Target) -> None:
    settings = target.plan.spec.settings
    assert target.plan.report.hf_token, f"{target.name} has no token at {settings.hf_token_path} to check"
    token = target.sh(f"cat {settings.hf_token_path}").strip()
    assert token, "the token file is empty"
    units = " ".join(f"/etc/systemd/system/{render.unit_name(s)}.service" for s in target.plan.spec.services)
    envs = " ".join(render.env_path(s) for s in target.plan.spec.services)
    names = " ".join(render.unit_name(s) for s in target.plan.spec.services)
    places = {
        "unit files": f"cat {units}",
        "env files": f"cat {envs}",
        "process list": "ps -eo args",
        "docker inspect": f"docker inspect {names}",
        "journal": " ".join(["journalctl --no-pager -o cat", *[f"-u {render.unit_name(s)}" for s in target.plan.spec.services]]),
    }
    for where, command in places.items():
        assert token not in target.sh(command), f"{target.name}: the Hugging Face token appears in the {where}"
    for svc in target.plan.spec.services:
        mounted = target.sh(f"docker exec {render.unit_name(svc)} cat {render.TOKEN_IN_CONTAINER}").strip()
        assert mounted == token, f"{svc.name} does not see the token at {render.TOKEN_IN_CONTAINER}"
