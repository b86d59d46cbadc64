"""The ``instinct-fleet`` command line: recipes, render, plan, deploy, verify, status, bench, report and targets.

The JSON printed with ``--json`` is a contract for CI pipelines:
``{"services": [...], "clusters": [...], "tables": {...}, "warnings": [...], "errors": [...]}``. Exit codes: 0 no
errors, 1 validation errors, 2 usage errors, 141 the reader of stdout went away (`| head`). No input ever
produces a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import fnmatch
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import typing
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from instinct_fleet import __version__, scaffold
from instinct_fleet.commands import boards, monitoring, picture, slo, status, sweeps, trials, tunereport
from instinct_fleet.converge import evaluate, firewall, gpuhealth
from instinct_fleet.live import bench, interrupts, remote
from instinct_fleet.model import ansible, defaults, knowledge, origins, paths, render, workload
from instinct_fleet.model.catalog import Catalog, CatalogError, write_facts
from instinct_fleet.model.defaults import DEFAULTS, default_image
from instinct_fleet.model.inventory import (
    HostData,
    InventoryError,
    find_project,
    load_inventory,
    nearest_project,
    plan_hosts,
    project_of,
    read_inventory,
    select,
    with_cluster_peers,
)
from instinct_fleet.model.recipes import SHIPPED, Recipe
from instinct_fleet.model.render import service_json
from instinct_fleet.model.rules import Finding, distinct, grouped, refused, tally
from instinct_fleet.model.spec import HostSpec, ServiceSpec, resolve_host, unknown_recipe_message
from instinct_fleet.model.validate import validate_host
from instinct_fleet.roll.mode import RunMode

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = interrupts.EXIT
EXIT_PIPE = 141  # as a shell reports a command ended by SIGPIPE


class UsageError(Exception):
    pass


def _parse_env(items: Sequence[str]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise UsageError(f"--env takes NAME=VALUE, got {item!r}")
        env[name] = value
    return env


def _parse_args(items: Sequence[str], table: knowledge.VllmKnowledge | None) -> dict[str, Any]:
    """``FLAG``, ``no-FLAG`` or ``FLAG=VALUE``, with or without leading dashes."""
    args: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.lstrip("-").partition("=")
        if not name:
            raise UsageError(f"--arg takes FLAG[=VALUE], got {item!r}")
        negated = name.startswith("no-") and table is not None and table.canonical_flag(name) is None
        if negated and not sep:
            args[name[3:]] = False
        else:
            args[name] = value if sep else True
    return args


# What the unit's env file holds besides the instance's own settings, and why (shown by plan --explain).
_MANAGED_ENV = {
    "VLLM_CACHE_ROOT": "compile_cache_dir: vLLM's torch.compile and Triton caches, per image",
    "AITER_JIT_DIR": "compile_cache_dir: AITER's JIT modules, per image",
    "PYTORCH_TUNABLEOP_FILENAME": "compile_cache_dir: TunableOp's results, per image and device",
}
HF_TOKEN_LINE = f"HF_TOKEN_PATH={paths.TOKEN_IN_CONTAINER}"


def _served(planned: list[tuple[HostSpec, list[Finding]]]) -> list[tuple[HostSpec, ServiceSpec, dict[str, str]]]:
    """(host, instance, its env) for every instance a host runs; Ray workers run their head's ranks instead."""
    return [(spec, svc, render.unit_env(spec, svc)) for spec, _ in planned for svc in spec.serves]


def _clusters(planned: list[tuple[HostSpec, list[Finding]]]) -> list[dict[str, Any]]:
    members: dict[str, dict[str, Any]] = {}
    for spec, _ in planned:
        cluster = spec.cluster
        if cluster is not None:
            entry = members.setdefault(cluster.name, {"name": cluster.name, "head": None, "workers": []})
            if cluster.role == "head":
                entry["head"] = spec.host
            else:
                entry["workers"].append(spec.host)
    return list(members.values())


def _explain_managed(spec: HostSpec) -> None:
    """What the deploy may write, remove, run, load or pull on this host: the entries of instinct_fleet/converge/managed.py,
    from the spec alone, each with the stage that converges it and what its change runs."""
    print(
        f"{spec.host or 'every host'} manages (instinct_fleet/converge/managed.py; whether each applies may also depend on the host's facts):"
    )
    for line in evaluate.explain(spec):
        print(f"  {line}")


def _report(
    planned: list[tuple[HostSpec, list[Finding]]],
    as_json: bool,
    explain: bool,
    unread: Sequence[Finding] = (),
    tables: dict[str, str] | None = None,
    gpus: Mapping[str, list[gpuhealth.Judged] | str | None] | None = None,
) -> int:
    """Print what each host serves and every finding; ``tables``: each vLLM version's table and where it came from;
    ``gpus``: each host's GPU health verdict, read by ``plan --gpus`` (its findings, an unreachable host's error, or
    None where the host gave no evidence)."""
    findings = distinct([*unread, *(f for _, fs in planned for f in fs)])
    errors = [f for f in findings if f.severity == "error"]
    warnings = [f for f in findings if f.severity == "warning"]
    served = _served(planned)
    if as_json:
        out = {
            "services": [
                {
                    **service_json(svc),
                    "env": env,
                    "argv": ["vllm", *render.serve_command(svc, spec.vars.rolling_drain_timeout)],
                    # With --explain, why each env var and flag has its value: its recipe's reason, or the layer and
                    # the file and line that set it (as the text shows them).
                    **({"reasons": dict(svc.reasons)} if explain else {}),
                }
                for spec, svc, env in served
            ],
            "clusters": _clusters(planned),
            "tables": tables or {},
            "firewall": {str(spec.host): firewall.exposure(spec) for spec, _ in planned},
            "warnings": [_finding_json(f) for f in warnings],
            "errors": [_finding_json(f) for f in errors],
        }
        if gpus is not None:
            out["gpu_health"] = {host: _verdict_json(v) for host, v in gpus.items()}
        print(json.dumps(out, indent=2))
    else:
        for spec, svc, env in served:
            where = f"{svc.host} " if svc.host else ""
            print(f"{where}vllm-{svc.name}: {svc.model} on GPUs {list(svc.gpus)}, port {svc.port}, image {svc.image}")
            print("  env:")
            network = spec.cluster.rccl_env() if spec.cluster is not None else {}
            for name, value in env.items():
                why = (
                    svc.reasons.get(name)
                    or _MANAGED_ENV.get(name)
                    or ("the cluster's network: cluster_nic, nccl_*" if name in network else "")
                )
                print(f"    {name}={value}" + (f"    # {why}" if explain else ""))
            print(f"    {HF_TOKEN_LINE}    # where the host has a Hugging Face token (hf_token_source, or one preflight finds)")
            if svc.nodes > 1:
                print("    VLLM_HOST_IP=<each node's address on cluster_nic, read at deploy>")
            print(f"  vllm {' '.join(render.serve_command(svc, spec.vars.rolling_drain_timeout))}")
            if explain:
                for flag in svc.args:
                    print(f"    --{flag}: {svc.reasons.get(f'--{flag}', '')}")
                if render.drain_args(svc, spec.vars.rolling_drain_timeout):
                    print("    --shutdown-timeout: rolling_drain_timeout: a stopping instance finishes its requests first")
        for cluster in _clusters(planned):
            workers = ", ".join(map(str, cluster["workers"])) or "none"
            print(f"Ray cluster {cluster['name']}: head {cluster['head']}, workers {workers}")
        if explain:
            for spec, _ in planned:
                _explain_managed(spec)
        for line in _exposure_lines(planned):
            print(line)
        for version, source in (tables or {}).items():
            said = (
                f"validated against the table {source}"
                if source != "none"
                else f"not validated: no table (instinct-fleet vllm-facts {version})"
            )
            print(f"vLLM {version}: {said}")
        for line in _verdict_lines(gpus or {}):
            print(line)
        for line in grouped(findings):
            print(line, file=sys.stderr)
        print(f"{tally(findings, 'error')}, {tally(findings, 'warning')}", file=sys.stderr)
    return EXIT_INVALID if errors else EXIT_OK


def _exposure_lines(planned: list[tuple[HostSpec, list[Finding]]]) -> list[str]:
    """What each host's firewall will open to whom, hosts with the same openings together (converge/firewall.py)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for spec, _ in planned:
        groups.setdefault(tuple(firewall.exposure(spec)), []).append(str(spec.host))
    lines = []
    for sentences, hosts in groups.items():
        shown = ", ".join(hosts)
        if not sentences:
            lines.append(f"Firewall of {shown}: off (firewall = False): every port is open to anyone")
            continue
        lines.append(f"Firewall of {shown}, deny by default:")
        lines += [f"  {sentence}" for sentence in sentences]
    return lines


def _verdict_lines(gpus: Mapping[str, list[gpuhealth.Judged] | str | None]) -> list[str]:
    """``plan --gpus``: a line per host, then one per finding with the GPU it names; errors are what the next deploy
    quarantines."""
    lines = ["GPU health, read now from each host as the next deploy judges it:"] if gpus else []
    for host, verdict in sorted(gpus.items()):
        if verdict is None:
            lines.append(f"  {host}: no evidence (amd-smi gave none; see the gpu-evidence rule)")
        elif isinstance(verdict, str):
            lines.append(f"  {host}: {verdict}")
        else:
            errors = sum(1 for j in verdict if j.finding.severity == "error")
            lines.append(f"  {host}: " + (f"{errors} error(s), {len(verdict) - errors} warning(s)" if verdict else "ok"))
            lines += [f"    {j.finding.severity}: {j.finding.message} [{j.finding.rule}]" for j in verdict]
            if errors:
                lines.append("    the next deploy quarantines what these errors touch")
    return lines


def _verdict_json(verdict: list[gpuhealth.Judged] | str | None) -> dict[str, Any]:
    if verdict is None or isinstance(verdict, str):
        return {"read": False, "error": verdict or "no evidence"}
    return {
        "read": True,
        "findings": [{"gpu": j.gpu, "rule": j.finding.rule, "severity": j.finding.severity, "message": j.finding.message} for j in verdict],
    }


def _finding_json(f: Finding) -> dict[str, str | None]:
    """One finding for a machine: a line per host, with where the value was set."""
    return {"rule": f.rule, "host": f.host, "key": f.key, "origin": f.origin, "message": str(f)}


def _own_catalog(opts: argparse.Namespace) -> Catalog:
    """The catalog of the project a command without an inventory runs in: --project-dir, else the nearest directory at
    or above the current one that holds deploy.py or group_data/, else the package's alone."""
    if opts.project_dir:
        return _catalog(Path(opts.project_dir))
    here = Path.cwd()
    project = nearest_project([here, *here.parents])
    return _catalog(project) if project is not None else Catalog()


def _catalog(project: Path) -> Catalog:
    try:
        return Catalog.of(project)
    except CatalogError as exc:
        raise UsageError(f"{exc}; nothing was read from any host") from exc


def cmd_recipes(opts: argparse.Namespace) -> int:
    """The shipped recipes and the project's own, each with its owner; a project recipe is validated as a host would use it."""
    catalog = _own_catalog(opts)
    recipes = catalog.recipes
    problems = [f for r in recipes.values() if r.owner != SHIPPED for f in _render_recipe(r, catalog, DEFAULTS["vllm_version"])]
    if opts.json:
        print(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "owner": r.owner,
                        "model": r.model,
                        "summary": r.summary,
                        "source": r.source,
                        "nodes": r.nodes,
                        "env": {k: s.value for k, s in r.env.items()},
                        "args": {k: s.value for k, s in r.args.items()},
                        "notes": list(r.notes),
                    }
                    for r in recipes.values()
                ],
                indent=2,
            )
        )
    else:
        width = max(len(n) for n in recipes)
        for owner in dict.fromkeys(r.owner for r in recipes.values()):
            print(f"{owner}'s recipes:" if owner == SHIPPED else f"this project's recipes ({catalog.project}):")
            for r in (r for r in recipes.values() if r.owner == owner):
                print(f"  {r.name:<{width}}  {r.summary}" + ("" if owner == SHIPPED else f"  [{r.owner}]"))
                if opts.explain:
                    print(f"  {'':<{width}}  source: {r.source}")
                    for note in r.notes:
                        print(f"  {'':<{width}}  note: {note}")
    for line in grouped(problems):
        print(line, file=sys.stderr)
    return EXIT_INVALID if any(f.severity == "error" for f in problems) else EXIT_OK


def _render_recipe(
    recipe: Recipe, catalog: Catalog, version: str, image: str | None = None, env: Sequence[str] = (), arg: Sequence[str] = ()
) -> list[Finding]:
    """The findings of one recipe served alone on a host of its own, with overrides: what ``render`` and ``recipes`` check."""
    spec, findings = _resolve_recipe(recipe, catalog, version, image, env, arg)
    return [dataclasses.replace(f, origin=f"recipe {recipe.owner}") for f in [*findings, *validate_host(spec)]]


def _resolve_recipe(
    recipe: Recipe, catalog: Catalog, version: str, image: str | None, env: Sequence[str], arg: Sequence[str]
) -> tuple[HostSpec, list[Finding]]:
    data = {
        "vllm_recipe": recipe.name,
        "vllm_version": version,
        "vllm_image": image or default_image(version),
        "vllm_nodes": recipe.nodes,
        "vllm_env": _parse_env(env),
        "vllm_args": _parse_args(arg, catalog.table(version)),
        "vllm_instances": [{"name": re.sub(r"[^a-z0-9-]", "-", recipe.name)[:41].strip("-") or "main"}],
    }
    return resolve_host(None, data, catalog)


def cmd_render(opts: argparse.Namespace) -> int:
    catalog = _own_catalog(opts)
    recipe = catalog.recipes.get(opts.recipe)
    if recipe is None:
        raise UsageError(unknown_recipe_message(opts.recipe, catalog))
    version = opts.vllm_version or DEFAULTS["vllm_version"]
    spec, findings = _resolve_recipe(recipe, catalog, version, opts.image, opts.env, opts.arg)
    return _report([(spec, [*findings, *validate_host(spec)])], opts.json, opts.explain)


def _plan_limited(opts: argparse.Namespace) -> list[tuple[HostSpec, list[Finding]]]:
    """The chosen hosts' plans and their cluster peers'. Cluster rules need every member, so the whole inventory is planned, then limited."""
    planned, _ = _plan_scope(opts)
    return planned


def _plan_scope(opts: argparse.Namespace) -> tuple[list[tuple[HostSpec, list[Finding]]], set[str]]:
    """:func:`_plan_limited`, and the names of the hosts ``--limit`` chose themselves."""
    scope = _plan_project(opts)
    return scope.planned, scope.chosen


@dataclasses.dataclass(frozen=True)
class Scope:
    """What a command with an inventory plans: the chosen hosts and their peers, the hosts ``--limit`` chose, the findings
    about the project's files rather than a host, and the project's catalog."""

    planned: list[tuple[HostSpec, list[Finding]]]
    chosen: set[str]
    unread: list[Finding]
    catalog: Catalog
    hosts: list[HostData]  # every host of the inventory, as loaded


def _plan_project(opts: argparse.Namespace) -> Scope:
    """Read the project and its inventory, then plan every host of it (cluster rules need every member) and limit."""
    project = _project_dir(opts)
    catalog = _catalog(project)
    try:
        hosts, unread = read_inventory(opts.inventory, str(project))
    except InventoryError as exc:
        raise UsageError(str(exc)) from exc
    if not hosts:
        raise UsageError(f"{origins.named(opts.inventory)} lists no host")
    limits = opts.limit or None
    chosen = {h.name for h in select(hosts, limits)}
    for pattern in limits or ():
        if not select(hosts, [pattern]):
            raise UsageError(
                f"--limit {pattern!r} matches no host name or group of {origins.named(opts.inventory)} (a group name, or a glob of host names)"
            )
    planned = plan_hosts(hosts, catalog)
    scope = with_cluster_peers(planned, chosen)
    return Scope([p for p in planned if p[0].host in scope], chosen, unread, catalog, hosts)


def cmd_plan(opts: argparse.Namespace) -> int:
    scope = _plan_project(opts)
    versions = sorted({str(spec.vars.vllm_version) for spec, _ in scope.planned})
    tables = {v: scope.catalog.table_source(v) for v in versions}
    if not opts.gpus:
        return _report(scope.planned, opts.json, opts.explain, scope.unread, tables)
    if any(f.severity == "error" for _, fs in scope.planned for f in fs):
        _report(scope.planned, opts.json, opts.explain, scope.unread, tables)
        print("instinct-fleet: --gpus reads the hosts only once the inventory validates: no host was contacted", file=sys.stderr)
        return EXIT_INVALID
    chosen = [spec for spec, _ in scope.planned if spec.host in scope.chosen and spec.vars.gpu_health]
    verdicts = _gpu_verdicts(opts, chosen)
    code = _report(scope.planned, opts.json, opts.explain, scope.unread, tables, verdicts)
    bad = any(v is None or isinstance(v, str) or any(j.finding.severity == "error" for j in v) for v in verdicts.values())
    return EXIT_INVALID if bad else code


def _gpu_verdicts(opts: argparse.Namespace, specs: list[HostSpec]) -> dict[str, list[gpuhealth.Judged] | str | None]:
    """Each host's GPU health verdict, read now (one read-only command per host) and judged as the next deploy judges
    it; a host that cannot be read gives its error."""
    if not specs:
        return {}
    results = remote.Hosts(opts.inventory, str(_project_dir(opts))).run_all(
        {str(s.host): status.evidence_script() for s in specs}, min(max(s.vars.command_timeout for s in specs), 60)
    )
    read = {str(s.host): (s, results[str(s.host)].stdout) for s in specs if results[str(s.host)].error is None}
    verdicts: dict[str, list[gpuhealth.Judged] | str | None] = {**status.gpu_verdicts(read)}
    for s in specs:
        if (error := results[str(s.host)].error) is not None:
            verdicts[str(s.host)] = f"unreachable: {error}"
    return verdicts


def _project_dir(opts: argparse.Namespace) -> Path:
    """The directory pyinfra runs in: it reads config.py and group_data/ there. Every command finds the same one.

    ``--project-dir`` when given; else the deploy file's directory when one is named (deploy, rollback,
    warm); else the project the inventory sits in, or the current directory when that is a project
    (:func:`instinct_fleet.model.inventory.find_project`); else a usage error.
    """
    if opts.project_dir:
        return Path(opts.project_dir)
    deploy_file = getattr(opts, "deploy_file", None)
    if deploy_file:
        return project_of(deploy_file)
    try:
        return find_project(opts.inventory, Path.cwd())
    except InventoryError as exc:
        raise UsageError(str(exc)) from exc


def _deploy_file(opts: argparse.Namespace) -> tuple[Path, str]:
    """The project directory and the deploy file's name in it; the usage errors of deploy and rollback, before anything is read."""
    if opts.json and not (opts.yes or opts.dry):
        raise UsageError("--json does not ask before it changes hosts: add -y to deploy, or --dry to show what would change")
    project = _project_dir(opts)
    if opts.deploy_file:
        given = Path(opts.deploy_file)
        if opts.project_dir and project_of(opts.deploy_file) != project.resolve():
            raise UsageError(f"{opts.deploy_file} is not in --project-dir {opts.project_dir}; give one of them")
        if not given.is_file():
            raise UsageError(f"no deploy file {opts.deploy_file}")
        return project_of(opts.deploy_file), given.name
    if not (project / "deploy.py").is_file():
        raise UsageError(
            f"no deploy.py in {project} (the project of {origins.named(opts.inventory)}): run this from your project's directory, name the deploy file "
            f"(instinct-fleet deploy INVENTORY path/to/deploy.py), or write a project with `instinct-fleet init DIR`"
        )
    return project, "deploy.py"


def cmd_deploy(opts: argparse.Namespace) -> int:
    """Validate every chosen host before connecting to any, then hand over to pyinfra."""
    where = _deploy_file(opts)  # a missing deploy file is a usage error before anything else
    if refused((f for _, fs in _plan_limited(opts) for f in fs), "nothing was deployed and no host was contacted", warnings=True):
        return EXIT_INVALID
    return _deploy(opts, *where)


def _deploy(opts: argparse.Namespace, project: Path, deploy_file: str, mode: RunMode | None = None) -> int:
    """pyinfra with the deploy file, on a validated inventory, in the project directory (its config.py and group_data/);
    ``mode``: what the run does beyond converging (rollback, warm, quarantine, admit), handed over as its argument."""
    mode = mode or RunMode()
    argv = [sys.executable, "-m", "pyinfra", str(Path(opts.inventory).resolve()), deploy_file]
    argv += ["-y"] if opts.yes else []
    argv += ["--dry"] if opts.dry else []
    for pattern in opts.limit or ():
        argv += ["--limit", pattern]
    sys.stdout.flush()
    if not opts.json:
        code, _ = _child([*argv, *mode.argument(), *opts.passthrough], project, dict(os.environ), capture=False)
        return code
    # --json: pyinfra's results, plus the roll summary the deploy writes at its end.
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "roll.json"
        told = dataclasses.replace(mode, summary=str(summary)).argument()
        code, stdout = _child([*argv, "--json", *told, *opts.passthrough], project, dict(os.environ), capture=True)
        try:
            payload = json.loads(stdout)
        except json.JSONDecodeError:  # pyinfra stopped before its results (no host left, interrupted); its error is on stderr
            payload = {"results": None}
        payload["roll"] = json.loads(summary.read_text())["roll"] if summary.is_file() else []
    print(json.dumps(payload, indent=2))
    return code


def cmd_warm(opts: argparse.Namespace) -> int:
    """A deploy that restarts one instance per compile configuration and spreads its cache (instinct_fleet/roll/spread.py)."""
    where = _deploy_file(opts)
    planned = _plan_limited(opts)
    if refused((f for _, fs in planned for f in fs), "nothing was warmed and no host was contacted", warnings=True):
        return EXIT_INVALID
    if not all(spec.vars.compile_cache_spread for spec, _ in planned):
        raise UsageError("compile_cache_spread is False in the inventory, so warm would copy no cache: set it True, or deploy")
    code = _deploy(opts, *where, RunMode(warm=True))
    print(
        "instinct-fleet: each compile configuration was built on one host and its cache copied to the others that serve it; "
        "`instinct-fleet deploy` with this inventory now restarts them warm.",
        file=sys.stderr,
    )
    return code


def _generation(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a generation is a number from 1 (ls {paths.GENERATIONS_DIR} on a host), not {text!r}")
    return int(text)


def cmd_rollback(opts: argparse.Namespace) -> int:
    """A deploy whose serving files come from an earlier generation on each host (instinct_fleet/converge/generations.py)."""
    where = _deploy_file(opts)
    if refused((f for _, fs in _plan_limited(opts) for f in fs), "nothing was rolled back and no host was contacted", warnings=True):
        return EXIT_INVALID
    code = _deploy(opts, *where, RunMode(restore="previous" if opts.to is None else str(opts.to)))
    print(
        "instinct-fleet: the hosts rolled back now run an earlier generation than the inventory describes; "
        "`instinct-fleet deploy` with this inventory rolls them forward again. Change the inventory to keep them there.",
        file=sys.stderr,
    )
    return code


class Refused(Exception):
    """The inventory is invalid: its findings were printed (rules.refused)."""


def _one_host(opts: argparse.Namespace, verb: str) -> tuple[Path, str]:
    """The deploy file, and the one host ``quarantine`` or ``admit`` acts on, validated before any connection; the
    deploy then runs on that host alone (--limit)."""
    where = _deploy_file(opts)
    opts.limit = [opts.host]
    try:
        scope = _plan_project(opts)
    except UsageError as exc:
        raise UsageError(f"{opts.host} is not a host of {origins.named(opts.inventory)}" if "--limit" in str(exc) else str(exc)) from exc
    if opts.host not in scope.chosen:  # a group's name
        raise UsageError(f"{opts.host} is not a host of {origins.named(opts.inventory)} (give one host by its inventory name)")
    spec = next(spec for spec, _ in scope.planned if str(spec.host) == opts.host)
    if spec.cluster is not None:
        raise UsageError(
            f"{opts.host} is a member of the Ray cluster {spec.cluster.name}: its cluster has one instance, which a GPU health error "
            "fails as a whole; take the cluster out of the inventory's pool instead"
        )
    if verb == "quarantine" and opts.gpu is not None and opts.gpu >= spec.gpu_count:
        raise UsageError(f"{opts.host} has GPUs 0 to {spec.gpu_count - 1} (gpu_count), not {opts.gpu}")
    if refused((f for _, fs in scope.planned for f in fs), f"nothing was changed by {verb} and no host was contacted", warnings=True):
        raise Refused
    return where


def cmd_quarantine(opts: argparse.Namespace) -> int:
    """Drain and stop a host's instances (or those on one GPU) and hold them out, whatever its evidence, until ``admit``
    (instinct_fleet/converge/gpuhealth.py): a deploy of that host with the operator's entry in its quarantine record."""
    try:
        where = _one_host(opts, "quarantine")
    except Refused:
        return EXIT_INVALID
    code = _deploy(opts, *where, RunMode(ask=gpuhealth.Ask({opts.host: (opts.gpu, opts.reason)})))
    print(
        f"instinct-fleet: `instinct-fleet admit {origins.named(opts.inventory)} {opts.host}` puts it back once the cause is fixed.",
        file=sys.stderr,
    )
    return code


def cmd_admit(opts: argparse.Namespace) -> int:
    """Read a host's evidence again; refuse while a gpu-* rule finds an error, else clear the operator's entries and the
    re-admission count, converge the host and put its instances back behind their health gate."""
    try:
        where = _one_host(opts, "admit")
    except Refused:
        return EXIT_INVALID
    return _deploy(opts, *where, RunMode(ask=gpuhealth.Ask(admit=frozenset({opts.host}))))


def _child(argv: list[str], cwd: Path, env: dict[str, str], capture: bool) -> tuple[int, str]:
    """Run pyinfra (or verify's pytest) in its own session and hand it each SIGINT and SIGTERM this command gets,
    once: the child decides what an interrupt means (instinct_fleet/roll/run.py: finish the open roll batch, then
    stop non-zero), and is never left running when this command ends."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE if capture else None, text=True, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    with interrupts.handled(forward):
        stdout, _ = proc.communicate()
    return proc.returncode, stdout or ""


VERIFY_NEEDS = {"pytest": "pytest", "testinfra": "pytest-testinfra"}


def cmd_verify(opts: argparse.Namespace) -> int:
    """Run the testinfra verify module (instinct_fleet.verify) against the reachable chosen hosts; one line for each other host."""
    missing = [package for module, package in VERIFY_NEEDS.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise UsageError(f"verify runs testinfra, but {' and '.join(missing)} is not installed: pip install 'instinct-fleet[verify]'")
    specs = _valid_specs(opts, "nothing was verified and no host was contacted")
    if specs is None:
        return EXIT_INVALID
    # Each host is reached once first: an unreachable host is one line with its cause, not an error per check.
    project = _project_dir(opts)
    hosts = remote.Hosts(opts.inventory, str(project))
    timeout = min(max(s.vars.command_timeout for s in specs), 60)
    reached = hosts.run_all({str(s.host): "true" for s in specs}, timeout)
    unreachable = {name: r.error or r.stderr.strip() or "`true` failed" for name, r in reached.items() if not r.ok}
    for name, why in sorted(unreachable.items()):
        print(f"{name}: not verified: {why}", file=sys.stderr)
    if len(unreachable) == len(specs):
        return EXIT_INVALID
    module = Path(str(resources.files("instinct_fleet").joinpath("verify")))
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(module), str(module)]
    argv += ["--inventory", str(Path(opts.inventory).resolve()), "--project-dir", str(project.resolve())]
    for name in sorted(reached):
        if name not in unreachable:
            argv += ["--limit", name]
    code, _ = _child([*argv, *opts.passthrough], project, dict(os.environ), capture=False)
    return code or (EXIT_INVALID if unreachable else EXIT_OK)


def cmd_targets(opts: argparse.Namespace) -> int:
    """Prometheus file_sd targets for the vLLM endpoints of the chosen hosts (validated first, nothing contacted), and
    with --alerts, --alertmanager and --grafana the files Prometheus, Alertmanager and Grafana read. Every output is
    made and every path checked before anything is written: a mistake in a later argument writes nothing."""
    planned = _plan_limited(opts)
    if refused((f for _, fs in planned for f in fs), "no targets written"):
        return EXIT_INVALID
    specs = [spec for spec, _ in planned]
    groups = monitoring.file_sd(specs)
    if not groups:  # an empty file would leave Prometheus scraping nothing, without a word
        raise UsageError("the chosen hosts serve no vLLM instance, metrics exporter or router: no target to write")
    if opts.alertmanager and specs[0].vars.alert_webhook_url is None:
        raise UsageError("--alertmanager: set alert_webhook_url (in group_data/all.py) to the URL Alertmanager delivers to")
    if opts.grafana_path and not opts.grafana:
        raise UsageError("--grafana-path is where Grafana reads the boards --grafana DIR writes: give --grafana too")
    writes: list[tuple[Path, object]] = []  # (file, value), each checked before any is written
    unfired: list[str] = []
    if opts.alerts:
        rules, unfired = slo.rule_file(specs)
        writes.append((_output(opts.alerts, "--alerts", "Prometheus's rule_files"), rules))
    if opts.alertmanager:
        writes.append(
            (_output(opts.alertmanager, "--alertmanager", "Alertmanager's --config.file"), slo.alertmanager_config(specs[0].vars))
        )
    if opts.grafana:
        writes += _boards(opts.grafana, opts.grafana_path, specs)
    if opts.output:
        writes.append((_output(opts.output, "-o", "Prometheus's file_sd_configs"), groups))
    for path, value in writes:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_serialised(path, value))
    for line in unfired:
        print(f"warning: {line}: that alert cannot fire there", file=sys.stderr)
    if opts.grafana:
        print(
            f"wrote the boards and instinct-fleet-provisioning.yaml (copy it into /etc/grafana/provisioning/dashboards/) to {opts.grafana}",
            file=sys.stderr,
        )
    if not opts.output:
        print(json.dumps(groups, indent=2))
    return 0


def _output(target: str, option: str, reader: str) -> Path:
    """The file an option names: not a directory; its missing directories are made when it is written."""
    out = Path(target)
    if out.is_dir():
        raise UsageError(f"{option} {target!r} is a directory; name the file {reader} reads, such as {out / 'instinct-fleet.yml'}")
    if any(p.exists() and not p.is_dir() for p in out.parents):
        raise UsageError(f"{option} {target!r}: {next(p for p in out.parents if p.exists() and not p.is_dir())} is a file, not a directory")
    return out


def _serialised(path: Path, value: object) -> str:
    """YAML where the file's name says YAML (Prometheus's rules, Alertmanager's config, Grafana's provisioning),
    JSON otherwise (file_sd targets, the boards)."""
    if path.suffix in (".yml", ".yaml"):
        return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=1_000_000)
    return json.dumps(value, indent=2) + "\n"


def _boards(directory: str, mounted: str | None, specs: list[HostSpec]) -> list[tuple[Path, object]]:
    """The Grafana boards (commands/boards.py) and the provisioning file that loads them from where Grafana sees them
    (``mounted``, as a container mounts the directory; default: the directory itself)."""
    where = Path(directory)
    if where.exists() and not where.is_dir():
        raise UsageError(f"--grafana {directory!r} is a file: name the directory Grafana's dashboard provider reads")
    if mounted is not None and not mounted.startswith("/"):
        raise UsageError(f"--grafana-path {mounted!r}: give the absolute path at which Grafana reads {directory}")
    try:
        boards_ = {"instinct-fleet.json": boards.fleet_board(specs), "instinct-fleet-instance.json": boards.instance_board(specs)}
    except boards.BoardError as exc:
        raise UsageError(f"--grafana: {exc}") from exc
    provider = boards.provisioning(mounted or str(where.resolve()))
    return [*((where / name, board) for name, board in boards_.items()), (where / "instinct-fleet-provisioning.yaml", provider)]


def _valid_specs(opts: argparse.Namespace, doing: str) -> list[HostSpec] | None:
    """The chosen hosts' specs, or None after printing their errors and their peers' (nothing is contacted then)."""
    planned, chosen = _plan_scope(opts)
    if refused((f for _, fs in planned for f in fs), doing):
        return None
    return [spec for spec, _ in planned if spec.host in chosen]


def _read_status(hosts: remote.Hosts, specs: list[HostSpec]) -> list[status.Row]:
    """Every unit of these hosts, one round trip per host, all hosts at once."""
    timeout = max(s.vars.command_timeout for s in specs)
    results = hosts.run_all({str(s.host): status.script(s) for s in specs}, min(timeout, 60))
    rows: list[status.Row] = []
    read = {}
    for spec in specs:
        result = results[str(spec.host)]
        if result.error is not None:
            rows += status.unreachable(spec, result.error)
        else:
            rows += status.parse(spec, result.stdout)
            read[str(spec.host)] = (spec, result.stdout)
    # GPU health: each host that gave evidence, judged against the majority of the hosts read, as the deploy judges them.
    return rows + [status.health_row(host, judged) for host, judged in status.gpu_verdicts(read).items() if judged is not None]


def cmd_status(opts: argparse.Namespace) -> int:
    """Every unit of the chosen hosts: state, health, image and load; exit 1 when one is not as it should be."""
    specs = _valid_specs(opts, "no host was contacted")
    if specs is None:
        return EXIT_INVALID
    rows = _read_status(remote.Hosts(opts.inventory, str(_project_dir(opts))), specs)
    if opts.json:
        print(json.dumps(status.as_json(rows), indent=2))
    else:
        print(status.table(rows))
    return EXIT_OK if all(r.ok for r in rows) else EXIT_INVALID


def cmd_bench(opts: argparse.Namespace) -> int:
    """Run vllm bench serve against the chosen instances; refuse those not serving and hosts mid-roll."""
    if opts.warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {opts.warmup}: nothing was benchmarked and no host was contacted")
    specs = _valid_specs(opts, "nothing was benchmarked and no host was contacted")
    if specs is None:
        return EXIT_INVALID
    client = None
    if opts.client:
        project = _project_dir(opts)
        everyone = {str(spec.host): spec for spec, _ in plan_hosts(load_inventory(opts.inventory, str(project)), _catalog(project))}
        if opts.client not in everyone:
            raise UsageError(f"--client {opts.client!r} is not a host of {origins.named(opts.inventory)}")
        client = everyone[opts.client]
    if opts.accuracy:
        return _bench_accuracy(opts, specs)
    todo: list[workload.Job] = []
    try:
        concurrency = workload.concurrencies(opts.concurrency)
        for spec in specs:
            for svc in spec.serves:
                if not opts.instance or fnmatch.fnmatch(svc.name, opts.instance):
                    todo += workload.jobs(spec, svc, opts.profile, opts.num_prompts, concurrency)
    except workload.BenchRequestError as exc:
        raise UsageError(f"{exc}; no host was contacted") from exc
    if not todo:
        raise UsageError("no vLLM instance matches --limit and --instance")
    hosts = remote.Hosts(opts.inventory, str(_project_dir(opts)))
    benched = {str(j.spec.host): j.spec for j in todo}
    rows = {(r.host, r.instance): r for r in _read_status(hosts, list(benched.values()))}
    refused = []
    ready = []
    for job in todo:
        why = _refused(rows[(str(job.spec.host), job.svc.name)])
        if why:
            refused.append(f"{job.label()}: refused, {why}")
        else:
            ready.append(job)
    for line in dict.fromkeys(refused):
        print(line, file=sys.stderr)
    if not ready:
        print("nothing to benchmark", file=sys.stderr)
        return EXIT_INVALID
    out_dir = Path(opts.output) / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    image_ids = {key: row.image_id for key, row in rows.items()}
    print(f"benchmarking {len(ready)} run(s) with profile {opts.profile}; results in {out_dir}", flush=True)
    outcomes = bench.run(
        hosts, ready, client, out_dir, workload.time_limit(ready), lambda line: print(line, flush=True), image_ids, opts.warmup
    )
    failed = [o for o in outcomes if o.problem]
    for o in failed:
        print(f"{o.job.label()}: {o.problem}", file=sys.stderr)
    written = sum(o.saved for o in outcomes)
    print(f"{written} result file(s) in {out_dir}; next: instinct-fleet report {out_dir}")
    return EXIT_INVALID if failed or refused else EXIT_OK


def _refused(row: status.Row) -> str | None:
    """Why ``bench`` leaves an instance alone (its status row): a roll in progress on its host, or it is not serving."""
    if row.rolling:
        return f"a roll is in progress on {row.host} ({row.rolling}); wait for the deploy, or deploy again if it failed"
    return f"the instance is not serving: {row.problem()}" if row.problem() else None


def _bench_accuracy(opts: argparse.Namespace, specs: list[HostSpec]) -> int:
    """``bench --accuracy``: the accuracy probe alone (the canary's, instinct_fleet/live/accuracy.py) on the chosen
    instances, refused as ``bench`` refuses them; answers under ``--output``, read by ``report``."""
    from instinct_fleet.model import probe

    pairs = [(spec, svc) for spec in specs for svc in spec.serves if not opts.instance or fnmatch.fnmatch(svc.name, opts.instance)]
    if not pairs:
        raise UsageError("no vLLM instance matches --limit and --instance")
    hosts = remote.Hosts(opts.inventory, str(_project_dir(opts)))
    rows = {(r.host, r.instance): r for r in _read_status(hosts, list({str(s.host): s for s, _ in pairs}.values()))}
    ready = []
    for spec, svc in pairs:
        why = _refused(rows[(str(spec.host), svc.name)])
        if why:
            print(f"{spec.host}/{svc.name}: refused, {why}", file=sys.stderr)
        else:
            ready.append((spec, svc))
    if not ready:
        print("nothing to probe", file=sys.stderr)
        return EXIT_INVALID
    items, source, _ = probe.of(ready[0][0])  # validated; canary_probe and its size are one value for the fleet
    out_dir = Path(opts.output) / (datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-probe")
    print(f"asking the accuracy probe ({len(items)} items, {source}) of {len(ready)} instance(s); answers in {out_dir}", flush=True)
    asked = bench.probe_all(hosts, ready, items, source, out_dir, lambda line: print(line, flush=True))
    for a in asked:
        if a.problem:
            print(f"{a.label}: {a.problem}", file=sys.stderr)
    print(f"{sum(a.path is not None for a in asked)} probe file(s) in {out_dir}; next: instinct-fleet report {out_dir}")
    return EXIT_INVALID if any(a.problem for a in asked) or len(ready) < len(pairs) else EXIT_OK


def cmd_tune(opts: argparse.Namespace) -> int:
    """Sweep one instance's settings over the chosen hosts at once (instinct_fleet/commands/tune.py), then restore them."""
    from instinct_fleet.commands import tune

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("tune draws pareto.png with matplotlib, which is not installed: pip install 'instinct-fleet[report]'")
    try:
        if opts.resume:
            given = [
                name
                for name in (
                    "config",
                    "instance",
                    "vary",
                    "vary_env",
                    "profile",
                    "num_prompts",
                    "concurrency",
                    "slo",
                    "limit",
                    "max_out",
                    "output",
                )
                if getattr(opts, name)
            ]
            if given:
                raise UsageError(f"--resume takes the sweep from DIR/sweep.json; drop --{given[0].replace('_', '-')}")
            directory = Path(opts.resume)
            definition = trials.Results.sweep_of(directory)
        else:
            definition = sweeps.Sweep.from_json(_tune_settings(opts))
            directory = Path(opts.output or Path("results") / f"tune-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}")
            if (directory / "sweep.json").exists():
                raise sweeps.TuneError(f"{directory} holds an earlier sweep: go on with --resume {directory}, or choose another --output")
        results = trials.Results(directory)
        opts.limit = [definition.limit] if definition.limit else None
        scope = _plan_project(opts)
        planned, hosts = scope.planned, scope.hosts
        if refused((f for _, fs in planned for f in fs), "nothing was tuned and no host was contacted"):
            return EXIT_INVALID
        checked = sweeps.check(hosts, scope.chosen, definition, scope.catalog)
    except sweeps.TuneError as exc:
        raise UsageError(f"{exc}; no host was contacted") from exc
    specs = {str(spec.host): spec for spec, _ in planned if str(spec.host) in checked.hosts}
    queues = sweeps.assign(list(checked.points), checked.hosts)
    done = results.done()
    if all(p.done_key(host) in done for host, queue in queues.items() for p in queue):
        raise UsageError(f"{directory} measured every point of its sweep already: nothing to do; its report is {directory / 'tune.md'}")
    print(sweeps.plan_text(checked, definition, specs, done), flush=True)
    if opts.dry:
        return EXIT_OK
    if not opts.resume:
        results.start(definition)
    print(f"results in {directory}", flush=True)
    started = time.monotonic()
    outcome = tune.run(
        remote.Hosts(opts.inventory, str(_project_dir(opts))), hosts, checked, definition, results, lambda line: print(line, flush=True)
    )
    wall = time.monotonic() - started
    speed = (
        f"{len(outcome.ran)} trial(s) on {len(checked.hosts)} host(s) took {wall:.0f} s, restores included; "
        f"one after another the trials alone take {sum(t.seconds or 0 for t in outcome.ran):.0f} s."
    )
    tunereport.write_report(results, hosts, definition, checked, speed)
    print(f"{speed}\nwrote {directory / 'tune.md'}, pareto.png, trials.json" + (", best.py" if (directory / "best.py").exists() else ""))
    for host, why in outcome.unprepared.items():
        print(f"instinct-fleet: {host} ran nothing: {why}", file=sys.stderr)
    for host, why in outcome.not_restored.items():
        print(f"instinct-fleet: {host} was NOT restored: {why}. Deploy the inventory to put it back.", file=sys.stderr)
    if outcome.interrupted:
        back = "some hosts are NOT back (above)" if outcome.not_restored else "every host is back on its deployed configuration"
        print(f"instinct-fleet: interrupted; {back}. Resume with --resume {directory}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_INVALID if outcome.unprepared or outcome.not_restored else EXIT_OK


def _tune_settings(opts: argparse.Namespace) -> dict[str, Any]:
    """The sweep's settings: the config file's, then each option given on the command line over it."""
    data: dict[str, Any] = sweeps.load_config(Path(opts.config)) if opts.config else {}
    if opts.instance:
        data["instance"] = opts.instance
    if opts.vary:
        data["vary"] = {name: list(values) for name, values in (sweeps.parse_vary(v, False) for v in opts.vary)}
    if opts.vary_env:
        data["vary_env"] = {name: list(values) for name, values in (sweeps.parse_vary(v, True) for v in opts.vary_env)}
    for key in ("profile", "num_prompts", "concurrency", "limit", "max_out", "repeats", "warmup"):
        if getattr(opts, key) is not None:
            data[key] = getattr(opts, key)
    if opts.slo:
        data["slo"] = list(opts.slo)
    return data


def cmd_init(opts: argparse.Namespace) -> int:
    """Write the example project into DIR, keeping every file that is there."""
    directory = Path(opts.directory)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{opts.directory} exists and is not a directory")
    written = scaffold.init(directory)
    for w in written:
        print(f"{'kept ' if w.kept else 'wrote'} {w.path}")
    print(
        f"next: put your hosts in {directory / 'inventories' / 'prod.py'}, your settings in {directory / 'group_data'}, then\n"
        f"  cd {directory} && instinct-fleet plan inventories/prod.py && instinct-fleet deploy inventories/prod.py"
    )
    return EXIT_OK


def cmd_vllm_facts(opts: argparse.Namespace) -> int:
    """Extract a vLLM version's table (env vars, flags, start-up checks) from its own source into the project."""
    from instinct_fleet.model import extract

    given = opts.version
    opts.version = given[1:] if re.fullmatch(r"v\d.*", given) else given  # a git tag (v0.22.0) names the version 0.22.0
    if not VERSION.fullmatch(opts.version):
        raise UsageError(f"{given!r} is not a vLLM version: give one as vLLM numbers its releases (0.22.0, 0.12.0rc1, 0.6.3.post1)")
    if opts.show:
        return _show_table(opts)
    if opts.version in knowledge.supported_versions():
        raise UsageError(
            f"vLLM {opts.version} is shipped with instinct-fleet and tested: nothing to extract "
            f"(`instinct-fleet vllm-facts {opts.version} --show` prints its table)"
        )
    if opts.wheel and opts.from_host:
        raise UsageError("give --wheel or --from-host, not both: the table comes from one source")
    if bool(opts.from_host) != bool(opts.inventory):
        raise UsageError("--from-host HOST reads the image of a host of --inventory INVENTORY: give both")
    catalog = _facts_catalog(opts)
    if catalog.project is None:
        raise UsageError(
            "no project here to store the table in: run this in your project's directory (deploy.py or group_data/), or give --project-dir"
        )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if opts.from_host:
                wheel = _image_source(opts, Path(tmp))
            elif opts.wheel:
                wheel = Path(opts.wheel)
                if not wheel.is_file():
                    raise UsageError(f"--wheel {opts.wheel}: no such file")
            else:
                wheel = extract.download(opts.version, Path(tmp))
            data = extract.extract_release(wheel, opts.version)
    except extract.ExtractError as exc:
        hint = "" if opts.wheel or opts.from_host else "; for a build that is not on PyPI (AMD's dev images), give --wheel or --from-host"
        raise UsageError(f"{exc}{hint}") from exc
    path = write_facts(catalog.project, data)
    flags, env = data["flags"], data["env_vars"]
    assert isinstance(flags, dict) and isinstance(env, list)
    print(
        f"wrote {path}: {len(env)} env vars, {len(flags)} flags of vLLM {opts.version}. Validation now knows it: set "
        f"vllm_version = {opts.version!r}; `instinct-fleet plan` says which table it used. instinct-fleet is tested with "
        f"{', '.join(knowledge.supported_versions())} only."
    )
    return EXIT_OK


# A release's version as vLLM's wheels name it (PEP 440's release, pre, post and local parts as vLLM uses them).
VERSION = re.compile(r"\d+(?:\.\d+)+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?(?:\+[A-Za-z0-9.]+)?")


def _facts_catalog(opts: argparse.Namespace) -> Catalog:
    """The catalog vllm-facts reads and writes: the inventory's project with --inventory, else the one it runs in."""
    return _catalog(_project_dir(opts)) if opts.inventory else _own_catalog(opts)


def _show_table(opts: argparse.Namespace) -> int:
    """Print the table validation reads for a version, shipped or the project's, and where it comes from."""
    catalog = _facts_catalog(opts)
    table = catalog.table(opts.version)
    if table is None:
        raise UsageError(
            f"no table for vLLM {opts.version} (there are tables for {', '.join(catalog.versions())}): "
            f"`instinct-fleet vllm-facts {opts.version}` extracts one"
        )
    path = catalog.facts.get(opts.version) or knowledge.shipped_file(opts.version)
    print(path.read_text(), end="")
    print(
        f"vLLM {opts.version}: {len(table.env_vars)} env vars, {len(table.flags)} flags, {catalog.table_source(opts.version)}",
        file=sys.stderr,
    )
    return EXIT_OK


def _image_source(opts: argparse.Namespace, directory: Path) -> Path:
    """The vLLM source inside ``--from-host``'s image (its vllm_image, as validated), read on that host with docker."""
    from instinct_fleet.model import extract

    opts.limit = [opts.from_host]
    specs = _valid_specs(opts, "nothing was read from any host")
    if specs is None:
        raise UsageError(f"{origins.named(opts.inventory)} does not validate (above): nothing was read from any host")
    (spec,) = specs
    image = spec.services[0].image if spec.services else str(spec.vars.vllm_image)
    print(f"reading the vLLM source inside {image} on {spec.host}", file=sys.stderr, flush=True)
    done = remote.Hosts(opts.inventory, str(_project_dir(opts))).run(str(spec.host), extract.image_command(image), 600)
    if done.error is not None or not done.ok:
        said = done.error or (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise extract.ExtractError(f"{spec.host} could not read {image}: {said}")
    return extract.from_image(done.stdout, directory)


def cmd_report(opts: argparse.Namespace) -> int:
    """Write report.md and PNG plots from a directory of vLLM benchmark results, and print the fleet table; or, with
    --fleet, draw the fleet board's main panels from Prometheus."""
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("report draws its plots with matplotlib, which is not installed: pip install 'instinct-fleet[report]'")
    if (opts.results is None) == (opts.fleet is None):
        raise UsageError("report takes RESULTS_DIR, or --fleet INVENTORY with --prometheus URL: one of the two")
    if opts.fleet is not None:
        return _fleet_picture(opts)
    from instinct_fleet.live import report

    try:
        path, terminal = report.write(Path(opts.results))
    except report.ReportError as exc:
        raise UsageError(str(exc)) from exc
    print(terminal)
    print(f"\nwrote {path} and its plots")
    return 0


def _fleet_picture(opts: argparse.Namespace) -> int:
    """The fleet board's main panels over the last --since, from --prometheus, on one PNG (commands/picture.py)."""
    if not opts.prometheus:
        raise UsageError("report --fleet asks Prometheus: give its address with --prometheus URL (http://host:9090)")
    if not defaults.DURATION.match(opts.since):
        raise UsageError(f"--since {opts.since!r} is not a Prometheus duration of one unit, such as 30m, 6h or 2d")
    out = Path(opts.output)
    if out.is_dir() or not out.parent.is_dir():
        raise UsageError(f"-o {opts.output!r}: name a PNG file in an existing directory")
    opts.inventory, opts.limit = opts.fleet, []
    planned = _plan_limited(opts)
    if refused((f for _, fs in planned for f in fs), "nothing was drawn"):
        return EXIT_INVALID
    try:
        board = boards.fleet_board([spec for spec, _ in planned])
    except boards.BoardError as exc:
        raise UsageError(f"report --fleet: {exc}") from exc
    end = time.time()
    span = defaults.duration_seconds(opts.since)
    try:
        panels = picture.fetch(board, opts.prometheus, end - span, end, max(1.0, span / 240))
    except picture.PictureError as exc:
        raise UsageError(str(exc)) from exc
    picture.draw(panels, out, f"{origins.named(opts.fleet)}: the last {opts.since}", end)
    print(f"wrote {out}: {', '.join(f'{p.title} ({len(p.lines)})' for p in panels)}")
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    """argparse, with a suggestion for a misspelt subcommand (Python 3.11's argparse offers none)."""

    def error(self, message: str) -> typing.NoReturn:
        wrong = re.match(r"argument \w+: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if wrong:
            choices = re.findall(r"'([^']*)'", wrong.group(2))
            close = difflib.get_close_matches(wrong.group(1), choices, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (one of {', '.join(choices)})"
            message = f"no command {wrong.group(1)!r}{hint}"
        super().error(message)


def _unknown_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The first option of ``argv`` that its subcommand does not take (argparse would first complain of a missing
    argument, or take it for the pyinfra arguments), with the closest it takes; None when every option is known."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = next((a for a in argv if not a.startswith("-")), None)
    sub = subparsers.choices.get(command) if command else None
    if sub is None:
        return None
    known = [o for a in sub._actions for o in a.option_strings]
    for given in argv:
        name = given.split("=", 1)[0]
        if not name.startswith("--") or given.startswith("--arg=") or name in known:
            continue
        if [o for o in known if o.startswith(name)]:  # argparse's own abbreviations: it decides them
            continue
        close = difflib.get_close_matches(name, known, n=1)
        return f"{command} takes no option {name}" + (f"; did you mean {close[0]}?" if close else f" (`instinct-fleet {command} --help`)")
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="instinct-fleet", description="Tuned vLLM serving on AMD Instinct fleets.")
    parser.add_argument("--version", action="version", version=f"instinct-fleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    recipes = sub.add_parser("recipes", help="list the built-in recipes and the project's own (recipes/*.toml), each with its owner")
    recipes.set_defaults(func=cmd_recipes)

    render = sub.add_parser("render", help="validate and render one recipe with overrides")
    render.add_argument("--recipe", required=True)
    render.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    render.add_argument("--arg", action="append", default=[], metavar="FLAG[=VALUE]")
    render.add_argument("--vllm-version", help=f"vLLM version to validate against (default {DEFAULTS['vllm_version']})")
    render.add_argument("--image", help=f"image reference (default {DEFAULTS['vllm_image']}, with the tag of --vllm-version)")
    render.set_defaults(func=cmd_render)

    plan = sub.add_parser("plan", help="resolve and validate every host of an inventory")
    plan.add_argument("inventory")
    plan.add_argument(
        "--gpus",
        action="store_true",
        help="also read each chosen host's GPU evidence (one read-only command per host, once the inventory validates) "
        "and show the health verdict per host and GPU that the next deploy acts on; exit 1 on an error or an unreadable host",
    )
    plan.set_defaults(func=cmd_plan)

    for p in (recipes, render, plan):
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--explain", action="store_true", help="show the reason behind each env var and flag")
    for p in (recipes, render):
        p.add_argument(
            "--project-dir",
            help="the project whose own recipes/ and vllm-facts/ count too (default: the nearest directory at or above the "
            "current one that holds deploy.py or group_data/)",
        )

    deploy = sub.add_parser(
        "deploy",
        help="validate an inventory, then run pyinfra with the deploy file (no host is contacted on errors); arguments after -- go to pyinfra",
    )
    verify = sub.add_parser(
        "verify", help="check deployed hosts with the testinfra verify module (read-only); arguments after -- go to pytest"
    )
    rollback = sub.add_parser(
        "rollback",
        help="put back an earlier generation of each host's serving files through the roll's batches and health gates; arguments after -- go to pyinfra",
    )
    warm = sub.add_parser(
        "warm",
        help="build each new compile configuration on one host (behind its health gate) and copy its cache to every "
        "other host that serves it, which does not restart: the next deploy starts them warm; arguments after -- go to pyinfra",
    )
    status_p = sub.add_parser("status", help="every unit of the fleet now: state, health, image, requests running/waiting, KV cache")
    bench_p = sub.add_parser(
        "bench", help="vllm bench serve against each instance, from its own image, on its host (or --client); results for report"
    )
    targets = sub.add_parser("targets", help="Prometheus file_sd JSON for every vLLM /metrics endpoint and metrics exporter")
    quarantine = sub.add_parser(
        "quarantine",
        help="drain a host's instances (or one GPU's) out of their routers, stop them and hold them out until admit; arguments after -- go to pyinfra",
    )
    admit = sub.add_parser(
        "admit",
        help="read a quarantined host's GPU evidence again, refuse while it is bad, else put its instances back behind their health gate",
    )
    for p in (quarantine, admit):
        p.add_argument("inventory")
        p.add_argument("host", help="the inventory's name of the host")
    quarantine.add_argument("--gpu", type=int, help="only the instances on this GPU index (default: all of the host's)")
    quarantine.add_argument("--reason", required=True, help="why, kept in the host's quarantine record and shown by status")
    for p in (deploy, rollback, warm):
        p.add_argument("inventory")
    for p in (deploy, rollback, warm, quarantine, admit):
        p.add_argument(
            "deploy_file",
            nargs="?",
            metavar="DEPLOY",
            help="the deploy file (default: deploy.py in --project-dir or in the inventory's project)",
        )
        p.add_argument("-y", "--yes", action="store_true", help="do not ask: change the hosts without showing the changes first")
        p.add_argument("--dry", action="store_true", help="show what would change on each host, change nothing")
        p.add_argument("--json", action="store_true", help="pyinfra's JSON results (operations, totals, failed hosts) and the roll summary")
    for p in (verify, status_p, bench_p, targets):
        p.add_argument("inventory")
    for p in (plan, deploy, verify, rollback, warm, status_p, bench_p, targets):
        p.add_argument(
            "--limit", action="append", metavar="PATTERN", help="a group name or a glob of host names, as pyinfra's --limit (repeatable)"
        )
    for p in (plan, deploy, verify, rollback, warm, status_p, bench_p, targets, quarantine, admit):
        p.add_argument(
            "--project-dir",
            help="the directory pyinfra runs in: config.py and group_data/ (default: the deploy file's directory, else the nearest "
            "directory at or above the inventory's that holds deploy.py or group_data/, else the current one if it holds either)",
        )
    rollback.add_argument(
        "--to", type=_generation, help="generation number (default: the newest one older than the healthy one that passed the gate)"
    )
    deploy.set_defaults(func=cmd_deploy)
    quarantine.set_defaults(func=cmd_quarantine)
    admit.set_defaults(func=cmd_admit)
    rollback.set_defaults(func=cmd_rollback)
    warm.set_defaults(func=cmd_warm)
    verify.set_defaults(func=cmd_verify)
    targets.add_argument("-o", "--output", help="write to this file (Prometheus re-reads it) instead of printing")
    targets.add_argument(
        "--alerts",
        metavar="FILE",
        help="also write the fleet's alerting and recording rules (GPU health, SLO burn rates, instances, watch, routers) to FILE, for Prometheus's rule_files (docs/dashboards.md)",
    )
    targets.add_argument(
        "--alertmanager", metavar="FILE", help="also write Alertmanager's config, delivering every alert to alert_webhook_url, to FILE"
    )
    targets.add_argument(
        "--grafana", metavar="DIR", help="also write the Grafana boards (fleet, instance) and their provisioning file to DIR"
    )
    targets.add_argument(
        "--grafana-path",
        metavar="PATH",
        help="where Grafana reads DIR (a container's mount, such as /var/lib/grafana/dashboards/instinct-fleet): the provisioning file names it",
    )
    targets.set_defaults(func=cmd_targets)
    status_p.add_argument("--json", action="store_true", help="machine-readable output")
    status_p.set_defaults(func=cmd_status)
    bench_p.add_argument(
        "--profile", default="seed-001-gpt-oss", help="a built-in profile or one of bench_profiles (default seed-001-gpt-oss)"
    )
    bench_p.add_argument("--instance", help="instance name (glob)")
    bench_p.add_argument("--client", help="run the benchmark from this inventory host instead of each instance's own host")
    bench_p.add_argument("--num-prompts", type=int, help="override the profile's prompt count (a shorter run)")
    bench_p.add_argument("--concurrency", help="override the profile's concurrencies: comma-separated, e.g. 1,8")
    bench_p.add_argument("--warmup", type=int, default=0, help="requests sent before each run, their results discarded (default 0: none)")
    bench_p.add_argument("--output", default="results", help="results root (default ./results)")
    bench_p.add_argument(
        "--accuracy",
        action="store_true",
        help="ask the canary's accuracy probe alone (canary_probe, canary_probe_size) instead of a benchmark",
    )
    bench_p.set_defaults(func=cmd_bench)

    tune_p = sub.add_parser(
        "tune",
        help="sweep one instance's flags and env over some hosts at once, behind the health gate; restore them; report the Pareto front",
    )
    tune_p.add_argument("inventory")
    tune_p.add_argument("--project-dir", help="the directory holding group_data/ (default: the inventory's project, as for plan)")
    tune_p.add_argument("--config", help="a TOML file with the sweep's settings (the options below override it)")
    tune_p.add_argument("--instance", help="the instance whose configuration varies")
    tune_p.add_argument("--vary", action="append", default=[], metavar="FLAG=V1,V2", help="values of one vllm serve flag (repeatable)")
    tune_p.add_argument("--vary-env", action="append", default=[], metavar="NAME=V1,V2", help="values of one env var (repeatable)")
    tune_p.add_argument("--profile", help="a built-in bench profile or one of bench_profiles (default latency)")
    tune_p.add_argument("--num-prompts", type=int, help="override the profile's prompt count")
    tune_p.add_argument("--concurrency", type=int, help="the one concurrency each trial runs (default: the profile's)")
    tune_p.add_argument("--slo", action="append", default=[], metavar="METRIC<=VALUE", help="a bound on a vLLM result field (repeatable)")
    tune_p.add_argument("--limit", help="hosts to tune on: a group name (typically a staging group) or a glob of host names")
    tune_p.add_argument("--max-out", type=int, help="at most this many hosts away from their deployed configuration at once (default 1)")
    tune_p.add_argument("--repeats", type=int, help="measured runs of each point, every one kept (default: the host's canary_runs)")
    tune_p.add_argument("--warmup", type=int, help="requests sent before each point's runs, discarded (default: the host's canary_warmup)")
    tune_p.add_argument("--output", help="results directory (default results/tune-<UTC timestamp>)")
    tune_p.add_argument("--resume", metavar="DIR", help="go on with the sweep in DIR, skipping what it measured")
    tune_p.add_argument("--dry", action="store_true", help="print the plan and stop: no host is contacted")
    tune_p.set_defaults(func=cmd_tune)

    init = sub.add_parser(
        "init", help="write a starting infra repo (deploy.py, config.py, inventories/, group_data/) into DIR; overwrites nothing"
    )
    init.add_argument("directory", metavar="DIR")
    init.set_defaults(func=cmd_init)

    facts = sub.add_parser(
        "vllm-facts",
        help="extract a vLLM version's env vars, flags and start-up checks from its wheel (pip downloads it; nothing is "
        "installed) into the project's vllm-facts/, where validation finds them",
    )
    facts.add_argument("version", metavar="VERSION")
    facts.add_argument("--wheel", help="read this vLLM wheel instead of downloading one (a build that is not on PyPI)")
    facts.add_argument(
        "--from-host", metavar="HOST", help="read the vLLM source inside the vllm_image of this host of --inventory (AMD's dev builds)"
    )
    facts.add_argument("--inventory", help="the inventory --from-host is a host of (its project stores the table)")
    facts.add_argument(
        "--show", action="store_true", help="print the table validation reads for VERSION (shipped or the project's); extract nothing"
    )
    facts.add_argument(
        "--project-dir", help="the project to store the table in (default: the inventory's, else the one around the current directory)"
    )
    facts.set_defaults(func=cmd_vllm_facts)

    report = sub.add_parser(
        "report", help="report.md, plots and a table from vllm bench serve results (RESULTS_DIR/<host>/<instance>/*.json)"
    )
    report.add_argument("results", metavar="RESULTS_DIR", nargs="?")
    report.add_argument(
        "--fleet", metavar="INVENTORY", help="instead, draw the fleet board's main panels (Dashboards and alerts) from --prometheus"
    )
    report.add_argument("--prometheus", metavar="URL", help="with --fleet: the Prometheus that scrapes the fleet (http://host:9090)")
    report.add_argument("--since", default="1h", help="with --fleet: the window drawn, a Prometheus duration (default 1h)")
    report.add_argument("-o", "--output", default="fleet.png", help="with --fleet: the PNG written (default fleet.png)")
    report.add_argument("--project-dir", help="with --fleet: the inventory's project (default: found from the inventory)")
    report.set_defaults(func=cmd_report)
    return parser


@contextlib.contextmanager
def _ansible_inventory(opts: argparse.Namespace) -> Iterator[None]:
    """An Ansible inventory (YAML, INI or ansible-inventory's JSON) where a pyinfra one is expected: it is read and
    checked first (refused with its file, line and key), then the command runs on the two-line pyinfra inventory
    that reads it (instinct_fleet/model/ansible.py), written for the command's lifetime, so that validation,
    pyinfra, verify and every host command read the same hosts. The project is the Ansible file's."""
    given = getattr(opts, "inventory", None)
    if not given or not ansible.is_ansible(given):
        yield
        return
    opts.project_dir = str(_project_dir(opts))
    try:
        hosts = ansible.read(given)
    except ansible.AnsibleInventoryError as exc:
        raise UsageError(str(exc)) from exc
    for path, group in ansible.unread_group_vars(given, hosts):
        print(
            f"instinct-fleet: note: {path} is for group {group!r}, which no host of {given} is in: its variables reach no host",
            file=sys.stderr,
        )
    for path in ansible.vaulted_files(given):
        print(
            f"instinct-fleet: note: {path} is vault-encrypted: its variables are Ansible's alone (instinct-fleet reads none; "
            "keep instinct-fleet's variables in plain files)",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory(prefix="instinct-fleet-ansible-") as scratch:
        shim = Path(scratch) / f"{Path(given).stem.replace('.', '_') or 'hosts'}.py"
        shim.write_text(origins.ansible_shim(Path(given).resolve()))
        opts.inventory = str(shim)
        yield


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # --arg values start with dashes (--arg --no-enable-prefix-caching); keep them as values.
    raw = list(sys.argv[1:] if argv is None else argv)
    # After --: arguments for pyinfra (deploy) or pytest (verify).
    passthrough = raw[raw.index("--") + 1 :] if "--" in raw else []
    raw = raw[: raw.index("--")] if "--" in raw else raw
    joined: list[str] = []
    for i, item in enumerate(raw):
        if i > 0 and raw[i - 1] == "--arg" and joined and joined[-1] == "--arg":
            joined[-1] = f"--arg={item}"
        else:
            joined.append(item)
    unknown = _unknown_options(parser, joined)
    if unknown is not None:
        parser.error(unknown)
    opts = parser.parse_args(joined)
    opts.passthrough = passthrough
    if passthrough and opts.command not in ("deploy", "verify", "rollback", "warm", "quarantine", "admit"):
        parser.error(f"{opts.command} takes no arguments after --")
    try:
        with interrupts.raised_in_main(), _ansible_inventory(opts):
            code = int(opts.func(opts))
        sys.stdout.flush()  # here, not at exit: a reader that went away is then a BrokenPipeError below
        return code
    except interrupts.Interrupted as exc:
        print(interrupts.stopped(exc.name), file=sys.stderr)
        return EXIT_INTERRUPTED
    except UsageError as exc:
        print(f"instinct-fleet: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as a command killed by SIGPIPE does. Python flushes
        # stdout again at exit, so it is pointed at /dev/null first, or that flush would fail in turn.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except Exception as exc:  # last line of defence: never show a traceback to a user
        if os.environ.get("INSTINCT_FLEET_DEBUG"):
            raise
        print(f"instinct-fleet: unexpected error: {exc} (set INSTINCT_FLEET_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
