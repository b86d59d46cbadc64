"""What a deployed instinct-fleet host must look like. Read-only: safe to run against production."""

from __future__ import annotations

import json

from conftest import Target

from instinct_fleet import render


def managed_files(target: Target) -> dict[str, str | None]:
    """Every file the deploy writes from fixed text, with the content it must have (None: absent).

    Units, env files and docker's settings come from the plan's desired state, the
    same text the deploy writes and the roll hashes.
    """
    plan = target.plan
    settings = plan.spec.settings
    files: dict[str, str | None] = dict(plan.docker_files())
    for unit_files in plan.unit_files.values():
        files.update(unit_files)
    if settings.tune_numa_balancing and plan.report.numa_balancing is not None:
        files[render.SYSCTL_FILE] = render.sysctl_file()
    if settings.tune_kernel_cmdline:
        files[render.GRUB_DROP_IN] = render.grub_drop_in()
    if plan.role is not None:
        files[render.RAY_READY_SCRIPT] = (render.TEMPLATES / "ray-ready.py").read_text()
    ruleset = plan.firewall()
    if ruleset is not None:
        files[render.FIREWALL_FILE] = ruleset
    return files


def test_preflight_passes(target: Target) -> None:
    assert target.plan.ok, f"{target.name} fails preflight: {[e.brief for e in target.plan.errors]}"


def test_managed_files_hold_exactly_what_the_deploy_renders(target: Target) -> None:
    for path, content in managed_files(target).items():
        if content is None:
            assert not target.host.file(path).exists, f"{target.name}:{path} must not exist"
        else:
            assert target.sh(f"cat {path}") == content, f"{target.name}:{path} differs from what the deploy renders"


def test_env_files_are_root_only(target: Target) -> None:
    paths = [render.env_path(svc) for svc in target.plan.serves] + ([render.RAY_ENV] if target.plan.role else [])
    for path in paths:
        assert target.sh(f"stat -c '%a %U' {path}").strip() == "600 root"


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
    units = [render.unit_name(svc) for svc in target.plan.serves]
    if target.plan.role is not None:
        units.append(render.ray_unit(target.plan.role))
    if target.plan.firewall() is not None:
        units.append(render.FIREWALL_UNIT.removesuffix(".service"))
    for unit in units:
        target.sh(f"systemd-analyze verify {render.unit_path(unit)}")
        service = target.host.service(unit)
        assert service.is_enabled and service.is_running, f"{target.name}: {unit} is not enabled and running"


def _containers(target: Target) -> list[tuple[str, list[str], str]]:
    """(container, the docker run argv the unit holds, its env file text) for every container of the host."""
    plan = target.plan
    found = [(render.unit_name(svc), plan.vllm_argv(svc), plan.env_text(svc)) for svc in plan.serves]
    if plan.role is not None:
        found.append((render.ray_unit(plan.role), plan.ray_argv(), plan.env_text(plan.spec.services[0])))
    return found


def test_containers_run_exactly_the_rendered_env_and_args(target: Target) -> None:
    for name, argv, env_text in _containers(target):
        info = target.inspect(name)
        config, host_config = info["Config"], info["HostConfig"]
        entrypoint = argv.index("--entrypoint")
        image = argv[entrypoint + 2]
        image_env = set(json.loads(target.sh(f"docker image inspect --format '{{{{json .Config.Env}}}}' {image}")) or [])
        assert info["State"]["Running"]
        assert config["Image"] == image
        assert config["Entrypoint"] == [argv[entrypoint + 1]]
        assert config["Cmd"] == argv[entrypoint + 3 :]
        assert set(config["Env"]) - image_env == set(env_text.splitlines())
        assert host_config["NetworkMode"] == "host" and host_config["IpcMode"] == "host"
        devices = {d["PathOnHost"] for d in host_config["Devices"]}
        wanted = {argv[i + 1] for i, a in enumerate(argv) if a == "--device"}
        assert devices == wanted, f"{name} sees devices {sorted(devices)}, not {sorted(wanted)}"


def test_endpoints_answer_with_the_model(target: Target) -> None:
    for svc in target.plan.serves:
        assert target.sh(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{svc.port}/health") == "200"
        models = json.loads(target.sh(f"curl -s http://127.0.0.1:{svc.port}/v1/models"))
        assert render.served_model(svc) in [card["id"] for card in models["data"]]


def test_token_never_leaves_its_file(target: Target) -> None:
    settings = target.plan.spec.settings
    assert target.plan.report.hf_token, f"{target.name} has no token at {settings.hf_token_path} to check"
    token = target.sh(f"cat {settings.hf_token_path}").strip()
    assert token, "the token file is empty"
    names = [name for name, _, _ in _containers(target)]
    units = " ".join(render.unit_path(n) for n in names)
    envs = " ".join([render.env_path(s) for s in target.plan.serves] + ([render.RAY_ENV] if target.plan.role else []))
    places = {
        "unit files": f"cat {units}",
        "env files": f"cat {envs}",
        "process list": "ps -eo args",
        "docker inspect": f"docker inspect {' '.join(names)}",
        "journal": " ".join(["journalctl --no-pager -o cat", *[f"-u {n}" for n in names]]),
    }
    for where, command in places.items():
        assert token not in target.sh(command), f"{target.name}: the Hugging Face token appears in the {where}"
    for name in names:
        mounted = target.sh(f"docker exec {name} cat {render.TOKEN_IN_CONTAINER}").strip()
        assert mounted == token, f"{name} does not see the token at {render.TOKEN_IN_CONTAINER}"


ALIVE = (
    "import json, ray; ray.init(address='auto', logging_level='ERROR'); "
    "print(json.dumps([n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']] + [ray.cluster_resources().get('GPU', 0)]))"
)


def test_ray_runs_exactly_where_the_inventory_says(target: Target) -> None:
    """A head's Ray shows every member and GPU; a worker runs only ray-worker; other hosts run no Ray at all."""
    units = target.sh("ls /etc/systemd/system/ | grep '^ray-' || true").split()
    if target.plan.role is None:
        assert units == [], f"{target.name} is in no ray_cluster but has {units}"
        return
    assert units == [f"{render.ray_unit(target.plan.role)}.service"]
    if target.plan.role == "worker":
        assert not any(u.startswith("vllm-") for u in target.sh("ls /etc/systemd/system/").split()), "a worker runs no vLLM unit"
        return
    assert target.plan.cluster is not None
    svc = target.plan.spec.services[0]
    *nodes, gpus = json.loads(target.sh(f'docker exec {render.ray_unit("head")} python3 -c "{ALIVE}" 2>/dev/null').splitlines()[-1])
    assert sorted(nodes) == sorted(target.plan.cluster.member_ips), f"Ray's live nodes {nodes}"
    assert gpus == svc.nodes * target.plan.spec.gpu_count


def test_firewall_table_is_live(target: Target) -> None:
    """The table the deploy wrote is the one the kernel enforces; hosts that need none have none."""
    if target.plan.firewall() is None:
        assert target.host.run("nft list table inet instinct_fleet").rc != 0, f"{target.name} has a firewall table it should not"
        return
    live = target.sh("nft list table inet instinct_fleet")
    for ip in target.plan.cluster.member_ips if target.plan.cluster else ():
        assert ip in live, f"cluster member {ip} is not in the live cluster_members set"
    for entry in target.plan.spec.settings.allow_from or ():
        assert entry.split("/")[0] in live, f"{entry} is not in the live vllm_allowed set"
