"""A hung or lost host fails alone, instead of stalling or ending the whole run.

**Hung.** A watchdog ends an operation that outlives its ``_timeout`` on a host.

pyinfra's ``_timeout`` bounds how long a command's output may take, but not the
opening of its SSH channel, and a fact that times out returns nothing, which
pyinfra's own operations do not expect. A host that stops answering (hung,
paused, its sshd frozen) keeps TCP alive, so it could stall or crash the whole
run. The watchdog arms a timer when an operation starts on a host and disarms
it when the operation ends. When it fires first, it fails that host in
pyinfra's state and ends the operation's greenlet; the run goes on without it.

**Lost.** When a host's SSH connection drops mid-operation, pyinfra's facts
return nothing and its operations then raise (a failed SFTP open, a None fact),
which ends the whole run. :class:`ContainedPool` runs each host's operation so
that an error raised *after its host's connection is gone* fails that host
only. An error on a host that is still connected is a bug and is raised as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gevent
import gevent.pool
from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback


def _expire(work: Any, host: Any, seconds: int, what: str, record: Callable[[str, str], None], state: Any | None) -> None:
    message = f"no answer within {seconds}s during {what}: the host looks hung (command_timeout)"
    logger.error(f"{host.print_prefix}{message}")
    record(host.name, message)
    if state is not None:
        try:
            state.fail_hosts({host})
        except PyinfraError as exc:  # no host left, or FAIL_PERCENT reached: pyinfra's own verdict
            logger.error(f"--> {exc}")
    work.kill(block=False)  # GreenletExit: the greenlet ends quietly where it waits on SSH


def guarded(host: Any, seconds: int, what: str, record: Callable[[str, str], None], state: Any | None = None) -> Any:
    """A timer that ends the current greenlet's work on ``host`` after ``seconds``; ``.kill()`` it when done in time."""
    return gevent.spawn_later(seconds, _expire, gevent.getcurrent(), host, seconds, what, record, state)


class Watchdog(BaseStateCallback):
    def __init__(self, record: Callable[[str, str], None]) -> None:
        self.record = record
        self.timers: dict[tuple[str, str], Any] = {}

    def operation_host_start(self, state: Any, host: Any, op_hash: str) -> None:  # type: ignore[override]  # pyinfra calls it on the instance
        if op_hash not in state.ops[host]:
            return
        seconds = state.get_op_data_for_host(host, op_hash).global_arguments.get("_timeout")
        if seconds:
            what = ", ".join(sorted(state.get_op_meta(op_hash).names))
            self.timers[host.name, op_hash] = guarded(host, int(seconds), what, self.record, state)

    def _disarm(self, host: Any, op_hash: str) -> None:
        timer = self.timers.pop((host.name, op_hash), None)
        if timer is not None:
            timer.kill()

    def operation_host_success(self, state: Any, host: Any, op_hash: str, retry_count: int = 0) -> None:  # type: ignore[override]
        self._disarm(host, op_hash)

    def operation_host_error(self, state: Any, host: Any, op_hash: str, retry_count: int = 0, max_retries: int = 0) -> None:  # type: ignore[override]
        self._disarm(host, op_hash)


def connected(host: Any) -> bool:
    """Whether ``host``'s SSH transport is still up (hosts of other connectors count as connected)."""
    client = getattr(host.connector, "client", None)
    if client is None:
        return True
    transport = client.get_transport()
    return transport is not None and bool(transport.is_active())


def _contained(record: Callable[[str, str], None], run: Callable[..., Any], state: Any, host: Any, op_hash: str) -> Any:
    try:
        return run(state, host, op_hash)
    except Exception as exc:  # re-raised below unless the host's connection is gone
        if connected(host):
            raise
        what = ", ".join(sorted(state.get_op_meta(op_hash).names))
        message = f"lost its SSH connection during {what} ({type(exc).__name__}: {exc}); it fails alone"
        logger.error(f"{host.print_prefix}{message}")
        record(host.name, message)
        return False  # pyinfra fails the host


class ContainedPool(gevent.pool.Pool):  # type: ignore[misc]
    """pyinfra's greenlet pool, with each host's operation contained (see the module docstring)."""

    def __init__(self, size: int | None, record: Callable[[str, str], None]) -> None:
        super().__init__(size)
        self.record = record

    def spawn(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # pyinfra runs one host's operation as _run_host_op_with_context(state, host, op_hash).
        if getattr(func, "__name__", "") == "_run_host_op_with_context" and len(args) == 3 and not kwargs:
            return super().spawn(_contained, self.record, func, *args)
        return super().spawn(func, *args, **kwargs)
