#!/usr/bin/env python3
"""Plant each mutation of the verdict code in turn and show that a test fails on it (``make mutate``).

The verdicts (the noise test, the canary, the report's comparisons, validation) are where a test that cannot fail
does the most harm: a verdict that says "passed" whatever it is given looks exactly like one that works. Each entry
below is one small, plausible bug: a change of one expression in one file, and the tests that must fail on it.
The script plants it, runs those tests (stopping at the first failure), puts the file back byte for byte, and
prints ``killed`` or ``SURVIVED``. It exits 1 when any mutation survives or its anchor is gone (the code moved on:
update the entry). tests/unit/test_mutate.py checks on every ``make test`` that every anchor is still there, once.

Usage: ``.venv/bin/python scripts/mutate.py [NAME ...]`` (all of them without names); about two minutes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the checkout
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids or files that must fail


MUTATIONS: tuple[Mutation, ...] = (
    # Nobody gets in (issue 60): the firewall, the router's front, the pools and the keys.
    Mutation(
        "firewall: the input chain's policy back to accept",
        "instinct_fleet/converge/firewall.py",
        "priority filter - 10; policy drop;",
        "priority filter - 10; policy accept;",
        ("tests/unit/test_firewall.py",),
    ),
    Mutation(
        "router front: a worker-API route on the clients' port",
        "instinct_fleet/templates/router-front.py",
        '    ("POST", "/v1/rerank"),\n',
        '    ("POST", "/v1/rerank"),\n    ("POST", "/add_worker"),\n',
        ("tests/unit/test_router_front.py",),
    ),
    Mutation(
        "router front: the body read to the end of the connection, not its Content-Length",
        "instinct_fleet/templates/router-front.py",
        "await pipe(reader, upstream, length)",
        "await pipe(reader, upstream, None)",
        ("tests/unit/test_router_front.py",),
    ),
    Mutation(
        "pools: a host that failed preflight back in its router's pool",
        "instinct_fleet/roll/plan.py",
        "if standing[name].errors or not host.reached:",
        "if False:",
        ("tests/unit/test_router.py::test_a_pool_lists_only_instances_that_serve_in_this_run",),
    ),
    Mutation(
        "pools: a keyless instance allowed beside keyed ones",
        "instinct_fleet/model/ruletable.py",
        '        "router-api-key",\n        "error",',
        '        "router-api-key",\n        "warning",',
        ("tests/unit/test_router.py::test_a_pool_whose_instances_disagree_on_an_api_key_is_refused_and_one_that_agrees_is_not",),
    ),
    Mutation(
        "pools: the sync adds a worker whose unit was not running",
        "instinct_fleet/templates/router-sync.py",
        "url not in live and url not in joining and answers(url)",
        "url not in live and answers(url)",
        ("tests/unit/test_watch.py::test_the_pool_sync_never_adds_a_joining_worker_and_takes_it_out_of_the_router",),
    ),
    Mutation(
        "pools: a worker whose unit is not running is not held back from the sync",
        "instinct_fleet/roll/plan.py",
        "if (unit := paths.vllm_unit(svc.name)) not in host.report.active_units and not held(name, unit)",
        "if False",
        ("tests/unit/test_router.py::test_a_worker_whose_unit_is_not_running_joins_only_after_its_own_gate",),
    ),
    Mutation(
        "keys: a route under a guarded prefix counted as keyless",
        "instinct_fleet/model/knowledge.py",
        "if not path.startswith(self.guarded_prefixes)",
        "if not path.startswith(self.guarded_prefixes[1:])",
        ("tests/unit/test_keyless_routes.py",),
    ),
    Mutation(
        "shell: a served model name reaches the health check unquoted",
        "instinct_fleet/converge/health.py",
        "served={shlex.quote(json.dumps(served))} awk",
        "served={json.dumps(served)} awk",
        ("tests/unit/test_commands_one_word.py",),
    ),
    Mutation(
        "noise: no split of alpha over the figures",
        "instinct_fleet/live/noise.py",
        "return self.alpha / self.tests",
        "return self.alpha",
        ("tests/unit/test_noise.py",),
    ),
    Mutation(
        "noise: the pooled requests as the unit",
        "instinct_fleet/live/noise.py",
        "return self.p_runs is not None and self.p_runs < self.level and (self.p is None or self.p < self.level)",
        "return (self.p if self.p is not None else (self.p_runs if self.p_runs is not None else 1.0)) < self.level",
        ("tests/unit/test_noise.py",),
    ),
    Mutation(
        "noise: the runs' figures, not their logarithms",
        "instinct_fleet/live/noise.py",
        "if min(*x, *y) > 0:",
        "if False:",
        ("tests/unit/test_noise.py",),
    ),
    Mutation(
        "noise: the t-test's degrees of freedom",
        "instinct_fleet/live/noise.py",
        "df = n1 + n2 - 2",
        "df = n1 + n2",
        ("tests/unit/test_noise.py",),
    ),
    Mutation(
        "noise: Mann-Whitney without its tie correction",
        "instinct_fleet/live/noise.py",
        "ties += t**3 - t",
        "ties += 0",
        ("tests/unit/test_noise.py",),
    ),
    Mutation(
        "noise: the direction of a latency",
        "instinct_fleet/live/noise.py",
        'larger_after = (direction == "worse") != metric.higher_is_better',
        'larger_after = (direction == "worse") == metric.higher_is_better',
        ("tests/unit/test_noise.py",),
    ),
    Mutation(
        "tune: the best of K points judged as one",
        "instinct_fleet/commands/trials.py",
        'alpha, "better", max(1, points), "points")',
        'alpha, "better", 1, "points")',
        ("tests/unit/test_tune.py",),
    ),
    Mutation(
        "canary: the probe's alpha not split over the instances",
        "instinct_fleet/live/canary.py",
        "self.probe_alpha / max(1, instances)",
        "self.probe_alpha",
        ("tests/unit/test_accuracy.py",),
    ),
    Mutation(
        "canary: an inconclusive verdict rolls back under proceed",
        "instinct_fleet/live/canary.py",
        '(outcome == "inconclusive" and self.inconclusive == "proceed")',
        '(outcome == "inconclusive" and self.inconclusive == "rollback")',
        ("tests/unit/test_canary.py",),
    ),
    Mutation(
        "report: a reference compared across prompt counts",
        "instinct_fleet/live/report.py",
        '("prompt count", self.config.get("num_prompts"), reference.num_prompts),',
        "",
        ("tests/unit/test_report.py",),
    ),
    Mutation(
        "report: the ratio inverted",
        "instinct_fleet/live/report.py",
        'f"{measured / published:.2f}"',
        'f"{published / measured:.2f}"',
        ("tests/unit/test_report.py",),
    ),
    Mutation(
        "report: an outlier confirmed by one run",
        "instinct_fleet/live/report.py",
        "confirmed = len(members) > 1 and best",
        "confirmed = best",
        ("tests/unit/test_report.py",),
    ),
    Mutation(
        "validation: too few canary runs let through",
        "instinct_fleet/model/validate.py",
        "runs < 3 and spec.vars.canary_inconclusive",
        "runs < 1 and spec.vars.canary_inconclusive",
        ("tests/unit/test_rules.py",),
    ),
    # A canary that sees what hurts (issue 64): its alpha over everything judged, the figures, the watch's gate.
    Mutation(
        "canary: alpha not split over the instances judged",
        "instinct_fleet/live/canary.py",
        "self.alpha / max(1, comparisons)",
        "self.alpha",
        ("tests/unit/test_canary.py::test_the_canary_splits_alpha_over_every_comparison_it_judges",),
    ),
    Mutation(
        "canary: a multi-concurrency profile pooled",
        "instinct_fleet/roll/measure.py",
        "    return job.svc.name if len(levels) == 1 else",
        "    return job.svc.name if True else",
        ("tests/unit/test_canary.py::test_a_multi_concurrency_profile_is_judged_job_by_job",),
    ),
    Mutation(
        "noise: the mean of the runs in place of their median",
        "instinct_fleet/live/noise.py",
        "    mb, ma = median(b), median(a)\n",
        "    mb, ma = sum(b) / len(b), sum(a) / len(a)\n",
        ("tests/unit/test_noise.py",),
    ),
    Mutation(
        "watch: the gate passes without a step counter advance",
        "instinct_fleet/templates/watch.py",
        'return "passed" if after.steps > before.steps else "stalled"',
        'return "passed" if after.steps >= before.steps else "stalled"',
        ("tests/unit/test_watch.py",),
    ),
    Mutation(
        "accuracy: the probe's alpha not split over the canary's instances",
        "instinct_fleet/live/canary.py",
        "self.probe_alpha / max(1, instances)",
        "self.probe_alpha",
        ("tests/unit/test_accuracy.py", "tests/unit/test_canary.py"),
    ),
    Mutation(
        "accuracy: a loss within the floor counted",
        "instinct_fleet/live/accuracy.py",
        "if self.before - self.after <= self.floor:",
        "if self.before - self.after < 0:",
        ("tests/unit/test_accuracy.py",),
    ),
    Mutation(
        "liveness: a stall must outlast its window",
        "instinct_fleet/model/liveness.py",
        "    return seconds >= window\n",
        "    return seconds > window + 1\n",
        ("tests/unit/test_watch.py::test_busy_without_a_step_is_a_stall_and_idle_or_stepping_is_not",),
    ),
    # A user's first hour (issue 61).
    Mutation(
        "canary: off by default again",
        "instinct_fleet/model/defaults.py",
        'default="canary",\n        description="A bench profile',
        'default=None,\n        description="A bench profile',
        ("tests/unit/test_stages.py::test_the_default_canary_measures_a_retune_and_a_first_deploy_says_it_has_nothing_to_compare",),
    ),
    Mutation(
        "canary: the built-in profile not sized to the instance",
        "instinct_fleet/model/workload.py",
        "    if name == CANARY and CANARY not in spec.vars.bench_profiles:\n",
        "    if False:\n",
        ("tests/unit/test_canary.py::test_the_built_in_canary_fits_every_instance",),
    ),
    Mutation(
        "image: the tag no longer decides an unset vllm_version",
        "instinct_fleet/model/spec.py",
        '            values["vllm_version"] = named  # the image\'s tag decides the version it runs\n',
        "            pass\n",
        ("tests/unit/test_rules.py::test_the_image_decides_the_version_and_a_version_without_a_table_is_refused_unless_asked",),
    ),
    Mutation(
        "inventory: a replaced mapping's dropped keys not said",
        "instinct_fleet/model/inventory.py",
        "*shadow_findings(host, spec), ",
        "",
        ("tests/unit/test_cli.py::test_a_mapping_replaced_at_a_narrower_level_is_said_with_both_files",),
    ),
    Mutation(
        "plan: its argv made apart from the unit's, without the drain flag",
        "instinct_fleet/cli.py",
        '"argv": ["vllm", *render.serve_command(svc, spec.vars.rolling_drain_timeout)]',
        '"argv": ["vllm", "serve", svc.model, *render.render_args(svc)]',
        ("tests/unit/test_plan_is_the_unit.py",),
    ),
    Mutation(
        "edges: a local file's path the system refuses raises",
        "instinct_fleet/model/validate.py",
        '        return None if path.is_file() else "does not exist on this machine"\n    except OSError as exc:',
        '        return None if path.is_file() else "does not exist on this machine"\n    except ValueError as exc:',
        ("tests/unit/test_edges.py",),
    ),
    Mutation(
        "ansible: a team's own Jinja refused again",
        "instinct_fleet/model/ansible.py",
        "    if key not in CONNECTION and not _ours(key):\n        return\n",
        "",
        ("tests/unit/test_ansible.py::test_an_ordinary_team_inventory_is_read_as_ansible_reads_it",),
    ),
    Mutation(
        "plan: --explain --json without the reasons",
        "instinct_fleet/cli.py",
        '**({"reasons": dict(svc.reasons)} if explain else {}),',
        "**({}),",
        ("tests/unit/test_cli.py::test_a_mapping_replaced_at_a_narrower_level_is_said_with_both_files",),
    ),
    Mutation(
        "cli: an unknown option not caught before argparse",
        "instinct_fleet/cli.py",
        "    unknown = _unknown_options(parser, joined)\n",
        "    unknown = None\n",
        ("tests/unit/test_cli.py::test_the_command_line_suggests_and_refuses_before_any_side_effect",),
    ),
    Mutation(
        "explain: what is off listed as managed",
        "instinct_fleet/converge/evaluate.py",
        "        if (isinstance(e, FileEntry) and isinstance(e.make, Off)) or (isinstance(e, UnitEntry) and e.off is not None):\n            continue\n",
        "",
        ("tests/unit/test_cli.py::test_plan_explain_lists_each_managed_thing_with_its_stage_and_what_a_change_runs",),
    ),
    Mutation(
        "ansible: a group_vars file no host reads left unsaid",
        "instinct_fleet/model/ansible.py",
        "        if group not in populated and (entry.is_dir() or entry.suffix in SUFFIXES):",
        "        if False:",
        ("tests/unit/test_ansible.py::test_group_vars_no_host_reads_are_named",),
    ),
    Mutation(
        "ansible: INI's strings for booleans kept as strings",
        "instinct_fleet/model/ansible.py",
        "            data[name] = _boolean(value) if name in BOOLEANS else value",
        "            data[name] = value",
        ("tests/unit/test_ansible.py::test_an_ordinary_team_inventory_is_read_as_ansible_reads_it",),
    ),
    Mutation(
        "targets: a later argument's mistake found after writing",
        "instinct_fleet/cli.py",
        '        writes.append((_output(opts.alerts, "--alerts", "Prometheus\'s rule_files"), rules))',
        '        (out := _output(opts.alerts, "--alerts", "Prometheus\'s rule_files")).parent.mkdir(parents=True, exist_ok=True)\n'
        "        out.write_text(json.dumps(rules))",
        ("tests/unit/test_boards.py::test_targets_writes_the_boards_and_a_provisioning_file_that_points_at_them",),
    ),
)


def plant(mutation: Mutation) -> str:
    """Run the mutation's tests with it planted; the file is restored whatever happens. ``killed``, ``SURVIVED`` or
    ``anchor gone``."""
    path = ROOT / mutation.path
    original = path.read_bytes()
    text = original.decode()
    if text.count(mutation.old) != 1:
        return "anchor gone"
    try:
        path.write_text(text.replace(mutation.old, mutation.new))
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutation.tests],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        path.write_bytes(original)
    return "SURVIVED" if done.returncode == 0 else "killed"


def main(names: list[str]) -> int:
    chosen = [m for m in MUTATIONS if not names or m.name in names]
    unknown = set(names) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"no such mutation: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    bad = 0
    for mutation in chosen:
        started = time.monotonic()
        outcome = plant(mutation)
        bad += outcome != "killed"
        print(f"{outcome:11} {mutation.name} ({mutation.path}, {time.monotonic() - started:.0f} s)", flush=True)
    print(f"{len(chosen) - bad} of {len(chosen)} mutations killed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
