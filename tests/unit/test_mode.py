"""The run's mode is one pyinfra argument (--data instinct_fleet_run=JSON): what the command line passes, the run reads
back whole; a wrong one is refused before any connection; the variables never see it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api import Inventory
from pyinfra.api.exceptions import PyinfraError
from pyinfra_cli.util import parse_cli_arg

from instinct_fleet.converge.gpuhealth import Ask
from instinct_fleet.model.inventory import RUN_MODE_KEY, hosts_of
from instinct_fleet.model.origins import Sources
from instinct_fleet.roll.mode import RunMode
from instinct_fleet.roll.run import run_mode

MODES = [
    RunMode(),
    RunMode(restore="previous"),
    RunMode(restore="3", summary="/tmp/roll.json"),
    RunMode(warm=True),
    RunMode(ask=Ask({"h1": (2, "fans loud, RMA 41"), "h2": (None, "x8 link")})),
    RunMode(ask=Ask(admit=frozenset({"h1", "h3"}))),
]


@pytest.mark.parametrize("mode", MODES)
def test_the_argument_reaches_the_run_whole(mode: RunMode) -> None:
    """As pyinfra's command line parses it (its own parse_cli_arg), into the inventory's override data."""
    argument = mode.argument()
    data = {}
    if argument:
        assert argument[0] == "--data"
        key, value = argument[1].split("=", 1)
        data[key] = parse_cli_arg(value)
    state = SimpleNamespace(inventory=Inventory((["h1"], {}), override_data=data))
    assert run_mode(state) == mode


@pytest.mark.parametrize(
    "typed",
    [
        {"quarantine": {"h1": "RMA"}},
        {"quarantine": {"h1": ["x", "why"]}},
        {"restore": "last"},
        {"rollback": "previous"},
        {"warm": "yes"},
        "warm",
        ["h1"],
    ],
)
def test_a_wrong_mode_is_refused_with_its_form(typed: object) -> None:
    state = SimpleNamespace(inventory=Inventory((["h1"], {}), override_data={RUN_MODE_KEY: typed}))
    with pytest.raises(PyinfraError, match=r"--data instinct_fleet_run=.* is not .*HOST.*nothing was deployed"):
        run_mode(state)


def test_the_variables_never_hold_the_mode(tmp_path: Path) -> None:
    """pyinfra puts --data into every host's data; the typed variables (which refuse unknown keys) never see it."""
    inventory = Inventory((["h1", "h2"], {}), override_data={RUN_MODE_KEY: {"warm": True}, "vllm_port": 8001})
    for host in hosts_of(inventory, Sources.of(tmp_path, None)):
        assert RUN_MODE_KEY not in host.data and host.data["vllm_port"] == 8001
