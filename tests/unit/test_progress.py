"""Long waits show progress: a line per open wait every interval off a terminal, a live table on one, and silence otherwise."""

from __future__ import annotations

import io
import re
from typing import Any, ClassVar

import gevent
import pytest

from instinct_fleet.converge import progress
from instinct_fleet.converge.progress import Board, duration


@pytest.mark.parametrize(("seconds", "shown"), [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (125, "2m05s"), (3720, "1h02m"), (-3, "0s")])
def test_durations_read_at_a_glance(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_off_a_terminal_each_open_wait_is_a_line_every_interval_and_nothing_after() -> None:
    out = io.StringIO()
    now = [100.0]
    board = Board(out, every=0.05, live=False, clock=lambda: now[0])
    with board.waiting("sim-gpu-1 vllm-main", "health gate on :8080", 1800):
        now[0] = 230.0
        gevent.sleep(0.12)  # two intervals
    lines = out.getvalue().splitlines()
    assert lines and set(lines) == {"waiting: sim-gpu-1 vllm-main: health gate on :8080, 2m10s so far, at most 27m50s left"}
    assert 1 <= len(lines) <= 3
    gevent.sleep(0.12)  # closed: no more lines, and the board's greenlet has ended
    assert len(out.getvalue().splitlines()) == len(lines) and board._runner is not None and board._runner.dead


def test_a_later_step_replaces_the_earlier_and_every_host_is_listed() -> None:
    now = [0.0]
    board = Board(io.StringIO(), every=60, live=False, clock=lambda: now[0])
    with board.waiting("h2", "restart", 300), board.waiting("h1", "point a: restart", None):
        now[0] = 5.0
        with board.waiting("h1", "point a: health gate on :8080", 600):
            assert board.lines() == [
                "h1: point a: health gate on :8080, 0s so far, at most 10m00s left",
                "h2: restart, 5s so far, at most 4m55s left",
            ]
        assert board.lines() == ["h2: restart, 5s so far, at most 4m55s left"]  # the gate closed the host's wait
    assert board.lines() == []
    board.stop()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_board_is_a_live_table() -> None:
    out = Terminal()
    board = Board(out)
    assert board.live
    with board.waiting("s1", "--max-num-seqs=64: benchmark run 1 of 3", 900):
        gevent.sleep(1.3)
    board.stop()
    text = out.getvalue()
    assert re.search(r"s1: --max-num-seqs=64: benchmark run 1 of 3, \ds so far, at most 14m5\ds left", text) and "\x1b[" in text


def test_a_pyinfra_run_keeps_one_board_for_all_its_hosts() -> None:
    class State:
        pass

    state: Any = State()
    assert progress.of_run(state) is progress.of_run(state) and not progress.of_run(state).live


def test_the_interval_can_be_chosen_and_a_wrong_one_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    for given, chosen in (("5", 5.0), ("0.5", 0.5), ("0", 30.0), ("-2", 30.0), ("soon", 30.0)):
        monkeypatch.setenv(progress.INTERVAL_ENV, given)
        assert Board(io.StringIO()).interval == chosen
    monkeypatch.delenv(progress.INTERVAL_ENV)
    assert Board(io.StringIO()).interval == 30.0


def test_each_line_says_where_the_host_is_as_its_probe_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The board asks every wait's probe at once; an answer shows on the next line, a probe that hangs past PROBE_SECONDS
    (or answers nothing) leaves the last answer, and the board goes on."""
    monkeypatch.setattr(progress, "PROBE_SECONDS", 0.2)
    answers = iter(["loading the model", None])
    board = Board(io.StringIO(), every=60, live=False, clock=lambda: 0.0)

    def hangs() -> str:
        gevent.sleep(5)
        return "never shown"

    with (
        board.waiting("h1 vllm-main", "health gate on :8080", 600, lambda: next(answers)),
        board.waiting("h2 vllm-main", "health gate", 60, hangs),
    ):
        board.refresh()
        assert board.lines() == [
            "h1 vllm-main: health gate on :8080 (loading the model), 0s so far, at most 10m00s left",
            "h2 vllm-main: health gate, 0s so far, at most 1m00s left",
        ]
        board.refresh()  # the probe answers nothing now: the last phase stays
        assert board.lines()[0].startswith("h1 vllm-main: health gate on :8080 (loading the model)")
    board.stop()


def test_a_probe_that_loses_its_host_answers_nothing() -> None:
    """stdout_of: a command that fails, hangs or loses its connection is None, never an exception in the board."""

    class Host:
        def __init__(self, outcome: Any) -> None:
            self.outcome = outcome

        def run_shell_command(self, *_args: Any, **_kw: Any) -> Any:
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

    class Output:
        stdout_lines: ClassVar[list[str]] = ["@@instinct-fleet-health startup", "elapsed 3.0"]

    assert progress.stdout_of(Host((True, Output())), "true", 5) == "@@instinct-fleet-health startup\nelapsed 3.0"
    assert progress.stdout_of(Host((False, Output())), "true", 5) is None
    for lost in (TimeoutError(), OSError("reset"), EOFError(), progress.SSHException("closed")):
        assert progress.stdout_of(Host(lost), "true", 5) is None
