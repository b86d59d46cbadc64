"""Random and malformed specs never crash validation or the CLI: a clean finding every time."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from instinct_fleet.cli import main
from instinct_fleet.model.defaults import DEFAULTS
from instinct_fleet.model.recipes import all_recipes
from instinct_fleet.model.rules import RULES

from .conftest import check

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["gpt-oss-120b", "0.22.0", "0.11.0", "fp8", "INT4", "1", "0", "latest", "x:latest"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)
flag_names = st.one_of(
    st.sampled_from(["tensor-parallel-size", "port", "max-num-seqs", "gpu-memory-utilization", "dtype", "no-x"]), st.text(max_size=10)
)
env_names = st.one_of(st.sampled_from(["VLLM_ROCM_USE_AITER", "HIP_VISIBLE_DEVICES", "NCCL_MIN_NCHANNELS", "VLLM_X"]), st.text(max_size=10))
instances = st.lists(
    st.one_of(
        values,
        st.fixed_dictionaries(
            {"name": st.one_of(st.sampled_from(["a", "b", "main"]), values)},
            optional={
                "gpus": st.one_of(st.lists(st.integers(-2, 10), max_size=9), values),
                "port": st.one_of(st.integers(-1, 70000), values),
                "recipe": st.one_of(st.sampled_from(sorted(all_recipes())), values),
                "args": st.dictionaries(flag_names, values, max_size=3),
                "env": st.dictionaries(env_names, values, max_size=3),
                "bogus": values,
            },
        ),
    ),
    max_size=4,
)
host_data = st.fixed_dictionaries(
    {},
    optional={
        **{key: values for key in DEFAULTS},
        "vllm_instances": st.one_of(instances, values),
        "vllm_args": st.one_of(st.dictionaries(flag_names, values, max_size=4), values),
        "vllm_env": st.one_of(st.dictionaries(env_names, values, max_size=4), values),
        "vllm_recipe": st.one_of(st.sampled_from(sorted(all_recipes())), values),
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(host_data)
def test_validation_never_raises(data: dict[str, Any]) -> None:
    spec, findings = check(data)
    for f in findings:
        assert f.rule in RULES and f.host == "h1" and f.key and f.message
        assert "{shown}" not in f.message and "{what}" not in f.message, f.message  # templates filled in
    for svc in spec.services:
        assert isinstance(svc.port, int) and all(isinstance(g, int) for g in svc.gpus)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    recipe=st.sampled_from(sorted(all_recipes())),
    env=st.lists(st.text(max_size=20), max_size=3),
    args=st.lists(st.text(max_size=20), max_size=3),
)
def test_render_cli_never_raises(recipe: str, env: list[str], args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["render", "--recipe", recipe, "--json"]
    for item in env:
        argv += ["--env", item]
    for item in args:
        argv += [f"--arg={item}"]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors exit 2
        code = int(exc.code or 0)
    _, err = capsys.readouterr()
    assert code in (0, 1, 2)
    assert "Traceback" not in err and "unexpected error" not in err
