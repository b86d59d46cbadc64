"""Progress of the long waits: a health gate (up to ``health_timeout``), a tune trial (a restart, its gate and its runs).

Why: a deploy could sit silent for the whole health wait (30 minutes by default) and ``tune`` for a
trial that takes as long as its benchmark limit; a user cannot tell a slow compile from a hang. Each
wait registers here with what it is, when it began and the most it can take; the board shows every
open wait with its elapsed time and what is left. On a terminal the board is a live table drawn by
``rich``; otherwise (a CI log, a pipe) it prints one line per open wait every 30 seconds
(INSTINCT_FLEET_PROGRESS_INTERVAL), and nothing while no wait is open. It runs in a greenlet of its own: pyinfra and ``remote.Hosts`` run
hosts as greenlets, so waits of many hosts share one board.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from paramiko import SSHException

INTERVAL = 30.0  # seconds between lines when the output is not a terminal
INTERVAL_ENV = "INSTINCT_FLEET_PROGRESS_INTERVAL"  # another interval, in seconds (a CI log that wants fewer lines)


def interval(default: float = INTERVAL) -> float:
    """The seconds between lines: INSTINCT_FLEET_PROGRESS_INTERVAL when it is a positive number, else ``default``."""
    try:
        chosen = float(os.environ.get(INTERVAL_ENV, ""))
    except ValueError:
        return default
    return chosen if chosen > 0 else default


def duration(seconds: float) -> str:
    """``45s``, ``2m05s``, ``1h02m``: short, and exact enough to tell progress from a hang."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# What a connection that dies under a command raises: a reset or closed socket (OSError), paramiko's
# transport errors (SSHException; paramiko is pyinfra's SSH connector), a channel closed mid-read (EOFError).
LOST = (OSError, EOFError, SSHException)


def stdout_of(host: Any, command: str, timeout: int, **arguments: Any) -> str | None:
    """A command's output on a pyinfra host, or None when it fails, hangs past ``timeout`` or the connection dies: a
    probe asks beside a running operation (its own SSH channel) and must never end the run."""
    from pyinfra.api.command import StringCommand

    try:
        ok, output = host.run_shell_command(StringCommand(command), _timeout=timeout, **arguments)
    except (TimeoutError, *LOST):
        return None
    return "\n".join(output.stdout_lines) if ok else None


Probe = Callable[[], "str | None"]  # what the wait is at now (a start-up phase), read from the host; None: unknown
PROBE_SECONDS = 15.0  # the most the board waits for the probes of one refresh


@dataclass
class Wait:
    """One open wait: on what (a host and its unit or trial), doing what step, since when, for at most how long, and
    how to ask the host where it is (``probe``: a start's phase, read from the unit's journal)."""

    who: str
    step: str
    began: float
    limit: float | None  # the most the step can take (its timeout), None when nothing bounds it
    probe: Probe | None = None
    phase: str | None = None  # the probe's last answer

    def line(self, now: float) -> str:
        spent = now - self.began
        left = "" if self.limit is None else f", at most {duration(max(0.0, self.limit - spent))} left"
        at = f" ({self.phase})" if self.phase else ""
        return f"{self.who}: {self.step}{at}, {duration(spent)} so far{left}"


class Board:
    """Every open wait of one command. ``live``: draw a table on a terminal (default: when ``out`` is one)."""

    def __init__(
        self, out: TextIO | None = None, every: float | None = None, live: bool | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.out = out or sys.stderr  # progress is no result: stdout stays for what a command answers (--json)
        self.interval = interval() if every is None else every
        self.live = self.out.isatty() if live is None else live
        self.clock = clock
        self.waits: dict[str, Wait] = {}
        self._runner: Any = None

    @contextmanager
    def waiting(self, who: str, step: str, limit: float | None, probe: Probe | None = None) -> Iterator[None]:
        """Show ``who`` at ``step`` while the block runs (with ``probe``'s answer); a later step of ``who`` replaces it."""
        self.waits[who] = Wait(who, step, self.clock(), limit, probe)
        self._ensure_running()
        try:
            yield
        finally:
            if self.waits.get(who) is not None and self.waits[who].step == step:
                del self.waits[who]

    def lines(self) -> list[str]:
        now = self.clock()
        return [w.line(now) for w in sorted(self.waits.values(), key=lambda w: w.who)]

    def refresh(self) -> None:
        """Ask every wait's host where it is, all at once; a probe that has not answered in PROBE_SECONDS keeps its last."""
        import gevent

        asked = [(wait, gevent.spawn(wait.probe)) for wait in list(self.waits.values()) if wait.probe is not None]
        gevent.joinall([job for _, job in asked], timeout=PROBE_SECONDS)
        for wait, job in asked:
            if job.ready():
                wait.phase = job.value or wait.phase
            else:
                job.kill(block=False)

    def _ensure_running(self) -> None:
        import gevent

        if self._runner is None or self._runner.dead:
            self._runner = gevent.spawn(self._draw if self.live else self._print)

    def _print(self) -> None:
        """A line per open wait every ``interval`` seconds; the greenlet ends when no wait is open."""
        import gevent

        while True:
            gevent.sleep(self.interval)
            if not self.waits:
                return
            self.refresh()
            lines = self.lines()
            if not lines:
                return
            for line in lines:
                print(f"waiting: {line}", file=self.out, flush=True)

    def _draw(self) -> None:
        """A live table on the terminal, redrawn every second while a wait is open; other output scrolls above it."""
        import gevent
        from rich.console import Console
        from rich.live import Live
        from rich.table import Table

        def table() -> Table:
            grid = Table(title="waiting", show_header=False, box=None)
            for line in self.lines():
                grid.add_row(line)
            return grid

        with Live(table(), console=Console(file=self.out), refresh_per_second=1, transient=True) as live:
            ticks, asking = 0, None
            while self.waits:
                gevent.sleep(1)
                ticks += 1
                if ticks % 5 == 0 and (asking is None or asking.ready()):  # the hosts every 5 s, beside the clock's redraw
                    asking = gevent.spawn(self.refresh)
                live.update(table())

    def stop(self) -> None:
        """Close every wait and end the board's greenlet (an interrupt, the end of the command)."""
        self.waits.clear()
        if self._runner is not None:
            self._runner.kill()
            self._runner = None


_RUN_BOARD = "instinct_fleet_board"


def of_run(state: Any) -> Board:
    """The board of a pyinfra run (one for all its hosts, kept on its State): lines on stderr, not a live table, since
    pyinfra prints its own output on the same terminal; every 30 seconds, 10 on a terminal, or INSTINCT_FLEET_PROGRESS_INTERVAL."""
    board = getattr(state, _RUN_BOARD, None)
    if board is None:
        board = Board(live=False, every=interval(10.0 if sys.stderr.isatty() else INTERVAL))
        setattr(state, _RUN_BOARD, board)
    return board
