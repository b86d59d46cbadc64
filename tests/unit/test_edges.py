"""No input ends in an internal error: the typed model's whole input space, drawn from the model itself.

Each variable's values come from its own annotation (:class:`FleetVars` and the models it holds): its default, and
the edges of its type (zero, one, negative and huge numbers, the empty string, empty lists and mappings, None where
it is optional, every literal). Most draws therefore pass the schema and reach the rules that relate variables, the
rendering and the host's facts, where an arithmetic or an index on an edge would turn into "unexpected error". Every
outcome must be a plan or findings, in ``plan`` (text, ``--json``, ``--explain``) and in the plan a deploy makes
against a captured MI300X host.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from instinct_fleet.cli import _report
from instinct_fleet.converge import preflight
from instinct_fleet.model.defaults import DEFAULTS, FleetVars
from instinct_fleet.model.inventory import HostData, plan_hosts
from instinct_fleet.model.recipes import all_recipes
from instinct_fleet.model.rules import RULES
from instinct_fleet.roll.plan import plan_inventory

from .test_preflight import mi300x_host

INTS = (0, 1, -1, 2, 7, 8, 9, 255, 256, 65535, 65536, 2**31, 2**63)
FLOATS = (0.0, 1.0, -1.0, 1e-12, 0.5, 0.999999, 100.0, 1e308)
STRINGS = ("", "0", "x", "a" * 300, "none", "0.11.1")
# Names a variable's own rules read (an instance name, a recipe, a model), so that draws reach past the schema.
KNOWN = {
    "vllm_recipe": sorted(all_recipes()),
    "recipe": sorted(all_recipes()),
    "vllm_version": ["0.11.0", "0.22.0", "0.33.0", "0.11.1", "9.9.9"],
    "vllm_image": [
        str(DEFAULTS["vllm_image"]),
        "rocm/vllm:rocm7.0.0_vllm_0.11.1_20251103",
        "vllm/vllm-openai-rocm:v0.22.0",
        "rocm/vllm@sha256:" + "0" * 64,
    ],
    "name": ["main", "a", "b"],
    "gpus": [[], [0], [0, 1, 2, 3], list(range(8)), [7, 7], [0, 9], list(range(16))],
    "rolling_batch": [1, "25%", "100%", "0%", 0],
}


def edges(annotation: Any, key: str = "") -> st.SearchStrategy[Any]:
    """Values of one annotation: its type's edges, recursively (a model's fields each optional)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return edges(args[0], key)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(edges(a, key) for a in args))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if annotation is type(None):
        return st.none()
    if annotation is typing.Any:
        return st.one_of(st.sampled_from([*INTS, *FLOATS, *STRINGS, True, False]), st.none())
    if origin is list:
        return st.lists(edges(args[0]), max_size=3)
    if origin is dict:
        return st.dictionaries(edges(args[0]), edges(args[1]), max_size=2)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        fields = {name: field_values(name, f.annotation, f.default) for name, f in annotation.model_fields.items()}
        required = {name for name, f in annotation.model_fields.items() if f.is_required()}
        return st.fixed_dictionaries(
            {k: v for k, v in fields.items() if k in required}, optional={k: v for k, v in fields.items() if k not in required}
        )
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.sampled_from(INTS)
    if annotation is float:
        return st.sampled_from(FLOATS)
    if annotation is str:
        return st.sampled_from(STRINGS)
    raise AssertionError(f"{key}: no edges for {annotation!r}: teach this test the type")


def field_values(key: str, annotation: Any, default: Any) -> st.SearchStrategy[Any]:
    """A field's default, a value its rules know, or an edge of its type."""
    known = [default] if isinstance(default, str | int | float | bool) or default is None else []
    return st.one_of(st.sampled_from([*known, *KNOWN.get(key, [])] or [None]), edges(annotation, key))


VALUES = {name: field_values(name, f.annotation, DEFAULTS.get(name)) for name, f in FleetVars.model_fields.items()}
# A few variables at a time, the rest at their defaults: a draw of every variable at once would almost always hold one
# the schema refuses, and the rules past it would go untried.
host_data = st.lists(st.sampled_from(sorted(VALUES)), max_size=5, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({k: VALUES[k] for k in keys})
)
REPORT = preflight.parse_report(mi300x_host())


def test_every_variable_has_edges() -> None:
    """A new variable of a type this test cannot draw fails here, not silently outside the property."""
    for name, f in FleetVars.model_fields.items():
        edges(f.annotation, name)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=host_data, as_json=st.booleans())
def test_every_input_ends_in_a_plan_or_findings(data: dict[str, Any], as_json: bool, capsys: pytest.CaptureFixture[str]) -> None:
    planned = plan_hosts([HostData("h1", ("gpu",), data)])
    for _, findings in planned:
        for f in findings:
            assert f.rule in RULES and f.host == "h1" and f.message, f
    _report(planned, as_json, explain=True)
    event(f"errors: {sorted({f.rule for _, fs in planned for f in fs if f.severity == 'error'})[:1]}")
    if all(f.severity != "error" for _, fs in planned for f in fs):
        # What a deploy plans against a real host's facts: host rules, the declaration, the roll.
        host_plan = plan_inventory([HostData("h1", ("gpu",), data)], {"h1"}, lambda specs: dict.fromkeys(specs, REPORT))["h1"]
        assert all(f.rule in RULES for f in [*host_plan.errors, *host_plan.warnings])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "unexpected error" not in out + err
