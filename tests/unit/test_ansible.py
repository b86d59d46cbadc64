"""Ansible inventories read as Ansible reads them: held to the real ``ansible-inventory --list`` (ansible-core).

A generated 64-host inventory with three levels of children, ``vars`` at every level, group_vars and host_vars in
both file forms and overrides at every level, in YAML, in INI and as ansible-inventory's own JSON: every host's
groups and merged variables equal Ansible's. A Hypothesis property draws smaller inventories and holds the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instinct_fleet.cli import main as cli_main
from instinct_fleet.model import ansible
from instinct_fleet.model.inventory import load_inventory, plan_hosts

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"


def ansibles(inventory: Path) -> dict[str, tuple[set[str], dict[str, Any]]]:
    """Each host's groups (every ancestor, ``all`` included) and merged variables, as ansible-inventory gives them."""
    env = {**os.environ, "ANSIBLE_LOCAL_TEMP": str(inventory.parent / ".ansible-tmp"), "ANSIBLE_HOME": str(inventory.parent / ".ansible")}
    done = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(inventory), "--list"], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    groups: dict[str, set[str]] = {}

    def walk(name: str, above: set[str]) -> None:
        body = listed.get(name, {})
        for host in body.get("hosts", []):
            groups.setdefault(host, set()).update(above | {name})
        for child in body.get("children", []):
            walk(child, above | {name})

    walk("all", set())
    hostvars = listed["_meta"]["hostvars"]  # a host without variables is left out of it
    return {host: (groups[host], hostvars.get(host, {})) for host in groups}


def ours(inventory: Path) -> dict[str, tuple[set[str], dict[str, Any]]]:
    return {name: (set(host.groups), host.vars) for name, host in ansible.read(inventory).items()}


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


# The same fleet in YAML and INI: 64 GPU hosts (48 MI300X in two racks of 24, 16 MI325X), a router, overrides at
# every level; group_vars and host_vars in both forms (a file, a directory of files).
YAML = """
all:
  vars: {level: all, vllm_recipe: gpt-oss-120b, shared: from-all, rolling_batch: 1}
  hosts:
    router-01: {ansible_host: 10.0.9.1, level: router}
  children:
    fleet:
      vars: {level: fleet, gpu_count: 8, ansible_user: deploy, zone: fleet}
      children:
        mi300x:
          vars: {level: mi300x, gpu_model: MI300X, shared: from-mi300x}
          children:
            rack_a:
              vars: {level: rack_a, ansible_group_priority: 5}
              hosts:
                gpu-a[01:24]:
            rack_b:
              vars: {level: rack_b}
              hosts:
                gpu-b[01:24]:
                  ansible_port: 2222
        mi325x:
          vars: {level: mi325x, gpu_model: MI325X}
          hosts:
            gpu-c[01:16]:
    canary:
      hosts:
        gpu-a01: {level: canary-host, tags: [first, "quoted, text"]}
    aaa:
      vars: {zone: aaa, ansible_group_priority: 10}
      hosts:
        gpu-a03:
"""
INI = """
router-01 ansible_host=10.0.9.1 level=router

[rack_a]
gpu-a[01:24]

[rack_b]
gpu-b[01:24] ansible_port=2222

[mi325x]
gpu-c[01:16]

[canary]
gpu-a01 level=canary-host tags="['first', 'quoted, text']"

[aaa]
gpu-a03

[aaa:vars]
zone=aaa
ansible_group_priority=10

[mi300x:children]
rack_a
rack_b

[fleet:children]
mi300x
mi325x

[all:vars]
level=all
vllm_recipe=gpt-oss-120b
shared=from-all
rolling_batch=1

[fleet:vars]
level=fleet
gpu_count=8
zone=fleet
ansible_user=deploy

[mi300x:vars]
level=mi300x
gpu_model=MI300X
shared=from-mi300x

[rack_a:vars]
level=rack_a
ansible_group_priority=5

[rack_b:vars]
level=rack_b

[mi325x:vars]
level=mi325x
gpu_model=MI325X
"""
VARS = {
    "group_vars/all.yml": "from_all_file: 1\nshared: from-all-file\n",
    "group_vars/fleet/10-first.yml": "level: fleet-file\nfleet_file: [1, 2]\n",
    "group_vars/fleet/20-second.yaml": "fleet_file: [3]\n",
    "group_vars/rack_b.json": '{"rack_b_file": true, "level": "rack_b-file"}\n',
    "group_vars/mi325x": "level: mi325x-file\n",
    "host_vars/gpu-a02.yml": "level: a02-file\n",
    "host_vars/gpu-c16/main.yml": "level: c16-file\nvllm_instances: [{name: main, gpus: [2]}]\n",
}


@pytest.mark.parametrize("form", ["hosts.yml", "hosts.ini", "hosts"])
def test_a_64_host_inventory_reads_as_ansible_reads_it(tmp_path: Path, form: str) -> None:
    write(tmp_path, {form: YAML if form.endswith(".yml") else INI, **VARS})
    expected = ansibles(tmp_path / form)
    assert len([h for h in expected if h.startswith("gpu-")]) == 64
    assert ours(tmp_path / form) == expected
    # Every layer decides somewhere: the file beside the inventory over its vars, the host over the group.
    got = ansible.read(tmp_path / form)
    assert got["gpu-a02"].vars["level"] == "a02-file" and got["gpu-b07"].vars["level"] == "rack_b-file"
    assert got["gpu-a01"].vars["level"] == "canary-host" and got["gpu-c03"].vars["level"] == "mi325x-file"
    assert got["gpu-a05"].vars["shared"] == "from-all-file" and got["gpu-a05"].vars["fleet_file"] == [3]
    # Two groups at one depth: the higher ansible_group_priority wins, whatever the names' order.
    assert (got["gpu-a03"].vars["zone"], got["gpu-a04"].vars["zone"]) == ("aaa", "fleet")


def test_ansible_inventory_s_own_json_reads_back_the_same(tmp_path: Path) -> None:
    write(tmp_path / "src", {"hosts.yml": YAML, **VARS})
    env = {**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".t"), "ANSIBLE_HOME": str(tmp_path / ".a")}
    listed = subprocess.run(
        [str(ANSIBLE_INVENTORY), "-i", str(tmp_path / "src" / "hosts.yml"), "--list"], capture_output=True, text=True, env=env
    )
    (tmp_path / "hosts.json").write_text(listed.stdout)
    assert ours(tmp_path / "hosts.json") == ansibles(tmp_path / "src" / "hosts.yml")


names = st.sampled_from(["a", "b", "c", "d", "e"])
values = st.one_of(st.integers(-5, 5), st.sampled_from(["x", "y", "yes", "on"]), st.lists(st.integers(0, 3), max_size=2))
var_maps = st.dictionaries(st.sampled_from(["level", "shared", "n", "vllm_recipe"]), values, max_size=3)


@st.composite
def inventories(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """A group tree under ``all`` (no cycles: a child comes later in the order), hosts in several groups, and vars
    in the tree, in group_vars files and in host_vars files."""
    order = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    tree: dict[str, Any] = {"all": {"vars": draw(var_maps), "children": {}}}
    bodies = {"all": tree["all"]}
    for i, name in enumerate(order):
        parent = draw(st.sampled_from(["all", *order[:i]]))
        body: dict[str, Any] = {"vars": draw(var_maps), "hosts": {}, "children": {}}
        for host in draw(st.lists(st.sampled_from(["h1", "h2", "h3", "h4"]), max_size=3, unique=True)):
            body["hosts"][host] = draw(var_maps) or None
        bodies[parent].setdefault("children", {})[name] = body
        bodies[name] = body
    group_files = {g: draw(var_maps) for g in draw(st.lists(st.sampled_from(["all", *order]), max_size=3, unique=True))}
    host_files = {h: draw(var_maps) for h in draw(st.lists(st.sampled_from(["h1", "h2", "h3"]), max_size=2, unique=True))}
    return tree, group_files, host_files


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(inventories())
def test_drawn_inventories_merge_as_ansible_merges_them(tmp_path_factory: pytest.TempPathFactory, drawn: Any) -> None:
    tree, group_files, host_files = drawn
    root = tmp_path_factory.mktemp("drawn")
    files = {"hosts.yml": json.dumps(tree)}  # JSON is YAML
    files |= {f"group_vars/{g}.yml": json.dumps(v) for g, v in group_files.items()}
    files |= {f"host_vars/{h}.yml": json.dumps(v) for h, v in host_files.items()}
    write(root, files)
    assert ours(root / "hosts.yml") == ansibles(root / "hosts.yml")


@pytest.mark.parametrize(
    ("files", "said"),
    [
        (
            {"hosts.yml": "all:\n  hosts:\n    h1:\n      vllm_model: '{{ model }}'\n"},
            "hosts.yml:4: vllm_model: '{{ model }}' is a Jinja expression",
        ),
        (
            {"hosts.yml": "all:\n  vars:\n    hf_token_source: !vault |\n      $ANSIBLE_VAULT;1.1;AES256\n      3334\n"},
            "hosts.yml:3: hf_token_source: a vault-encrypted value",
        ),
        ({"hosts.ini": "[g]\nh1 ansible_user='$ANSIBLE_VAULT;1.1;AES256'\n"}, "hosts.ini:2: ansible_user: a vault-encrypted value"),
        ({"hosts.yml": "all:\n  children:\n    a:\n      children:\n        a:\n"}, "hosts.yml:5: group 'a' is its own child"),
        ({"hosts.ini": "[a:children]\nb\n[b:children]\na\n"}, "is its own ancestor"),
        ({"hosts.yml": "all:\n  hosts:\n    'bad host':\n"}, "hosts.yml:3: 'bad host' is not a host name pyinfra can use"),
        ({"hosts.yml": "- hosts: all\n  tasks: []\n"}, "an Ansible YAML inventory (groups at its top level) must be a mapping"),
        (
            {"hosts.yml": "all:\n  host:\n    h1:\n"},
            "hosts.yml:2: group 'all' has 'host'; an Ansible group holds only hosts, vars and children",
        ),
        (
            {"group_vars/all.yml": "vllm_recipe: '{% if a %}b{% endif %}'\n", "hosts.yml": "all:\n  hosts:\n    h1:\n"},
            "all.yml:1: vllm_recipe:",
        ),
    ],
)
def test_what_is_refused_names_the_file_the_line_and_the_key(tmp_path: Path, files: dict[str, str], said: str) -> None:
    write(tmp_path, files)
    inventory = next(tmp_path / name for name in files if name.startswith("hosts"))
    with pytest.raises(ansible.AnsibleInventoryError) as refused:
        ansible.read(inventory)
    assert said in str(refused.value) and str(tmp_path) in str(refused.value)


def test_a_dynamic_inventory_is_refused_with_the_command_that_saves_its_json(tmp_path: Path) -> None:
    script = tmp_path / "ec2.py"
    script.write_text("#!/usr/bin/env python3\nprint('{}')\n")
    script.chmod(0o755)
    with pytest.raises(ansible.AnsibleInventoryError, match=r"ansible-inventory -i .*ec2.py --list > hosts.json"):
        ansible.read(script)


def test_connection_variables_become_pyinfra_s_and_a_team_s_own_are_kept(tmp_path: Path) -> None:
    write(tmp_path, {"hosts.yml": YAML, **VARS})
    data = ansible.read(tmp_path / "hosts.yml")["gpu-b03"].data()
    assert (data["ssh_port"], data["ssh_user"], data["gpu_model"]) == (2222, "deploy", "MI300X")
    assert "ansible_port" not in data and data["_ansible_vars"] == ["fleet_file", "from_all_file", "level", "rack_b_file", "shared", "zone"]
    assert data["_ansible_where"]["ssh_port"] == f"{tmp_path / 'hosts.yml'}:21"  # where ansible_port was set
    assert ansible.read(tmp_path / "hosts.yml")["router-01"].data()["ssh_hostname"] == "10.0.9.1"


TWO_LINES = """from instinct_fleet.model.ansible import groups
globals().update(groups(__file__, "hosts.yml"))
"""


def test_the_docs_and_the_project_init_writes_show_the_two_lines_this_test_runs(tmp_path: Path) -> None:
    assert TWO_LINES in (ROOT / "docs" / "ansible.md").read_text()
    assert cli_main(["init", str(tmp_path / "project")]) == 0
    assert TWO_LINES in (tmp_path / "project" / "inventories" / "prod.py").read_text()


def project(root: Path, inventory: str) -> Path:
    """An instinct-fleet project whose hosts are an Ansible inventory: group_data/, deploy.py and the two-line
    pyinfra inventory that reads it (what docs/ansible.md shows)."""
    write(root, {inventory: YAML, **VARS, "deploy.py": "", "group_data/all.py": "vllm_version = '0.22.0'\n"})
    write(root, {"inventories/prod.py": TWO_LINES.replace("hosts.yml", f"../{inventory}")})
    return root / "inventories" / "prod.py"


def test_the_two_line_pyinfra_inventory_validates_every_host(tmp_path: Path) -> None:
    shim = project(tmp_path, "hosts.yml")
    hosts = {h.name: h for h in load_inventory(str(shim), str(tmp_path))}
    assert len(hosts) == 65 and {"rack_a", "mi300x", "fleet", "canary"} <= set(hosts["gpu-a01"].groups)
    planned = plan_hosts(list(hosts.values()))
    errors = [str(f) for _, findings in planned for f in findings if f.severity == "error"]
    assert errors == []  # level, shared, tags, fleet_file: the team's own variables, kept as host data
    spec = next(s for s, _ in planned if s.host == "gpu-c16")
    assert (spec.gpu_model, [svc.gpus for svc in spec.services]) == ("MI325X", [(2,)])


def test_a_variable_of_ours_misspelt_in_the_ansible_inventory_is_still_caught(tmp_path: Path) -> None:
    shim = project(tmp_path, "hosts.yml")
    (tmp_path / "host_vars" / "gpu-a03.yml").write_text("vllm_recipie: gpt-oss-120b\n")
    planned = plan_hosts(load_inventory(str(shim), str(tmp_path)))
    found = [f for spec, findings in planned if spec.host == "gpu-a03" for f in findings if f.rule == "unknown-variable"]
    assert [f.key for f in found] == ["vllm_recipie"] and "did you mean 'vllm_recipe'?" in found[0].message
    assert "host_vars/gpu-a03.yml line 1" in str(found[0])  # where it was set, as for any input


def test_the_cli_takes_the_ansible_inventory_itself_and_refuses_a_bad_one_with_its_line(tmp_path: Path) -> None:
    project(tmp_path, "hosts.yml")
    cli = [sys.executable, "-m", "instinct_fleet"]
    done = subprocess.run([*cli, "plan", str(tmp_path / "hosts.yml"), "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = json.loads(done.stdout)
    assert len({svc["host"] for svc in shown["services"]}) == 65 and shown["errors"] == []
    (tmp_path / "hosts.yml").write_text(YAML.replace("level: canary-host", "vllm_model: '{{ x }}'"))
    refused = subprocess.run([*cli, "plan", str(tmp_path / "hosts.yml")], capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 2 and "hosts.yml:28: vllm_model: '{{ x }}' is a Jinja expression" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_messages_name_the_ansible_file_not_the_pyinfra_inventory_the_command_runs_on(tmp_path: Path) -> None:
    """A command given an Ansible inventory runs on a pyinfra inventory written to a scratch directory; what it says
    names the Ansible file, which the user can open."""
    project(tmp_path, "hosts.yml")
    (tmp_path / "group_data" / "gpus.py").write_text('vllm_recipe = "gpt-oss-120b"\n')
    (tmp_path / "empty.yml").write_text("all:\n  children:\n    gpu: {}\n")
    cli = [sys.executable, "-m", "instinct_fleet"]
    runs = {"hosts.yml": ["plan", "hosts.yml"], "empty.yml": ["plan", "empty.yml"], "status": ["status", "hosts.yml", "--limit", "nope"]}
    said = {name: subprocess.run([*cli, *argv], capture_output=True, text=True, cwd=tmp_path).stderr for name, argv in runs.items()}
    assert "group_data/gpus.py: no host of hosts.yml is in a group 'gpus'" in said["hosts.yml"], said["hosts.yml"]
    assert f"{tmp_path / 'empty.yml'} lists no host" in said["empty.yml"], said["empty.yml"]
    assert f"matches no host name or group of {tmp_path / 'hosts.yml'}" in said["status"], said["status"]
    assert not any("instinct-fleet-ansible-" in text for text in said.values())


def test_an_ordinary_team_inventory_is_read_as_ansible_reads_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What instinct-fleet never reads is left alone, as ansible-inventory leaves it: a team's Jinja (grafana_url) and
    vaulted values; a vars file encrypted whole is skipped and named; INI's strings for booleans are booleans, as
    Ansible's modules read them."""
    write(
        tmp_path,
        {
            "hosts.ini": "[gpu]\ngpu-1 ansible_host=192.0.2.1 metrics_exporter=false\n[gpu:vars]\nwatch=no\n",
            "group_vars/all/main.yml": "grafana_url: 'https://{{ grafana_host }}/d'\nteam_secret: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  3334\n",
            "group_vars/all/vault.yml": "$ANSIBLE_VAULT;1.1;AES256\n6162636465\n",
        },
    )
    (tmp_path / "vault.yml").write_text("team_password: x\n")  # as the vaulted file reads once decrypted
    (tmp_path / "group_vars" / "all" / "vault.yml").rename(tmp_path / "vaulted")
    expected = ansibles(tmp_path / "hosts.ini")  # ansible-inventory cannot open the vaulted file without the password
    (tmp_path / "vaulted").rename(tmp_path / "group_vars" / "all" / "vault.yml")
    assert ours(tmp_path / "hosts.ini") == expected
    assert expected["gpu-1"][1]["grafana_url"] == "https://{{ grafana_host }}/d" and expected["gpu-1"][1]["watch"] == "no"
    (host,) = ansible.read(tmp_path / "hosts.ini").values()
    data = host.data()
    assert (data["metrics_exporter"], data["watch"], data["ssh_hostname"]) == (False, False, "192.0.2.1")
    assert ansible.vaulted_files(tmp_path / "hosts.ini") == [tmp_path / "group_vars" / "all" / "vault.yml"]
    (tmp_path / "deploy.py").write_text("")
    code = cli_main(["plan", str(tmp_path / "hosts.ini"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"note: {tmp_path / 'group_vars' / 'all' / 'vault.yml'} is vault-encrypted: its variables are Ansible's alone" in err
    assert json.loads(out)["services"][0]["host"] == "gpu-1"


def test_group_vars_no_host_reads_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A group_vars file of an empty group, or of a name no group has (gpus beside gpu), reaches no host: Ansible says
    nothing, instinct-fleet names each, as it names a group_data file no host reads."""
    write(
        tmp_path,
        {
            "hosts.yml": "all:\n  children:\n    gpu:\n      hosts:\n        gpu-1:\n    empty:\n",
            "group_vars/all.yml": "vllm_recipe: gpt-oss-120b\n",
            "group_vars/gpu/main.yml": "watch: true\n",
            "group_vars/empty.yml": "watch: false\n",
            "group_vars/gpus.yaml": "watch: false\n",
            "deploy.py": "",
        },
    )
    hosts = ansible.read(tmp_path / "hosts.yml")
    unread = ansible.unread_group_vars(tmp_path / "hosts.yml", hosts)
    assert unread == [(tmp_path / "group_vars" / "empty.yml", "empty"), (tmp_path / "group_vars" / "gpus.yaml", "gpus")]
    assert cli_main(["plan", str(tmp_path / "hosts.yml")]) == 0
    err = capsys.readouterr().err
    assert f"note: {tmp_path / 'group_vars' / 'gpus.yaml'} is for group 'gpus', which no host of" in err and "group 'gpu'" not in err
