"""No value from an inventory can add a line, a directive or a command to any file the deploy writes.

Hypothesis puts adversarial strings (control characters, newlines, quotes, ``$()``,
backticks, unicode) into every string-valued place of a host's data. Either
validation refuses the value with the host, the key and a rule, or the host plans
and every file it would write (units, env files, daemon.json, dockerd's drop-in,
the nftables ruleset) has exactly the lines and directives that a harmless value
gives.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from instinct_fleet.converge import firewall, preflight
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.model import knowledge
from instinct_fleet.model.rules import RULES
from tests.unit.files import docker_files, unit_files

from .test_preflight import interfaces, mi300x_host, plan

REPORT = preflight.parse_report(mi300x_host(interfaces=interfaces("10.0.0.5")))
hostile = st.text(
    alphabet=st.one_of(st.sampled_from(list("\n\r\t\x00\x1b\"'$()`;\\%&|<>{}[]= #")), st.characters(codec="utf-8")),
    min_size=1,
    max_size=16,
)

# Where a string of host data can go, as a function of the string: each place the deploy renders.
PLACES: dict[str, Any] = {
    "vllm_env value": lambda s: {"vllm_env": {"MY_SETTING": s}},
    "vllm_env name": lambda s: {"vllm_env": {s: "1"}},
    "vllm_args value": lambda s: {"vllm_args": {"served-model-name": s}},
    "vllm_args name": lambda s: {"vllm_args": {s: "1"}},  # harmless: a flag vLLM knows (HARMLESS)
    "vllm_model": lambda s: {"vllm_model": s},
    "instance model": lambda s: {"vllm_instances": [{"name": "main", "model": s}]},
    "instance env": lambda s: {"vllm_instances": [{"name": "main", "env": {"X": s}}]},
    "instance name": lambda s: {"vllm_instances": [{"name": s}]},
    "vllm_image": lambda s: {"vllm_image": s},
    "hf_cache_dir": lambda s: {"hf_cache_dir": "/data/" + s},
    "hf_token_path": lambda s: {"hf_token_path": "/etc/" + s},
    "service_user": lambda s: {"service_user": s},
    "registry mirror": lambda s: {"docker_registry_mirrors": ["https://" + s]},
    "insecure registry": lambda s: {"docker_insecure_registries": [s]},
    "allow_from": lambda s: {"vllm_allow_from": [s]},
    "hook": lambda s: {"rolling_pre_stop": {"host": s}},
    "compilation-config": lambda s: {"vllm_args": {"compilation-config": {"cudagraph_mode": s}}},
}


def files(p: HostPlan) -> dict[str, str]:
    out = {path: text for path, text in docker_files(p).items() if text is not None}
    for unit in unit_files(p).values():
        out.update(unit)
    ruleset = firewall.firewall(p)
    if ruleset is not None:
        out["firewall"] = ruleset
    return out


def shape(path: str, text: str) -> list[str]:
    """Each line reduced to what gives it meaning: its directive or variable name, or its first word.

    A JSON file is reduced to its keys and the kinds of its values: a value may change a leaf, never the tree.
    """
    if path.endswith(".json"):
        return [json.dumps(_tree(json.loads(text)))]
    return [re.split(r"[=\s]", line.strip(), maxsplit=1)[0] for line in text.splitlines()]


def _tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tree(v) for v in value]
    return type(value).__name__


# The harmless value of a place, where "a1" is not valid there (a flag name must be one vLLM knows, an address an
# address, a choice one of vLLM's, an image pinned).
HARMLESS = {
    "vllm_args name": "seed",
    "allow_from": "10.2.0.0/16",
    "compilation-config": "NONE",
    "vllm_image": "vllm/vllm-openai-rocm:v0.22.0",
}


# Values each place accepts, the most unusual its rule allows: the class of inputs that reaches the files. Random
# hostile strings are refused in half of the places, so without these the comparison below would never run there.
ACCEPTED: dict[str, tuple[str, ...]] = {
    "vllm_env value": ("a b", "$(id)", "x'y\"z", "100%;#"),
    "vllm_env name": ("MY_SETTING_2", "A1"),
    "vllm_args value": ("my model", "$(id)", "a`b`;c", "x'y"),
    "vllm_args name": ("seed", "tp", "max_num_s"),
    "vllm_model": ("org/model-v2.5", "é1"),
    "instance model": ("org/model-v2.5", "a.b-c_d"),
    "instance env": ("a b", "$HOME", "{}"),
    "instance name": ("a-b", "main2"),
    "vllm_image": ("reg.local:5000/vllm/vllm-openai-rocm:v0.22.0", "a:b"),
    # A host path holds letters, digits and . _ + @ = , - / only (defaults.HOST_PATH_CHAR): blanks, $( and quotes are refused.
    "hf_cache_dir": ("a+b", "x@y=z,1"),
    "hf_token_path": ("a,b", "x=y"),
    "service_user": ("vllm-svc", "_svc"),
    "registry mirror": ("mirror.local:5000", "a/b"),
    "insecure registry": ("reg.local:5000", "10.0.0.1:5000"),
    "allow_from": ("192.168.0.0/16", "10.1.2.3"),
    "hook": ("a;b", "$(id)"),
    "compilation-config": ("FULL", "PIECEWISE"),
}


def judged(place: str, value: str) -> bool:
    """Refused with the host, a key and a rule (False), or planned with every file shaped as a harmless value's (True)."""
    base = {"vllm_allow_from": ["10.0.0.0/8"]}
    planned = plan({**base, **PLACES[place](value)}, REPORT)
    if not planned.ok:
        # Refused: every error names the host, a key and a rule of the table; nothing is rendered.
        assert all(e.host == "h1" and e.key and e.rule in RULES for e in planned.errors)
        return False
    harmless_value = HARMLESS.get(place, "a1")
    if place == "vllm_args name":
        # A flag vLLM knows under another spelling (-n, tp, underscores, a unique prefix) is that flag, written
        # under its long name: its files must be exactly those of the long name.
        table = knowledge.find(planned.spec.vars.vllm_version)
        assert table is not None  # the host planned, so its version has a table
        harmless_value = table.canonical_flag(value) or harmless_value
    harmless = plan({**base, **PLACES[place](harmless_value)}, REPORT)
    assert harmless.ok, [e.brief for e in harmless.errors]
    mine, theirs = files(planned), files(harmless)
    if place == "instance name":  # the name names the unit and its files
        mine = {path.replace(f"vllm-{value}.", "vllm-a1."): text for path, text in mine.items()}
    assert set(mine) == set(theirs)
    for path, text in mine.items():
        got, want = shape(path, text), shape(path, theirs[path])
        assert len(got) == len(want), (place, value, path)
        # A name stands at the start of its own line (VALUE=1, --flag): there, and only there, it differs.
        assert all(a == b or (place.endswith("name") and a in (value, f"--{value}")) for a, b in zip(got, want, strict=True)), (
            place,
            value,
            path,
        )
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]", text), (place, value, path)
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(place=st.sampled_from(sorted(PLACES)), value=hostile)
@example(place="vllm_args name", value="n")  # vLLM 0.22.0's short alias of --nnodes: the unit says --nnodes
@example(place="vllm_args name", value="tp")  # an alias of a flag the recipe sets: it replaces that line
@example(place="vllm_args name", value="max_num_s")  # underscores and a unique prefix of --max-num-seqs
def test_a_value_is_refused_or_changes_no_line_structure(place: str, value: str) -> None:
    judged(place, value)


@pytest.mark.parametrize("place", sorted(PLACES))
def test_every_place_accepts_its_unusual_values_and_they_reach_the_files(place: str) -> None:
    """The floor under the property above: in every place, values its rule accepts are planned and compared, file
    by file, with a harmless value's."""
    assert set(ACCEPTED) == set(PLACES)
    assert all(judged(place, value) for value in ACCEPTED[place]), place
