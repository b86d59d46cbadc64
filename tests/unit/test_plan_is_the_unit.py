"""``plan`` shows what each unit runs: its argv and its env file, made by the functions that write the unit.

For every shipped recipe, on one host and on a Ray cluster's head: the ``vllm ...`` argv of ``plan --json`` is, byte
for byte, the tail of the unit's ExecStart, and its env is the unit's env file but for the lines the host's facts add
(the token's path where it has one, VLLM_HOST_IP on a cluster node), which ``plan`` names as such.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from instinct_fleet.cli import HF_TOKEN_LINE, _report
from instinct_fleet.model import paths, render
from instinct_fleet.model.recipes import all_recipes
from tests.unit.conftest import CLUSTER
from tests.unit.stages import SimHost, plan


def shown(host_plan: Any, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """What ``plan --json`` says the host's instances run."""
    _report([(host_plan.spec, [])], as_json=True, explain=False)
    return {s["name"]: s for s in json.loads(capsys.readouterr().out)["services"]}


@pytest.mark.parametrize("recipe", sorted(all_recipes()))
def test_plan_shows_the_argv_and_env_each_unit_gets(
    recipe: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF", "hf_token")
    nodes = all_recipes()[recipe].nodes
    data: dict[str, Any] = {"vllm_recipe": recipe, "vllm_nodes": nodes, "hf_token_source": "env:HF", "vllm_api_key_path": None}
    if nodes > 1:
        data |= {**CLUSTER, "ray_role": "head"}
        peers = {f"h{i}": {**data, "ray_role": "worker"} for i in range(2, nodes + 1)}
        host_plan = plan(data, SimHost(), peers=peers)
    else:
        host_plan = plan(data, SimHost())
    assert host_plan.ok, host_plan.errors
    services = shown(host_plan, capsys)
    for svc in host_plan.spec.serves:
        unit = paths.vllm_unit(svc.name)
        unit_text = host_plan.desired.file(paths.unit_path(unit)).text
        env_text = host_plan.desired.file(paths.unit_env_path(unit)).text
        said = services[svc.name]
        assert said["argv"][0] == "vllm"
        (exec_start,) = [part.split("\n", 1)[0] for part in unit_text.replace(" \\\n    ", " ").split("\nExecStart=")[1:]]
        assert exec_start.endswith(" " + render.exec_line(said["argv"][1:]).replace(" \\\n    ", " ")), recipe
        node = [f"VLLM_HOST_IP={host_plan.cluster.node_ip}"] if nodes > 1 else []  # what the host's facts add
        assert env_text == "".join(f"{line}\n" for line in [*(f"{k}={v}" for k, v in said["env"].items()), *node, HF_TOKEN_LINE]), recipe
