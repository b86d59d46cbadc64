"""Ctrl-C and SIGTERM in the commands whose hosts run in greenlets: status, bench, tune, verify's first reach.

Python runs a signal handler in whatever greenlet runs when the signal arrives: gevent's hub, a host's
greenlet in the middle of a step, or the greenlet of paramiko's transport for one host (gevent's monkey
patch turns its thread into one). The default handler raises KeyboardInterrupt right there:

- in the hub, gevent prints it with a traceback before it passes it on;
- a host's greenlet dies between two steps that belong together;
- a transport greenlet dies and takes its connection with it: the host then reads as unreachable and
  the command goes on, so Ctrl-C seems to do nothing.

Here the handler raises nothing where it lands. :class:`Interrupted` is raised in the main greenlet
only: at once when the signal finds it running, else where it waits (for its hosts' greenlets).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)  # SIGTERM: a CI runner cancelling the job
EXIT = 130  # what a command stopped by a signal exits with, as a shell reports one ended by SIGINT


def stopped(name: str) -> str:
    """The one line a command stopped by signal ``name`` prints."""
    return f"instinct-fleet: {name}: stopped"


class Interrupted(BaseException):
    """A signal asked the command to stop. A BaseException, as KeyboardInterrupt is: no ``except Exception`` keeps it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name  # SIGINT or SIGTERM


@contextmanager
def handled(handler: Any) -> Iterator[None]:
    """While inside: ``handler`` (a function, or ``signal.SIG_IGN``) for SIGINT and SIGTERM; the previous ones after."""
    previous = {number: signal.signal(number, handler) for number in SIGNALS}
    try:
        yield
    finally:
        for number, before in previous.items():
            signal.signal(number, before)


@contextmanager
def raised_in_main() -> Iterator[None]:
    """While inside: SIGINT and SIGTERM raise :class:`Interrupted` in the greenlet that entered, and nowhere else."""
    from gevent import get_hub, getcurrent

    main = getcurrent()

    def handle(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if getcurrent() is main:
            raise Interrupted(name)
        get_hub().loop.run_callback_threadsafe(deliver, signum, name)

    def deliver(signum: int, name: str) -> None:
        # Runs in the hub, where main waits. Dropped when main left this block, or ignores signals now (a restore).
        if signal.getsignal(signum) is handle and not main.dead:
            main.throw(Interrupted(name))

    with handled(handle):
        yield


def ignored() -> AbstractContextManager[None]:
    """While inside: SIGINT and SIGTERM are ignored, so that a second Ctrl-C cannot cut short the putting back of a host."""
    return handled(signal.SIG_IGN)
