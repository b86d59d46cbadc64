"""The accuracy probe: the shipped set, a team's own file, the paired verdict, and the client against the stand-in."""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from itertools import product
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from instinct_fleet.live import accuracy, bench, canary
from instinct_fleet.live.accuracy import Answer
from instinct_fleet.model import probe

from . import consumers
from .conftest import check, rules_of


def test_the_shipped_set_is_fixed_and_every_answer_is_the_expressions_value() -> None:
    items = probe.builtin()
    assert len(items) == probe.BUILTIN_SIZE >= 200 and items == probe.builtin()
    assert len({i.prompt for i in items}) == len(items)
    for item in items:
        expression = re.fullmatch(r"Compute ([0-9+\-*() ]+)\. " + re.escape(probe.INSTRUCTION), item.prompt)
        assert expression is not None and item.answer == str(eval(expression.group(1)))  # digits and + - * ( ) only
    # The first item never changes between releases: a stored baseline stays comparable.
    assert items[0].prompt.startswith("Compute ") and items[0] == probe.builtin()[0]


@pytest.mark.parametrize(
    ("text", "answer", "right"),
    [
        ("The result is 42.", "42", True),
        ("40 + 2 = 42.0", "42", True),
        ("it is 1,024", "1024", True),
        ("first 42, then finally 41", "42", False),  # the last number counts
        ("-7", "-7", True),
        ("no number at all", "0", False),
        ("77 77 777 7", "391", False),  # degenerate digits
    ],
)
def test_the_extraction_rule_reads_the_last_number(text: str, answer: str, right: bool) -> None:
    assert probe.Item("q", answer=answer).right(text) is right


def test_a_pattern_item_is_right_when_its_regex_is_found() -> None:
    item = probe.Item("capital of France?", pattern=r"\bParis\b")
    assert item.right("It is Paris.") and not item.right("It is Parisian cuisine.")


@pytest.mark.parametrize(
    ("lines", "wanted"),
    [
        ([], "has no items"),
        (["", "  "], "has no items"),
        (["{not json"], "line 1 is not JSON"),
        (['["a list"]'], "line 1: not a JSON object"),
        (['{"answer": "4"}'], 'line 1: no "prompt"'),
        (['{"prompt": "2+2?"}'], "exactly one of"),
        (['{"prompt": "2+2?", "answer": "4", "pattern": "4"}'], "exactly one of"),
        (['{"prompt": "ok", "answer": "4"}', '{"prompt": "2+2?", "answer": "four"}'], "line 2: \"answer\" 'four' is not a number"),
        (['{"prompt": "2+2?", "pattern": "(4"}'], "is not a regular expression"),
        (['{"prompt": "2+2?", "answer": true}'], "is not a number"),
    ],
)
def test_a_probe_file_that_cannot_be_scored_is_refused_with_its_line(tmp_path: Path, lines: list[str], wanted: str) -> None:
    path = tmp_path / "golden.jsonl"
    path.write_text("\n".join(lines) + "\n")
    items, wrong = probe.read(path)
    assert items == () and wrong is not None and wanted in wrong and str(path) in wrong, wrong


def test_a_team_file_is_read_and_cut_to_the_size(tmp_path: Path) -> None:
    path = tmp_path / "golden.jsonl"
    rows = [{"prompt": f"{i} + 1?", "answer": i + 1} for i in range(5)] + [{"prompt": "Say hi", "pattern": "(?i)hi"}]
    path.write_text("\n".join(map(json.dumps, rows)) + "\n\n")
    items, wrong = probe.items(path, 100)
    assert wrong is None and len(items) == 6 and items[0] == probe.Item("0 + 1?", answer="1") and items[-1].pattern == "(?i)hi"
    assert probe.items(path, 2)[0] == items[:2]
    assert probe.items(None, 200)[0] == probe.builtin()[:200]


def test_the_probe_settings_are_checked_before_any_connection(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    _, found = check({"canary_probe": str(bad)})
    (probe_finding,) = [f for f in found if f.rule == "canary-probe"]
    assert probe_finding.key == "canary_probe" and "line 1" in probe_finding.message and str(bad) in probe_finding.message
    _, found = check({"canary_probe": str(tmp_path / "missing.jsonl")})
    assert "canary-probe" in rules_of(found) and any("cannot read" in f.message for f in found)
    for key, value in [
        ("canary_probe_alpha", 0),
        ("canary_probe_alpha", 1),
        ("canary_probe_alpha", 1.5),
        ("canary_probe_floor", -1),
        ("canary_probe_size", 0),
    ]:
        _, found = check({key: value})
        assert any(f.rule == "value-format" and f.key == key for f in found), (key, value, found)
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "x", "answer": 1}\n')
    _, found = check({"canary_probe": str(good), "canary_probe_alpha": 0.05, "canary_probe_floor": 0})
    assert not [f for f in found if f.severity == "error"], found


def test_every_canary_setting_is_one_value_for_the_fleet() -> None:
    from instinct_fleet.model.defaults import FleetVars
    from instinct_fleet.model.validate import ROLLING_FLEET_KEYS

    assert {k for k in FleetVars.model_fields if k.startswith("canary_")} <= set(ROLLING_FLEET_KEYS)


def _exact(lost: int, gained: int) -> float:
    """McNemar's one-sided p by enumerating every way the discordant items could have gone."""
    n = lost + gained
    outcomes = list(product((0, 1), repeat=n))
    return sum(1 for o in outcomes if sum(o) >= lost) / len(outcomes) if n else 1.0


@pytest.mark.parametrize(("lost", "gained"), [(0, 0), (1, 0), (3, 3), (6, 1), (9, 2), (0, 7), (12, 0)])
def test_mcnemar_is_the_exact_binomial_tail(lost: int, gained: int) -> None:
    assert accuracy.mcnemar_greater(lost, gained) == pytest.approx(_exact(lost, gained))


def test_mcnemar_on_a_corrupting_change_is_tiny_and_exact() -> None:
    assert accuracy.mcnemar_greater(141, 0) == 2.0**-141
    assert accuracy.mcnemar_greater(5, 5) == pytest.approx(0.623046875)


def _answers(right: list[bool], tokens: str = "t") -> list[Answer]:
    return [Answer("the result is 1" if r else "the result is 2", (tokens,)) for r in right]


ITEMS = [probe.Item(f"q{i}", answer="1") for i in range(200)]


def test_the_verdict_is_paired_and_needs_both_the_floor_and_the_test() -> None:
    before = [i % 10 != 0 for i in range(200)]  # 180 right
    # 30 items lost, 2 gained: 15 points, p tiny: a regression.
    after = [(b and i % 10 not in (1, 2) and i < 190) or i in (0, 10) for i, b in enumerate(before)]
    found = accuracy.compare("main", ITEMS, _answers(before), _answers(after, "u"), 2.0, 0.01)
    assert (found.lost, found.gained) == (found.right_before - found.right_after + found.gained, 2)
    assert found.outcome == "regressed" and found.p < 1e-6 and found.agreed == 0
    assert (
        "probe accuracy 90.0% -> " in found.evidence()
        and "items right before and wrong after, 2 the reverse, McNemar p=" in found.evidence()
    )
    # The same loss with as many gains: no accuracy lost, whatever moved.
    moved = [not b if i < 100 and i % 10 in (0, 5) else b for i, b in enumerate(before)]  # 10 each way
    swapped = accuracy.compare("main", ITEMS, _answers(before), _answers(moved), 2.0, 0.01)
    assert (swapped.lost, swapped.gained) == (10, 10)
    assert swapped.outcome == "passed" and swapped.agreed == 200
    tokenless = [Answer(a.text) for a in _answers(before)]  # a server that sent no logprobs agrees on nothing
    assert accuracy.compare("main", ITEMS, tokenless, tokenless, 2.0, 0.01).agreed == 0
    # 3 items lost of 200 (1.5 points) is within the floor, 6 lost (3 points, p=0.016) beyond it but not significant.
    assert (
        accuracy.compare(
            "m", ITEMS, _answers(before), _answers([b and i not in (1, 2, 3) for i, b in enumerate(before)]), 2.0, 0.01
        ).outcome
        == "passed"
    )
    six = accuracy.compare("m", ITEMS, _answers(before), _answers([b and i not in range(1, 7) for i, b in enumerate(before)]), 2.0, 0.01)
    assert six.outcome == "inconclusive" and six.p == pytest.approx(1 / 64)
    rule = canary.Rule(10, {}, 0.001, "proceed", 2.0, 0.01)
    assert rule.problem(six) is None
    assert rule.problem(found) == f"canary regressed: main: {found.evidence()}"
    strict = canary.Rule(10, {}, 0.001, "rollback", 2.0, 0.01)
    assert (strict.problem(six) or "").startswith("canary inconclusive (canary_inconclusive = rollback): m: probe accuracy")


def test_failed_requests_score_nothing() -> None:
    answers = [Answer("1"), Answer(error="HTTP 500: boom"), Answer(error="URLError: refused")]
    assert accuracy.failed(answers) == "2 of 3 probe requests failed (the first: HTTP 500: boom)"
    assert accuracy.failed(answers[:1]) is None


def test_the_answers_are_read_after_the_mark_only() -> None:
    out = f"Unable to find image\n{accuracy.MARK}\n" + json.dumps([{"text": "a", "tokens": ["a"]}, {"error": "x"}])
    assert accuracy.answers_of(out) == [Answer("a", ("a",)), Answer("", (), "x")]
    assert accuracy.answers_of("Traceback ...") is None
    assert accuracy.answers_of(f"{accuracy.MARK}\n{{not json") is None
    assert accuracy.answers_of(f"{accuracy.MARK}\n" + json.dumps({"a": 1})) is None


# The stand-in's answers, as the fleet's instances give them (tests/fleet/standin/vllm/vllm_standin.py).


def _scores(args: dict[str, Any], env: dict[str, str] | None = None) -> list[Answer]:
    module = consumers.standin()
    with (
        mock.patch.dict(os.environ, env or {}),
        mock.patch.object(module.State, "args", args),
        mock.patch.object(module.State, "model", "m"),
    ):
        config = module.fingerprint()
        texts = [module.completion_text(i.prompt, 512, config).strip() for i in probe.builtin()]
    return [Answer(text, tuple(text.split()[: accuracy.AGREEMENT_TOKENS])) for text in texts]


def test_the_stand_in_answers_the_probe_imperfectly_and_a_corruption_breaks_it() -> None:
    items = probe.builtin()
    baseline = _scores({"--max-num-seqs": 256})
    right = sum(accuracy.scored(items, baseline))
    assert 0.85 * len(items) <= right <= 0.93 * len(items), right
    assert _scores({"--max-num-seqs": 256}) == baseline  # deterministic per configuration
    harmless = accuracy.compare("m", items, baseline, _scores({"--max-num-seqs": 200}), 2.0, 0.01)
    assert harmless.outcome == "passed" and harmless.lost + harmless.gained > 0, harmless  # a few items flip, both ways
    broken = accuracy.compare("m", items, baseline, _scores({"--max-num-seqs": 256}, {"STANDIN_CORRUPT": "6"}), 2.0, 0.01)
    assert broken.outcome == "regressed" and broken.after < 10 and broken.agreed == 0, broken.evidence()


def test_false_alarms_of_harmless_changes_stay_below_alpha_and_corruptions_are_all_caught() -> None:
    """The verdict's false-alarm rate, simulated on the stand-in's answer model: 60 harmless changes (another
    configuration each, a few items flipping both ways) against one baseline, and 20 corruptions of them
    (benchmarks/correctness.py runs them through the fleet). Judged as a canary of two instances judges each with
    the shipped settings (alpha split over them), and at 0.01 a side, which benchmarks/correctness.py saw trip."""
    from instinct_fleet.model.defaults import FleetVars

    v = FleetVars()
    shipped = canary.Rule(v.canary_max_regression, {}, v.canary_alpha, v.canary_inconclusive, v.canary_probe_floor, v.canary_probe_alpha)
    items = probe.builtin()[:200]
    baseline = _scores({"--max-num-seqs": 256})[:200]
    draw = random.Random(7)
    alarms, loose, caught = 0, 0, 0
    for n in range(60):
        args = {"--max-num-seqs": draw.randint(8, 1024), "--block-size": draw.choice([16, 32, 64])}
        after = _scores(args)[:200]
        alarms += shipped.compare_answers("m", items, baseline, after, 2).outcome == "regressed"
        loose += accuracy.compare("m", items, baseline, after, 2.0, 0.01).outcome == "regressed"
        if n < 20:
            corrupt = _scores(args, {"STANDIN_CORRUPT": str(draw.randint(1, 12))})[:200]
            caught += shipped.compare_answers("m", items, baseline, corrupt, 2).outcome == "regressed"
    assert shipped.probe_alpha == 0.001 and alarms == 0 and caught == 20, (alarms, caught)
    assert loose <= 3, loose  # at 0.01 a side: within what the level allows, over 60 changes


@pytest.fixture
def standin_server() -> Iterator[str]:
    """The stand-in's HTTP server on a free loopback port, serving model ``m`` with an API key."""
    module = consumers.standin()
    with mock.patch.dict(os.environ, {"VLLM_API_KEY": "sk-test"}), mock.patch.object(module.State, "args", {}):
        module.State.model = module.State.served = "m"
        if not module.ENGINE:
            module.ENGINE.append(module.Engine({}))
        server = module.Server(("127.0.0.1", 0), module.Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()


def _client(url: str, prompts: list[str], key: str | None) -> str:
    import base64
    import zlib

    payload = base64.b64encode(zlib.compress(json.dumps(prompts).encode())).decode()
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"} | ({"OPENAI_API_KEY": key} if key else {})
    done = subprocess.run(
        [sys.executable, "-c", accuracy.CLIENT, url, "m", "64", "4"], input=payload, capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_client_asks_every_item_greedily_and_reads_content_and_tokens(standin_server: str) -> None:
    items = probe.builtin()[:12]
    answers = accuracy.answers_of(_client(standin_server, [i.prompt for i in items], "sk-test"))
    assert answers is not None and len(answers) == 12 and all(a.error is None for a in answers)
    assert sum(accuracy.scored(items, answers)) >= 9 and all(0 < len(a.tokens) <= accuracy.AGREEMENT_TOKENS for a in answers)
    refused = accuracy.answers_of(_client(standin_server, [items[0].prompt], "sk-wrong"))
    assert refused == [Answer(error='HTTP 401: {"error": "Unauthorized"}')]
    assert accuracy.failed(refused) == '1 of 1 probe requests failed (the first: HTTP 401: {"error": "Unauthorized"})'


def test_the_command_carries_the_prompts_in_a_heredoc_that_a_shell_reads_whole() -> None:
    spec, _ = check({"vllm_api_key_path": "/etc/instinct-fleet/api-key"})
    items = probe.builtin()
    script = bench.probe_command(spec, spec.serves[0], items, "T")
    fake = "docker() { cat > /dev/null; printf '%s\\n' \"$@\" | grep -c . ; }; "
    wrapped = f": probe; ( {script.replace('/usr/bin/docker', 'docker', 1)} ) 2>&1; true"
    done = subprocess.run(["sh", "-c", fake + wrapped], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == "" and int(done.stdout) > 10, (done.stdout, done.stderr)
    assert f"{accuracy.CONCURRENCY}" in script and "--label instinct-fleet.bench=T" in script and "/etc/instinct-fleet/api-key:" in script
    assert math.ceil(250 / accuracy.CONCURRENCY) * accuracy.REQUEST_SECONDS < accuracy.time_limit(250)


def test_report_reads_stored_probes_alone_or_beside_runs(tmp_path: Path) -> None:
    from instinct_fleet.live import report

    items = probe.builtin()[:4]
    answers = [Answer(f"the result is {i.answer}") for i in items[:3]] + [Answer("no idea")]
    accuracy.save(tmp_path / "h1" / "main", accuracy.record(items, answers, "built-in", 512))
    assert [(h, i, d["probe"]["right"]) for h, i, d in accuracy.load(tmp_path)] == [("h1", "main", 3)]
    path, terminal = report.write(tmp_path)
    assert "| h1 | main | 4 | 3 | 75.0% | 0 | built-in |" in path.read_text() and "75.0%" in terminal
    (tmp_path / "empty").mkdir()
    with pytest.raises(report.ReportError, match=r"no vLLM result files .* and no accuracy probes"):
        report.write(tmp_path / "empty")
    (tmp_path / "h2" / "main").mkdir(parents=True)
    (tmp_path / "h2" / "main" / accuracy.PROBE_FILE).write_text("{not json")
    with pytest.raises(report.ReportError, match=r"h2/main/probe\.json is not a probe file"):
        report.write(tmp_path)


class Probing:
    """remote.Hosts for ask_all: each host answers its probe (or fails), and a run can be interrupted."""

    def __init__(self, answers: dict[str, str], interrupt: bool = False) -> None:
        self.answers, self.interrupt, self.commands = answers, interrupt, []  # type: list[tuple[str, str]]

    def run(self, name: str, command: str, timeout: int) -> Any:
        import signal

        from instinct_fleet.live import remote

        self.commands.append((name, command))
        if self.interrupt and "python3" in command:
            os.kill(os.getpid(), signal.SIGINT)
            import gevent

            gevent.sleep(1)
        out = self.answers.get(name, "")
        return remote.Result(name, bool(out), out, "boom on stderr" if not out else "", None)

    def each(self, items: dict[str, Any], work: Any) -> dict[str, Any]:
        from instinct_fleet.live import remote

        return remote.Hosts.each(self, items, work)  # type: ignore[arg-type]


def test_bench_accuracy_stores_each_instance_and_names_a_host_whose_client_failed(tmp_path: Path) -> None:
    spec, _ = check({})
    other, _ = check({}, host="h2")
    items = probe.builtin()[:3]
    good = f"{accuracy.MARK}\n" + json.dumps([{"text": f"= {i.answer}", "tokens": ["="]} for i in items])
    said: list[str] = []
    asked = bench.probe_all(
        Probing({"h1": good}), [(spec, spec.serves[0]), (other, other.serves[0])], items, "built-in", tmp_path / "T", said.append
    )
    by = {a.label: a for a in asked}
    assert by["h1/main"].problem is None and by["h1/main"].path == tmp_path / "T" / "h1" / "main" / accuracy.PROBE_FILE
    assert by["h2/main"].path is None and by["h2/main"].problem == "the probe's client failed: boom on stderr"
    assert said == ["    h1/main: probe accuracy 100.0% (3 of 3 right)"]


def test_an_interrupted_probe_removes_its_containers(tmp_path: Path) -> None:
    from instinct_fleet.live.bench import stop_command
    from instinct_fleet.live.interrupts import Interrupted

    spec, _ = check({})
    runner = Probing({}, interrupt=True)
    said: list[str] = []
    with pytest.raises(Interrupted):
        bench.probe_all(runner, [(spec, spec.serves[0])], probe.builtin()[:2], "built-in", tmp_path / "T", said.append)
    assert runner.commands[-1] == ("h1", stop_command("T")) and said == ["SIGINT: stopping the probe containers on h1"]
    assert not (tmp_path / "T").exists()


def test_the_roll_judges_each_instance_s_answers_after_the_change_and_reports_them() -> None:
    from instinct_fleet.roll.roll import ServingUnit
    from tests.unit.test_roll import journal

    fleet = [ServingUnit("a", ("a",), "restart"), ServingUnit("b", ("b",), "restart")]
    r = journal(fleet, canary_rule=canary.Rule(10, {}, 0.001, "proceed", 2.0, 0.01), canary_host="a")
    right = _answers([True] * 180 + [False] * 20)
    assert r.probe("a", "before", "main", ITEMS, right) is None  # nothing to compare yet
    assert r.probe("a", "after", "main", ITEMS, right) is None and r.reasons["a"][-1].startswith(
        "canary passed: main: probe accuracy 90.0% -> 90.0%"
    )
    broken = _answers([False] * 200)
    r.probe("a", "before", "side", ITEMS, right)
    problem = r.probe("a", "after", "side", ITEMS, broken)
    assert problem is not None and problem.startswith("canary regressed: side: probe accuracy 90.0% -> 0.0% (-90.0 points): 180 items")
    assert "(alpha 0.01, floor 2 points)" in problem  # one instance judged: the whole alpha
    r.probe("a", "before", "third", ITEMS, right)
    halved = r.probe("a", "after", "third", ITEMS, broken, 2)
    assert halved is not None and "(alpha 0.005, floor 2 points)" in halved  # two judged: half each (Bonferroni)
    (row, *_) = r.summary({"a": ("main", "side")}, set())
    assert [v["outcome"] for v in row["accuracy"]] == ["passed", "regressed", "regressed"] and row["accuracy"][1]["lost"] == 180


class CanaryHost:
    """pyinfra's ``host`` for the canary operation's body: its facts answered from memory, its notes kept."""

    name = "h1"
    print_prefix = "[h1] "

    def __init__(self, cwd: Path, answers: list[Answer] | None) -> None:
        self.state = SimpleNamespace(is_executing=True, cwd=str(cwd))
        self.answers, self.noted = answers, []  # type: ignore[var-annotated]
        self.run = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm-bench-serve_gpt-oss-120b_seed001.json").read_text())

    def get_fact(self, fact: Any, **arguments: Any) -> Any:
        from instinct_fleet.roll.measure import BenchRun, ProbeRun

        if fact is BenchRun:
            return self.run, ""
        assert fact is ProbeRun and arguments["expected"] == len(ITEMS)
        return self.answers, "docker: Error response from daemon: no such image"

    def noop(self, message: str) -> None:
        self.noted.append(message)


@pytest.mark.parametrize(
    ("after", "held"),
    [
        (_answers([True] * 180 + [False] * 20), None),
        (_answers([False] * 200), "canary regressed: main: probe accuracy 90.0% -> 0.0% (-90.0 points): 180 items right before"),
        (
            [Answer(error="HTTP 500: engine dead")] * 200,
            "canary: main: 200 of 200 probe requests failed (the first: HTTP 500: engine dead) after the change",
        ),
        (None, "canary: main: the accuracy probe's client failed after the change: docker: Error response from daemon: no such image"),
        (_answers([True] * 10), "canary: main: the accuracy probe's client failed after the change"),  # 10 answers for 200 items
    ],
)
def test_the_canary_operation_asks_the_probe_after_its_runs_and_holds_what_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, after: list[Answer] | None, held: str | None
) -> None:
    from instinct_fleet.model import workload
    from instinct_fleet.roll import measure
    from instinct_fleet.roll.roll import ServingUnit
    from tests.unit.test_roll import journal

    spec, _ = check({})
    fleet = [ServingUnit("h1", ("h1",), "restart")]
    r = journal(fleet, canary_rule=canary.Rule(1000, {}, 0.001, "proceed", 2.0, 0.01), canary_host="h1")
    r.probe("h1", "before", "main", ITEMS, _answers([True] * 180 + [False] * 20))
    runs = [(job, 0) for job in workload.jobs(spec, spec.serves[0], "latency", None, None)]
    holds: list[tuple[str, str]] = []
    fake = CanaryHost(tmp_path, after)
    monkeypatch.setattr(measure, "host", fake)
    inner = measure.canary_measured._inner  # type: ignore[attr-defined]
    commands = list(
        inner(
            phase="after",
            runs=runs,
            measure=lambda *_: None,
            hold=lambda h, why: holds.append((h, why)),
            asks=[("main", "S")],
            items=ITEMS,
            probe=r.probe,
            source="built-in",
            max_tokens=64,
        )
    )
    assert commands == []  # it changes nothing: judged, held or noted
    if held is None:
        assert holds == [] and fake.noted[-1].startswith("canary measured after the change")
    else:
        assert len(holds) == 1 and holds[0][0] == "h1" and holds[0][1].startswith(held), holds
    stored = list(tmp_path.glob("results/*-canary-after/h1/main/probe.json"))
    assert len(stored) == (0 if after is None or len(after) != len(ITEMS) else 1)
    if stored:
        assert json.loads(stored[0].read_text())["probe"] == {
            "source": "built-in",
            "items": 200,
            "right": sum(accuracy.scored(ITEMS, after or [])),
            "max_tokens": 64,
        }


def test_the_canary_operation_tells_the_verdict_how_many_instances_it_judges(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from instinct_fleet.model import workload
    from instinct_fleet.roll import measure

    spec, _ = check({})
    runs = [(job, 0) for job in workload.jobs(spec, spec.serves[0], "latency", None, None)]
    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(measure, "host", CanaryHost(tmp_path, _answers([True] * 200)))
    inner = measure.canary_measured._inner  # type: ignore[attr-defined]
    list(
        inner(
            phase="after",
            runs=runs,
            measure=lambda *_: None,
            asks=[("main", "S"), ("batch", "S")],
            items=ITEMS,
            probe=lambda *a: seen.append((a[2], a[5])),
            source="built-in",
        )
    )
    assert seen == [("main", 2), ("batch", 2)]
