"""What a deployed instinct-fleet host must look like. Read-only: safe to run against production."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import shlex

import pytest

from instinct_fleet.converge import content, health
from instinct_fleet.model import paths, render, secrets
from instinct_fleet.model.paths import WEIGHTS_COMPLETE, WEIGHTS_STAGED
from instinct_fleet.model.pools import Pool
from instinct_fleet.verify.conftest import Target


def test_preflight_passes(target: Target) -> None:
    assert target.plan.ok, f"{target.name} fails preflight: {[e.brief for e in target.plan.errors]}"


# What the host must hold comes from instinct_fleet/converge/managed.py, the description the deploy acts on;
# this module reads the host with testinfra, independently of the deploy's preflight fact.


def _read_all(target: Target, paths: list[str]) -> dict[str, list[str]]:
    """Per path: [mode, user, group, kind, sha256] as the host has it; absent paths are left out. One command."""
    listed = " ".join(shlex.quote(p) for p in paths)
    out = target.sh(
        f'for p in {listed}; do [ -e "$p" ] || continue; '
        'if [ -f "$p" ]; then h=$(sha256sum < "$p" | cut -d\' \' -f1); else h=-; fi; '
        'printf \'%s|%s|%s\\n\' "$(stat -c \'%a|%U|%G|%F\' "$p")" "$h" "$p"; done'
    )
    found = {}
    for line in out.splitlines():
        mode, user, group, kind, digest, path = line.split("|", 5)
        found[path] = [mode, user, group, kind.replace("regular empty file", "regular file"), digest]
    return found


def test_managed_files_hold_exactly_what_the_deploy_renders(target: Target) -> None:
    wanted = target.plan.desired.files
    found = _read_all(target, [f.path for f in wanted])
    for want in wanted:
        if want.content is None:
            assert want.path not in found, f"{target.name}:{want.path} must not exist"
            continue
        assert want.path in found and found[want.path][3] == "regular file", f"{target.name}:{want.path} is missing"
        mode, user, group, _, digest = found[want.path]
        assert digest == want.sha256, f"{target.name}:{want.path} differs from what the deploy renders"
        assert (mode, user, group) == (want.mode, want.owner, want.group), f"{target.name}:{want.path}"


def test_managed_directories_exist_with_their_owner(target: Target) -> None:
    wanted = target.plan.desired.directories
    found = _read_all(target, [d.path for d in wanted])
    for want in wanted:
        assert want.path in found and found[want.path][3] == "directory", f"{target.name}:{want.path} is not a directory"
        mode, user, group, _, _ = found[want.path]
        assert (user, group) == (want.owner, want.group)
        assert want.mode is None or mode == want.mode


def test_units_are_enabled_and_running_as_desired(target: Target) -> None:
    wanted = target.plan.desired.units
    names = " ".join(shlex.quote(u.name) for u in wanted)
    out = target.sh(
        f"for u in {names}; do printf '%s %s %s\\n' \"$u\" "
        '"$(systemctl is-enabled "$u" 2>/dev/null || true)" "$(systemctl is-active "$u" 2>/dev/null || true)"; done'
    )
    states = {line.split(" ")[0]: line.split(" ")[1:] for line in out.splitlines()}
    for want in wanted:
        enabled, active = states[want.name]
        assert (enabled == "enabled") == want.enabled, f"{target.name}: {want.name} is {enabled or 'not installed'}"
        if want.running is not None:
            assert (active == "active") == want.running, f"{target.name}: {want.name} is {active}"
    installed = [paths.unit_path(u.name) for u in wanted if u.enabled and target.host.file(paths.unit_path(u.name)).exists]
    target.sh(f"systemd-analyze verify {' '.join(map(shlex.quote, installed))}")


def test_host_tuning_is_live(target: Target) -> None:
    want = target.plan.desired
    for key, value in want.sysctl.items():
        assert target.sh(f"cat /proc/sys/{key.replace('.', '/')}").strip() == value
    if target.plan.spec.vars.tune_kernel_cmdline:
        generated = target.sh("cat /boot/grub/grub.cfg")
        assert all(arg in generated for arg in paths.KERNEL_ARGS), "the GRUB config was not regenerated"
    wanted = want.user
    assert wanted is not None, f"{target.name}: no service user planned (the host failed preflight)"
    user = target.host.user(wanted.name)
    assert user.exists and user.home == wanted.home and user.shell == wanted.shell
    assert set(wanted.groups) <= set(user.groups), f"{wanted.name} is in {user.groups}"


def test_docker_has_the_pinned_image(target: Target) -> None:
    if target.plan.desired.image is not None:
        target.sh(f"docker image inspect {shlex.quote(target.plan.desired.image)} >/dev/null")


def test_weights_are_staged_before_the_instances_start(target: Target) -> None:
    """Each model of weights_source is in the host's HF cache, copied whole (the staged marker matches the source's)."""
    for want in target.plan.desired.weights:
        complete = target.sh(f"head -n1 {shlex.quote(want.source + '/' + WEIGHTS_COMPLETE)}").strip()
        assert complete.split()[0] == want.revision, f"{want.source} holds {complete!r}, not revision {want.revision}"
        assert target.sh(f"head -n1 {shlex.quote(want.local + '/' + WEIGHTS_STAGED)}").strip() == complete, (
            f"{target.name}: {want.model} is not staged"
        )
        commit = complete.split()[1]
        assert target.host.file(f"{want.local}/snapshots/{commit}/config.json").exists, f"{target.name}: {want.model} snapshot missing"


def test_metrics_exporter_serves_gpu_metrics(target: Target) -> None:
    v = target.plan.spec.vars
    if target.plan.desired.exporter_image is None:
        assert not target.host.file(paths.unit_path(paths.EXPORTER_UNIT)).exists
        return
    assert target.inspect(paths.EXPORTER_UNIT)["Config"]["Image"] == v.metrics_exporter_image
    metrics = target.sh(f"curl -s http://127.0.0.1:{v.metrics_exporter_port}/metrics")
    for name in v.metrics_exporter_fields:
        assert f"\n{name.lower()}{{" in f"\n{metrics}", f"{target.name}: the exporter does not export {name}"


def _containers(target: Target) -> list[tuple[str, list[str], str]]:
    """(container, the docker run argv the unit holds, its env file text) for every container of the host."""
    plan = target.plan
    found = [(paths.vllm_unit(svc.name), content.vllm_argv(plan, svc), content.env_text(plan, svc)) for svc in plan.serves]
    if plan.role is not None:
        found.append((paths.ray_unit(plan.role), content.ray_argv(plan), content.env_text(plan, plan.spec.services[0])))
    return found


def test_containers_run_exactly_the_rendered_env_and_args(target: Target) -> None:
    for name, argv, env_text in _containers(target):
        info = target.inspect(name)
        config, host_config = info["Config"], info["HostConfig"]
        entrypoint = argv.index("--entrypoint")
        image = argv[entrypoint + 2]
        image_env = set(json.loads(target.sh(f"docker image inspect --format '{{{{json .Config.Env}}}}' {shlex.quote(image)}")) or [])
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
    """Healthy as the health gate, status and bench mean it (health.serving): /health 200, the model listed, one token."""
    key = target.plan.spec.vars.vllm_api_key_path
    for want in target.plan.desired.endpoints:
        if target.host.run(health.serving(want.port, want.served, key, 10, want.generates)).rc != 0:
            code = target.host.run(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{want.port}/health").stdout
            models = target.host.run(health.v1_curl(f"http://127.0.0.1:{want.port}/v1/models", key, 10)).stdout
            pytest.fail(
                f"{target.name}: {want.unit} on :{want.port} is not serving {want.served!r}: /health {code}, /v1/models {models[:300]}"
            )


def test_the_watch_holds_no_instance_out(target: Target) -> None:
    """The watch's verdict by the progress rule (instinct_fleet/model/liveness.py): no instance stalled, restarting or
    left out of its pools."""
    spec = target.plan.spec
    if not spec.vars.watch or not spec.serves:
        assert not target.host.file(paths.unit_path(paths.WATCH_UNIT)).exists
        return
    seen = json.loads(target.sh(f"curl -s -m 5 http://127.0.0.1:{spec.vars.watch_port}/state") or "{}").get("instances", {})
    for svc in spec.serves:
        unit = paths.vllm_unit(svc.name)
        state = seen.get(unit, {})
        if target.plan.quarantined(unit):  # the GPU health verdict holds it out: the watch says so and leaves it be
            assert state.get("state") == "quarantined", (
                f"{target.name}: the watch has quarantined {unit} as {state.get('state', 'unknown')}"
            )
            continue
        assert state.get("state") in ("in", "paused"), (
            f"{target.name}: the watch has {unit} as {state.get('state', 'unknown')} ({state.get('reason', 'its /state does not answer')})"
        )


def test_the_gpus_are_healthy(target: Target) -> None:
    """The GPU health verdict on the preflight fact's amd-smi evidence (converge/gpuhealth.py) finds no error: a GPU in
    error is quarantined by the deploy, and named here until it is fixed."""
    assert not target.plan.health, f"{target.name}: " + "; ".join(f.brief for f in target.plan.health)


def _quarantined_workers(target: Target, pool: Pool) -> set[str]:
    """The pool's workers whose own host's watch says the GPU health verdict holds them out (read from this host)."""
    held = set()
    for line in pool.watch_list.splitlines():
        url, state_url = line.split()
        seen = json.loads(target.host.run(f"curl -s -m 5 {state_url}").stdout or "{}").get("instances", {})
        port = int(url.rsplit(":", 1)[1])
        if any(s.get("port") == port and s.get("state") == "quarantined" for s in seen.values()):
            held.add(url)
    return held


def test_each_router_pool_is_the_inventory_s(target: Target) -> None:
    """Each router answers on its own port and its running pool (its own /list_workers) is every instance of its model
    that serves (the plan leaves out a host that failed preflight or could not be reached), but those quarantined on
    their hosts; its clients' port refuses the worker API."""
    for pool in target.plan.spec.pools:
        listed = target.sh(f"curl -s -m 10 http://127.0.0.1:{pool.admin_port}/list_workers")
        try:
            live = sorted(json.loads(listed)["urls"])
        except (ValueError, KeyError, TypeError):
            pytest.fail(f"{target.name}: the router {pool.unit} on :{pool.admin_port} does not answer /list_workers: {listed[:300]!r}")
        for method, route in (("GET", "/list_workers"), ("POST", "/add_worker?url=http://192.0.2.1:1"), ("GET", "/workers")):
            code = target.sh(f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 -X {method} 'http://127.0.0.1:{pool.port}{route}'")
            assert code == "404", f"{target.name}: the clients' port {pool.port} answers {method} {route} with {code}, not 404"
        assert live == sorted({w.url for w in pool.workers} - _quarantined_workers(target, pool)), (
            f"{target.name}: {pool.unit}'s pool is {live}, the inventory's {pool.worker_list.split()}"
        )


def test_token_never_leaves_its_file(target: Target) -> None:
    v = target.plan.spec.vars
    assert target.plan.report.hf_token, f"{target.name} has no token at {v.hf_token_path} to check"
    token = target.sh(f"cat {shlex.quote(v.hf_token_path)}").strip()
    assert token, "the token file is empty"
    names = [name for name, _, _ in _containers(target)]
    units = " ".join(shlex.quote(paths.unit_path(n)) for n in names)
    envs = " ".join(
        shlex.quote(p)
        for p in [paths.unit_env_path(paths.vllm_unit(s.name)) for s in target.plan.serves] + ([paths.RAY_ENV] if target.plan.role else [])
    )
    places = {
        "unit files": f"cat {units}",
        "env files": f"cat {envs}",
        "process list": "ps -eo args",
        "docker inspect": f"docker inspect {' '.join(map(shlex.quote, names))}",
        "journal": " ".join(["journalctl --no-pager -o cat", *[f"-u {shlex.quote(n)}" for n in names]]),
    }
    for where, command in places.items():
        assert token not in target.sh(command), f"{target.name}: the Hugging Face token appears in the {where}"
    for name in names:
        mounted = target.sh(f"docker exec {shlex.quote(name)} cat {paths.TOKEN_IN_CONTAINER}").strip()
        assert mounted == token, f"{name} does not see the token at {paths.TOKEN_IN_CONTAINER}"


def test_a_managed_token_is_the_control_machines_and_root_alone_reads_it(target: Target) -> None:
    """With hf_token_source, the file on the host holds the token the control machine names, mode 0600, root's."""
    v = target.plan.spec.vars
    token, wrong = secrets.hf_token(target.plan.spec)
    if v.hf_token_source is None:
        return
    assert wrong is None, f"hf_token_source: {wrong}"
    mode = target.sh(f"stat -c '%a %U:%G' {shlex.quote(v.hf_token_path)}").strip()
    assert mode == "600 root:root", f"{target.name}: {v.hf_token_path} is {mode}, not 600 root:root"
    assert target.sh(f"cat {shlex.quote(v.hf_token_path)}").strip() == token, (
        f"{target.name}: {v.hf_token_path} is not the token of {v.hf_token_source}"
    )


def test_api_key_never_leaves_its_file(target: Target) -> None:
    """With vllm_api_key_path, the key is only in that file and, mounted, in each vLLM container: no unit, env file, argv or inspect."""
    path = target.plan.spec.vars.vllm_api_key_path
    if path is None:
        assert not [s for s in target.plan.serves if paths.API_KEY_IN_CONTAINER in render.exec_line(content.vllm_argv(target.plan, s))]
        return
    key = target.sh(f"cat {shlex.quote(path)}").strip()
    assert key and target.sh(f"stat -c '%a %U' {shlex.quote(path)}").strip() == "600 root"
    names = [paths.vllm_unit(s.name) for s in target.plan.serves]
    places = {
        "unit files": f"cat {' '.join(shlex.quote(paths.unit_path(n)) for n in names)}",
        "env files": f"cat {' '.join(shlex.quote(paths.unit_env_path(paths.vllm_unit(s.name))) for s in target.plan.serves)}",
        "process list": "ps -eo args",
        "docker inspect": f"docker inspect {' '.join(map(shlex.quote, names))}",
    }
    for where, command in places.items():
        assert key not in target.sh(command), f"{target.name}: the API key appears in the {where}"
    for name in names:
        assert target.sh(f"docker exec {shlex.quote(name)} cat {paths.API_KEY_IN_CONTAINER}").strip() == key, name


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
    assert units == [paths.service(paths.ray_unit(target.plan.role))]
    if target.plan.role == "worker":
        assert not any(u.startswith("vllm-") for u in target.sh("ls /etc/systemd/system/").split()), "a worker runs no vLLM unit"
        return
    assert target.plan.cluster is not None
    svc = target.plan.spec.services[0]
    *nodes, gpus = json.loads(target.sh(f'docker exec {paths.ray_unit("head")} python3 -c "{ALIVE}" 2>/dev/null').splitlines()[-1])
    assert sorted(nodes) == sorted(target.plan.cluster.member_ips), f"Ray's live nodes {nodes}"
    assert gpus == svc.nodes * target.plan.spec.gpu_count


def test_firewall_table_is_live(target: Target) -> None:
    """The table the deploy wrote is the one the kernel enforces; hosts that need none have none."""
    if not target.plan.desired.firewall:
        assert target.host.run(f"nft list table {paths.FIREWALL_TABLE}").rc != 0, f"{target.name} has a firewall table it should not"
        return
    live = target.sh(f"nft list table {paths.FIREWALL_TABLE}")
    for ip in target.plan.cluster.member_ips if target.plan.cluster else ():
        assert ip in live, f"cluster member {ip} is not in the live cluster_members set"
    allowed = live_set(live, "vllm_allowed")
    for entry in target.plan.spec.vars.vllm_allow_from or () if target.plan.serves else ():  # a Ray worker serves no port
        network = ipaddress.ip_network(entry, strict=False)
        assert any(network.version == n.version and network.subnet_of(n) for n in allowed), (  # type: ignore[arg-type]
            f"{entry} is not in the live vllm_allowed set ({', '.join(map(str, allowed))})"
        )


def live_set(listing: str, name: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The networks of the sets ``<name>_v4`` and ``<name>_v6`` as ``nft list table`` prints them: the deploy merges
    neighbouring addresses into one prefix (10.0.0.4 and 10.0.0.5 into 10.0.0.4/31, as nft requires of an interval
    set), and nft wraps long sets over lines."""
    found: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    inside = False
    for line in listing.splitlines():
        words = line.split()
        if words[:1] == ["set"] and len(words) > 1:
            inside = words[1] in (f"{name}_v4", f"{name}_v6")
        elif words == ["}"]:
            inside = False
        elif inside:
            for token in re.split(r"[\s,{}=]+", line):
                with contextlib.suppress(ValueError):
                    found.append(ipaddress.ip_network(token, strict=False))
    return found
