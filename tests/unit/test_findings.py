"""One message per mistake: findings grouped across hosts, with the file and line that set the value."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from instinct_fleet import scaffold
from instinct_fleet.cli import main
from instinct_fleet.model.rules import Finding, distinct, finding, grouped, host_ranges


def _project(tmp_path: Path, inventory: str, **group_data: str) -> Path:
    project = tmp_path / "infra"
    scaffold.init(project)
    (project / "group_data" / "llama405.py").unlink()  # the example cluster's group: not in these inventories
    path = project / "inventories" / "big.py"
    path.write_text(textwrap.dedent(inventory))
    for name, text in group_data.items():
        (project / "group_data" / f"{name}.py").write_text(textwrap.dedent(text))
    return path


def _plan(capsys: pytest.CaptureFixture[str], inventory: Path, *extra: str) -> tuple[int, list[str]]:
    code = main(["plan", str(inventory), *extra])
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    ("names", "shown"),
    [
        ([f"mi300x-{i:02d}" for i in range(40, 0, -1)], "mi300x-01..40"),
        (["gpu-1", "gpu-2", "gpu-3", "gpu-7", "gpu-10", "gpu-9"], "gpu-1..3, gpu-7, gpu-9..10"),
        (["mi300x-09", "mi300x-10", "mi300x-9"], "mi300x-09, mi300x-9..10"),
        (["a-010", "a-009", "a-011"], "a-009..011"),
        (["h1", "h1", "router"], "h1, router"),
    ],
)
def test_host_ranges_fold_numbered_runs(names: list[str], shown: str) -> None:
    assert host_ranges(names) == shown


def test_one_typo_in_group_data_for_40_hosts_is_one_line_with_its_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _project(
        tmp_path,
        'gpu = [f"mi300x-{i:02d}" for i in range(1, 41)]\n',
        gpu="""\
        vllm_recipe = "gpt-oss-120b"
        vllm_args = {"max-num-seqz": 256}
        """,
    )
    code, lines = _plan(capsys, inventory)
    assert code == 1
    assert lines == [
        "error: mi300x-01..40: main.args.--max-num-seqz: vLLM 0.22.0 has no such flag; did you mean --max-num-seqs? "
        "(vllm_args, set in group_data/gpu.py line 2) [flag-unknown]",
        "1 error(s) on 40 host(s), 0 warning(s)",
    ]


def test_a_value_set_per_host_names_the_inventory_line_and_only_its_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _project(
        tmp_path,
        """\
        gpu = [
            "gpu-1",
            ("gpu-2", {"vllm_argz": {}}),
            "gpu-3",
        ]
        """,
        all="vllm_allow_from = ['10.0.0.1/8']\n",
    )
    code, lines = _plan(capsys, inventory)
    assert code == 1 and len(lines) == 3, lines
    assert lines[0].startswith("error: gpu-1..3: vllm_allow_from[0]: ") and lines[0].endswith(
        "(set in group_data/all.py line 1) [allow-from]"
    )
    assert lines[1].startswith("error: gpu-2: vllm_argz: ") and "(set in host data in inventories/big.py line 3)" in lines[1]
    assert lines[2] == "2 error(s) on 3 host(s), 0 warning(s)"


def test_a_group_tuple_in_the_inventory_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _project(tmp_path, "\n\ngpu = (['gpu-1', 'gpu-2'], {'firewall': 'yes'})\n")
    code, lines = _plan(capsys, inventory)
    assert code == 1 and lines[0].startswith("error: gpu-1..2: firewall: ")
    assert lines[0].endswith("(set in group gpu in inventories/big.py line 3) [schema]"), lines


def test_a_percentage_for_a_fraction_is_one_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _project(tmp_path, "gpu = ['gpu-1']\n", gpu='vllm_args = {"gpu-memory-utilization": 92}\n')
    code, lines = _plan(capsys, inventory)
    assert code == 1 and len(lines) == 2, lines
    assert lines[0].startswith("error: gpu-1: main.args.--gpu-memory-utilization: ") and lines[0].endswith("[value-domain]")


def test_two_checks_of_one_value_give_one_finding_and_an_error_silences_advice_on_its_key() -> None:
    a = finding("value-domain", "h1", "k", "must be in (0, 1], got 92")
    b = finding("value-domain", "h1", "k", "must be <= 1 in vLLM 0.22.0, got 92")
    advice = finding("gpu-memory-high", "h1", "k", "0.95 or more")
    other = finding("value-domain", "h2", "k", "must be in (0, 1], got 92")
    assert distinct([a, b, advice, other]) == [a, other]
    assert distinct([advice]) == [advice]  # a warning alone stays
    assert grouped([a, b, advice, other]) == ["error: h1..2: k: must be in (0, 1], got 92 [value-domain]"]


def test_the_same_mistake_from_different_places_stays_two_lines() -> None:
    here = Finding("schema", "error", "h1", "firewall", "bad", "set in group_data/a.py line 1")
    there = Finding("schema", "error", "h2", "firewall", "bad", "set in group_data/b.py line 1")
    assert grouped([here, there]) == [
        "error: h1: firewall: bad (set in group_data/a.py line 1) [schema]",
        "error: h2: firewall: bad (set in group_data/b.py line 1) [schema]",
    ]


def test_group_data_no_host_reads_is_a_warning_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _project(tmp_path, "gpu = ['gpu-1']\n", gpus='vllm_recipe = "llama-3.1-70b"\n', staging="vllm_nodes = 1\n")
    (inventory.parent / "staging.py").write_text("hosts = ['gpu-9']\n")  # another inventory's group: not a mistake here
    code, lines = _plan(capsys, inventory)
    assert code == 0
    assert lines == [
        "warning: group_data/gpus.py: no host of inventories/big.py is in a group 'gpus', so no host reads vllm_recipe; "
        "did you mean group_data/gpu.py? [group-data-unread]",
        "0 error(s), 1 warning(s)",
    ]
    code = main(["plan", str(inventory), "--json"])
    (warning,) = __import__("json").loads(capsys.readouterr().out)["warnings"]
    assert code == 0 and warning["rule"] == "group-data-unread" and warning["key"] == "group_data/gpus.py"


def test_deploy_prints_one_line_per_mistake_and_counts_hosts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = _project(tmp_path, 'gpu = [f"mi300x-{i:02d}" for i in range(1, 41)]\n', gpu='vllm_recipe = "gpt-oss-12b"\n')
    assert main(["deploy", str(inventory)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: mi300x-01..40: vllm_recipe: no recipe 'gpt-oss-12b'")
    assert lines[0].endswith("(set in group_data/gpu.py line 1) [recipe-unknown]")
    assert lines[1] == "1 error(s) on 40 host(s): nothing was deployed and no host was contacted"


def test_the_origin_is_the_layer_pyinfra_keeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A group's file over all.py, the last group listed over an earlier one: the line named is the value the host got."""
    inventory = _project(
        tmp_path,
        "gpu = ['gpu-1']\nfast = ['gpu-1']\n",
        all='vllm_args = {"max-num-seqz": 1}\n',
        gpu='\nvllm_args = {"max-num-seqz": 2}\n',
        fast='\n\nvllm_args = {"max-num-seqz": 3}\n',
    )
    code, lines = _plan(capsys, inventory)
    (flag,) = [line for line in lines if line.endswith("[flag-unknown]")]  # the two groups also disagree: inventory-conflict
    assert code == 1 and flag.endswith("(vllm_args, set in group_data/fast.py line 3) [flag-unknown]"), lines


def test_each_group_s_mistake_names_its_own_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two groups, each a host and a group_data file with a mistake of its own: each finding names the file and line of
    its group (the files are found and read once per run, for every host and value that asks)."""
    inventory = _project(
        tmp_path,
        "gpu = ['gpu-1']\nfast = ['fast-1']\n",
        gpu='vllm_args = {"max-num-seqz": 2}\n',
        fast='\n\nvllm_args = {"max-num-batched-tokenz": 3}\n',
    )
    code, lines = _plan(capsys, inventory)
    flags = sorted(line for line in lines if line.endswith("[flag-unknown]"))
    assert code == 1 and len(flags) == 2, lines
    assert flags[0].startswith("error: fast-1: ") and flags[0].endswith("(vllm_args, set in group_data/fast.py line 3) [flag-unknown]")
    assert flags[1].startswith("error: gpu-1: ") and flags[1].endswith("(vllm_args, set in group_data/gpu.py line 1) [flag-unknown]")
