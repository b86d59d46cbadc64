"""The typed serving spec: what one host runs, resolved from its data and a recipe.

``resolve_host`` is the single step from pyinfra's host data (host data over
group_data over all) to typed :class:`ServiceSpec` objects. The data is
validated against the model in :mod:`instinct_fleet.model.defaults` (types, ranges,
forms, unknown keys); rules that relate several values are checked in
:mod:`instinct_fleet.model.validate`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from instinct_fleet.model import knowledge, paths
from instinct_fleet.model.catalog import Catalog
from instinct_fleet.model.defaults import DEFAULTS, REMOVED, BenchProfile, FleetVars, Hook, Instance, RayPorts, default_image, tag_version
from instinct_fleet.model.pools import Membership, Pool
from instinct_fleet.model.recipes import ArgValue, Recipe
from instinct_fleet.model.rules import Finding, finding

DEFAULT_PORT = 8000  # vLLM's own default for --port
SSH_PORT = 22  # pyinfra's default when the host data sets no ssh_port


class VarsData(dict[str, Any]):
    """A host's raw merged instinct-fleet values (for the input-safety scan and the checks of where a key was written).

    It holds every instinct-fleet variable and nothing else: reading any other key (a pyinfra
    connection setting such as ``ssh_port``) is a bug in the check that reads it, which
    would otherwise see ``None`` or its own fallback on every host, so it raises.
    """

    def __getitem__(self, key: str) -> Any:
        self._known(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._known(key)
        return super().get(key, default)

    def _known(self, key: str) -> None:
        if key not in DEFAULTS:
            raise KeyError(f"{key!r} is not an instinct-fleet variable, so a host's spec never holds it: read it from its typed field")


def parallel_size(args: Mapping[str, ArgValue], flag: str) -> int:
    """A parallel size flag as an int (1 when unset or not an integer: validation reports it)."""
    value = args.get(flag, 1)
    try:
        return int(value) if not isinstance(value, bool) else 1
    except (TypeError, ValueError):
        return 1


def world_size(args: Mapping[str, ArgValue]) -> int:
    """GPUs one instance needs in all: TP x PP x DP."""
    return (
        parallel_size(args, "tensor-parallel-size")
        * parallel_size(args, "pipeline-parallel-size")
        * parallel_size(args, "data-parallel-size")
    )


@dataclass(frozen=True)
class ServiceSpec:
    """One vLLM instance, fully resolved: what the unit, the checks and the CLI read."""

    name: str
    host: str | None
    recipe: str
    image: str
    version: str
    model: str
    env: dict[str, str]
    args: dict[str, ArgValue]
    gpus: tuple[int, ...]
    port: int
    nodes: int
    reasons: dict[str, str] = field(default_factory=dict)
    table: knowledge.VllmKnowledge | None = field(default=None, compare=False, repr=False)  # what it was validated against

    def size(self, flag: str) -> int:
        return parallel_size(self.args, flag)

    @property
    def world_size(self) -> int:
        return world_size(self.args)


@dataclass(frozen=True)
class ClusterSpec:
    """This host's place in a multi-node Ray cluster, and the RCCL settings of the cluster."""

    name: str
    role: str
    ports: dict[str, int]
    ready_timeout: int
    nic: str | None
    ib_hca: str | None
    ib_gid_index: int | None
    gdr_level: str | None
    min_nchannels: int | None
    infiniband: bool

    def rccl_env(self) -> dict[str, str]:
        """The RCCL/Gloo variables every node's containers get at creation (VLLM_HOST_IP is per node)."""
        env = {}
        if self.nic:
            env["NCCL_SOCKET_IFNAME"] = self.nic
            env["GLOO_SOCKET_IFNAME"] = self.nic
        for name, value in (
            ("NCCL_IB_HCA", self.ib_hca),
            ("NCCL_IB_GID_INDEX", self.ib_gid_index),
            ("NCCL_NET_GDR_LEVEL", self.gdr_level),
            ("NCCL_MIN_NCHANNELS", self.min_nchannels),
        ):
            if value is not None:
                env[name] = str(value)
        return env


@dataclass(frozen=True)
class HostSpec:
    """One host resolved: ``vars`` is the validated model, ``data`` the raw merged values (for the input-safety scan)."""

    host: str | None
    gpu_count: int
    gpu_model: str
    services: tuple[ServiceSpec, ...]
    cluster: ClusterSpec | None  # this host's place in a Ray cluster, from the ray_* and nccl_* variables
    data: VarsData
    vars: FleetVars
    address: str | None = None  # where pyinfra connects: ssh_hostname, else the inventory name
    ssh_port: int = SSH_PORT  # where pyinfra connects: ssh_port, else 22
    project: Path | None = None  # the project directory: control-machine paths of the data are relative to it
    table: knowledge.VllmKnowledge | None = field(default=None, compare=False, repr=False)  # the pinned vLLM's, from the catalog
    pools: tuple[Pool, ...] = ()  # with router: one per model, from the whole inventory (router.attach)
    memberships: tuple[Membership, ...] = ()  # the router pools that list this host's instances

    @property
    def reach(self) -> str:
        """The address other machines reach this host at: ``scrape_address``, else the SSH address, else the inventory name."""
        return str(self.vars.scrape_address or self.address or self.host)

    @property
    def serves(self) -> tuple[ServiceSpec, ...]:
        """The vLLM instances this host runs a unit for: none on a cluster worker (the head runs them)."""
        return () if self.cluster is not None and self.cluster.role == "worker" else self.services

    @property
    def serving_units(self) -> tuple[str, ...]:
        """The units that serve on this host, in start order: its Ray unit first, then one per instance."""
        ray = (paths.ray_unit(self.cluster.role),) if self.cluster is not None else ()
        return ray + tuple(paths.vllm_unit(s.name) for s in self.serves)

    def local(self, path: str) -> Path:
        """A path on the control machine as the data gives it: ``~`` expanded, a relative one taken from the project (where
        pyinfra runs the deploy), whichever directory a command was started in."""
        given = Path(path).expanduser()
        return given if given.is_absolute() or self.project is None else self.project / given

    def compile_cache(self, svc: ServiceSpec) -> str:
        """The compile-cache directory of the instance's image on this host (the same path on every host)."""
        return paths.compile_cache(self.vars.compile_cache_dir, svc.image)


# pyinfra's own host data: connection settings and operation arguments (_sudo, _timeout, ...).
PYINFRA_PREFIXES = ("ssh_", "winrm_", "_")
TYPO = 0.85  # how alike an Ansible inventory's own variable and one of ours must be to read as a typo of ours
_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    name: TypeAdapter(Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation)  # type: ignore[arg-type]
    for name, field in FleetVars.model_fields.items()
}
# Every key a model accepts, for "did you mean" on an unknown one at any level.
_KNOWN_KEYS = sorted(
    {*FleetVars.model_fields, *Instance.model_fields, *RayPorts.model_fields, *Hook.model_fields, *BenchProfile.model_fields}
)
# A custom error names its rule; a range, choice or pattern the model sets is a value of the wrong form;
# anything else (a wrong type above all) is a schema error.
_RULE_OF_ERROR = {
    "value_format": "value-format",
    "allow_from": "allow-from",
    "schema": "schema",
    "bench_profile": "bench-profile",
    **dict.fromkeys(
        (
            "greater_than",
            "greater_than_equal",
            "less_than",
            "less_than_equal",
            "literal_error",
            "string_pattern_mismatch",
            "string_too_short",
        ),
        "value-format",
    ),
}
_CUSTOM = ("value_format", "allow_from", "schema", "bench_profile")


def _key(loc: tuple[str | int, ...]) -> str:
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif part != "[key]":
            key += f".{part}" if key else part
    return key


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def model_findings(host: str | None, prefix: tuple[str | int, ...], error: ValidationError) -> list[Finding]:
    """One finding per pydantic error, with the host, the key path and the rule the error names."""
    found = []
    for item in error.errors():
        loc = (*prefix, *item["loc"])
        if item["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(loc[-1]).lower(), _KNOWN_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            found.append(finding("unknown-variable", host, _key(loc), f"not an instinct-fleet key here{hint}"))
        elif item["type"] in _CUSTOM:
            found.append(finding(_RULE_OF_ERROR[item["type"]], host, _key(loc), item["msg"]))
        else:
            rule = _RULE_OF_ERROR.get(item["type"], "schema")
            found.append(finding(rule, host, _key(loc), f"{item['msg']}, got {_short(item['input'])}"))
    return found


def typed_vars(host: str | None, data: Mapping[str, Any]) -> tuple[FleetVars, list[Instance], list[Finding]]:
    """Validate one host's data against :class:`FleetVars`, a variable at a time.

    A variable that fails is reported and replaced by its default, and each entry
    of ``vllm_instances`` is validated on its own, so one mistake never hides the
    findings that the rest of the host's data would give.
    """
    found: list[Finding] = []
    # An Ansible inventory's own variables (instinct_fleet/model/ansible.py lists them): kept as host data, unless
    # one is so close to a variable of ours that it reads as a typo of it.
    foreign = set(data.get("_ansible_vars") or ())
    for key in sorted(data):
        if key in REMOVED:
            found.append(finding("unknown-variable", host, key, REMOVED[key]))
        elif (
            key in FleetVars.model_fields
            or key.startswith(PYINFRA_PREFIXES)
            or (key in foreign and not difflib.get_close_matches(key.lower(), list(FleetVars.model_fields), n=1, cutoff=TYPO))
        ):
            continue
        else:
            close = difflib.get_close_matches(key.lower(), list(FleetVars.model_fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            found.append(finding("unknown-variable", host, key, f"not an instinct-fleet variable{hint}"))
    values: dict[str, Any] = {}
    for name, adapter in _ADAPTERS.items():
        if name == "vllm_instances":
            continue
        try:
            values[name] = adapter.validate_python(data.get(name, DEFAULTS[name]))
        except ValidationError as error:
            found += model_findings(host, (name,), error)
            values[name] = adapter.validate_python(DEFAULTS[name])
    if "vllm_image" not in data:  # the default image is the upstream one of the chosen version
        values["vllm_image"] = default_image(values["vllm_version"])
    elif "vllm_version" not in data:
        named = tag_version(values["vllm_image"])
        if named is not None:
            values["vllm_version"] = named  # the image's tag decides the version it runs
        elif "vllm_image" not in {f.key for f in found}:
            found.append(
                finding(
                    "image-version-unnamed",
                    host,
                    "vllm_image",
                    f"{values['vllm_image']!r} names no vLLM version in its tag, so it is validated against vLLM "
                    f"{values['vllm_version']}'s table; set vllm_version to the version the image runs",
                )
            )
    raw = data.get("vllm_instances", DEFAULTS["vllm_instances"])
    if not isinstance(raw, (list, tuple)):
        found.append(finding("schema", host, "vllm_instances", f"expected a list of instances, got {_short(raw)}"))
        raw = []
    instances = []
    for index, item in enumerate(raw):
        try:
            instances.append(Instance.model_validate(item))
        except ValidationError as error:
            found += model_findings(host, ("vllm_instances", index), error)
    values["vllm_instances"] = instances
    return FleetVars.model_construct(**values), instances, found


def canonical_arg(name: str, table: knowledge.VllmKnowledge | None) -> str:
    """The spelling a flag is stored under: long name, dashes, no leading ``--``."""
    if table is not None:
        known = table.canonical_flag(name)
        if known is not None:
            return known
    return name.lstrip("-").replace("_", "-")


def layer(
    env: dict[str, str],
    args: dict[str, ArgValue],
    reasons: dict[str, str],
    env_over: Mapping[str, str | None],
    args_over: Mapping[str, Any],
    table: knowledge.VllmKnowledge | None,
    origin: str,
) -> None:
    """Apply one layer of (typed) env and flag overrides in place; ``None`` removes."""
    for name, value in env_over.items():
        if value is None:
            env.pop(name, None)
            reasons.pop(name, None)
        else:
            env[name] = value
            reasons[name] = origin
    for name, raw in args_over.items():
        flag = canonical_arg(name, table)
        arg: ArgValue | None = json.dumps(raw) if isinstance(raw, (dict, list)) else raw
        is_switch = table is not None and f"--{flag}" in table.flags and table.flag(flag).kind in ("bool", "switch")
        if is_switch and isinstance(arg, str) and arg.lower() in ("true", "false"):
            arg = arg.lower() == "true"  # --arg enable-x=false from the CLI
        if arg is None:
            args.pop(flag, None)
            reasons.pop(f"--{flag}", None)
        else:
            args[flag] = arg
            reasons[f"--{flag}"] = origin


def from_recipe(recipe: Recipe, table: knowledge.VllmKnowledge | None) -> tuple[dict[str, str], dict[str, ArgValue], dict[str, str]]:
    """The recipe's env, flags and reasons, with flag names in canonical form."""
    env = {k: str(s.value) for k, s in recipe.env.items()}
    args = {canonical_arg(k, table): s.value for k, s in recipe.args.items()}
    reasons = {k: f"recipe {recipe.name}: {s.why}" for k, s in recipe.env.items()}
    reasons.update({f"--{canonical_arg(k, table)}": f"recipe {recipe.name}: {s.why}" for k, s in recipe.args.items()})
    return env, args, reasons


def follow_model(
    host: str | None, model_key: str, recipe: Recipe, model: str, env: dict[str, str], args: dict[str, ArgValue], reasons: dict[str, str]
) -> list[Finding]:
    """A recipe's values derived from its own model follow the model the inventory chose instead, in place.

    A value equal to the recipe's model (``--served-model-name``, ``--tokenizer``) names that model,
    so it becomes the chosen one: clients would otherwise ask for a model the server does not
    serve. A JSON config that names another model (an EAGLE draft) was made for the recipe's
    model and cannot follow it: refused, unless the inventory sets that flag itself. Values the
    inventory set are its own and stay as they are.
    """
    if model == recipe.model:
        return []
    found = []
    ours = f"recipe {recipe.name}:"
    for name, value in [*((f"--{flag}", v) for flag, v in args.items()), *env.items()]:
        if not reasons.get(name, "").startswith(ours):
            continue
        if value == recipe.model:
            if name.startswith("--"):
                args[name[2:]] = model
            else:
                env[name] = model
            reasons[name] = f"follows the model {model} ({model_key}); recipe {recipe.name} names its own model {recipe.model}"
        elif isinstance(value, str) and (bound := _models_in(value) - {recipe.model, model}):
            where = "vllm_args" if name.startswith("--") else "vllm_env"
            found.append(
                finding(
                    "recipe-model-bound",
                    host,
                    model_key,
                    f"recipe {recipe.name} sets {name} for its model {recipe.model} (it names {', '.join(sorted(bound))}), "
                    f"not for {model}: set {name.lstrip('-')} in {where} for {model} (None drops it), or choose a recipe made for it",
                )
            )
    return found


def _models_in(value: str) -> set[str]:
    """The models a JSON config value names under a ``model`` key (at any depth): a draft, a tokenizer."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return set()
    found: set[str] = set()
    stack = [parsed]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found |= {str(v) for k, v in item.items() if k == "model" and isinstance(v, str)}
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    return found


def unknown_recipe_message(name: str, catalog: Catalog) -> str:
    names = sorted(catalog.recipes)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"no recipe {name!r}{hint} Known: {', '.join(names)}"


def cluster_of(v: FleetVars) -> ClusterSpec | None:
    """This host's place in its Ray cluster (None: single-node), with the RCCL settings grouped for the env."""
    if v.ray_cluster is None:
        return None
    return ClusterSpec(
        name=v.ray_cluster,
        role=v.ray_role or "worker",  # validate.py reports a member without a role
        ports=v.ray_ports.model_dump(),
        ready_timeout=v.ray_ready_timeout,
        nic=v.cluster_nic,
        ib_hca=v.nccl_ib_hca,
        ib_gid_index=v.nccl_ib_gid_index,
        gdr_level=v.nccl_net_gdr_level,
        min_nchannels=v.nccl_min_nchannels,
        infiniband=v.infiniband,
    )


RECIPE_TP = re.compile(r"\bTP (\d+)\b")


def held_reasons(reasons: dict[str, str], args: Mapping[str, Any]) -> dict[str, str]:
    """The reasons, each recipe reason that speaks of a tensor-parallel size other than the one in force replaced by
    what holds (a recipe's "more RCCL channels for TP 4 all-reduces" after TP 8 was set): a reason shown must hold."""
    tp = args.get("tensor-parallel-size", 1)
    held = {}
    for key, why in reasons.items():
        said = RECIPE_TP.search(why)
        if why.startswith("recipe ") and key != "--tensor-parallel-size" and said and said.group(1) != str(tp):
            why = f"{why.split(':', 1)[0]}: its reason was given for TP {said.group(1)}, and this instance runs TP {tp}"
        held[key] = why
    return held


def resolve_host(
    host: str | None, data: Mapping[str, Any], catalog: Catalog | None = None, where: Mapping[str, str] | None = None
) -> tuple[HostSpec, list[Finding]]:
    """Turn one host's data into typed services, with the recipes and tables of ``catalog`` (default: the package's).
    ``where``: the file and line that set each variable (:func:`instinct_fleet.model.origins.origins`), which each env
    var's and flag's reason names. Never raises on bad input."""
    where = where or {}

    def level(variable: str, key: str) -> str:
        """The reason of a value from a variable: its layer, and the file that set it when the inventory did."""
        return f"group_data: {key}" + (f", set in {where[variable]}" if variable in where else "")

    catalog = catalog or Catalog()
    v, instances, found = typed_vars(host, data)
    table = catalog.table(v.vllm_version)
    if table is None:
        unsupported = finding(
            "version-unsupported",
            host,
            "vllm_version",
            f"not validated: no table for vLLM {v.vllm_version} (there are tables for {', '.join(catalog.versions())}); "
            f"`instinct-fleet vllm-facts {v.vllm_version}` extracts one from that vLLM's own source into the project, "
            "or set vllm_version_unvalidated = True to deploy it unchecked",
        )
        # The user's explicit opt-in: its flags and env vars go unchecked, said on every plan.
        found.append(dataclasses.replace(unsupported, severity="warning") if v.vllm_version_unvalidated else unsupported)
    services: list[ServiceSpec] = []
    next_gpu = 0
    for index, inst in enumerate(instances):
        key = f"vllm_instances[{index}]"
        recipe_name = inst.recipe if "recipe" in inst.model_fields_set else v.vllm_recipe
        if recipe_name is None:
            # No recipe: the instance is exactly its env and flags (an imported launch command).
            model_name = inst.model or v.vllm_model
            if model_name is None:
                found.append(
                    finding(
                        "schema",
                        host,
                        f"{key}.model",
                        "without a recipe (vllm_recipe = None) the instance needs a model (vllm_model or model)",
                    )
                )
                continue
            recipe: Recipe | None = Recipe("custom", model_name, "no recipe", "group_data", DEFAULT_PORT, 1, {}, {}, (), ())
        else:
            recipe = catalog.recipes.get(recipe_name)
        if recipe is None:
            source_key = f"{key}.recipe" if "recipe" in inst.model_fields_set else "vllm_recipe"
            found.append(finding("recipe-unknown", host, source_key, unknown_recipe_message(str(recipe_name), catalog)))
            continue
        env, args, reasons = from_recipe(recipe, table)
        layer(env, args, reasons, v.vllm_env, {}, table, level("vllm_env", "vllm_env"))
        layer(env, args, reasons, {}, v.vllm_args, table, level("vllm_args", "vllm_args"))
        layer(env, args, reasons, inst.env, inst.args, table, level("vllm_instances", key))
        model = inst.model or v.vllm_model or recipe.model
        model_key = f"{key}.model" if inst.model else "vllm_model"
        found += follow_model(host, model_key, recipe, model, env, args, reasons)
        reasons = held_reasons(reasons, args)
        port = inst.port if inst.port is not None else recipe.port + index
        # A shape larger than the host is reported by validation (parallel-size), not by overflowing the GPU list.
        per_node = min(max(1, world_size(args) // v.vllm_nodes), v.gpu_count)
        gpus = tuple(inst.gpus) if inst.gpus is not None else tuple(range(next_gpu, next_gpu + per_node))
        next_gpu = max([next_gpu, *[g + 1 for g in gpus]])
        services.append(
            ServiceSpec(
                inst.name, host, recipe.name, v.vllm_image, v.vllm_version, model, env, args, gpus, port, v.vllm_nodes, reasons, table
            )
        )
    merged = VarsData({**DEFAULTS, **{k: val for k, val in data.items() if k in DEFAULTS}})
    address = data.get("ssh_hostname") if isinstance(data.get("ssh_hostname"), str) else host
    ssh_port, bad_port = _ssh_port(data.get("ssh_port"))
    if bad_port:
        found.append(finding("schema", host, "ssh_port", bad_port))
    spec = HostSpec(
        host, v.gpu_count, v.gpu_model, tuple(services), cluster_of(v), merged, v, address, ssh_port, project=catalog.project, table=table
    )
    return spec, found


def _ssh_port(value: Any) -> tuple[int, str | None]:
    """The port pyinfra's SSH connector connects to (it reads ``int(ssh_port or 0)``, 0 meaning SSH's own 22), and an error."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return SSH_PORT, None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        return SSH_PORT, f"pyinfra's SSH port is a whole number from 1 to 65535, got {_short(value)}"
    return value, None
