"""One shell command per host, over pyinfra's own connectors, every host at once.

``status`` and ``bench`` talk to hosts outside a deploy. They connect the way
``pyinfra INVENTORY deploy.py`` does (the inventory's ssh_* data, any pyinfra
connector), so that whatever reaches a host for the deploy reaches it here.
A host that cannot be reached, or whose command outlives ``timeout``, gives a
:class:`Result` that says so; it never stops the other hosts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from instinct_fleet.converge.progress import LOST
from instinct_fleet.model.inventory import pyinfra_inventory


@dataclass(frozen=True)
class Result:
    """What one command did on one host; ``error`` says why there is no output (unreachable, timed out)."""

    host: str
    ok: bool
    stdout: str
    stderr: str
    error: str | None = None


class Hosts:
    """Connections to some hosts of an inventory, opened on first use."""

    def __init__(self, inventory_path: str, project_dir: str | None) -> None:
        from pyinfra.api.config import Config
        from pyinfra.api.state import State

        # pyinfra's connectors warn on their logger (unknown host keys and the like), and paramiko logs a
        # traceback for a connection reset or a missing banner; a table with the host's error is printed instead.
        logging.getLogger("pyinfra").setLevel(logging.ERROR)
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)
        self.inventory = pyinfra_inventory(inventory_path, project_dir)
        self.state = State(self.inventory, Config())  # type: ignore[no-untyped-call]

    def _connect(self, name: str) -> Any:
        from pyinfra.api.exceptions import ConnectError

        host = self.inventory.get_host(name)
        if not host.connected:
            try:
                host.connect(show_errors=False, raise_exceptions=True)
            except ConnectError as exc:
                return str(exc)
            except LOST as exc:
                return str(exc) or type(exc).__name__
        return host

    def run(self, name: str, command: str, timeout: int) -> Result:
        """Run ``command`` on host ``name``; never raises for a host that fails."""
        from pyinfra.api.command import StringCommand

        host = self._connect(name)
        if isinstance(host, str):
            return Result(name, False, "", "", f"cannot connect: {host}")
        try:
            ok, output = host.run_shell_command(StringCommand(command), _timeout=timeout)
        except TimeoutError:  # pyinfra's connectors raise it when _timeout passes
            return Result(name, False, "", "", f"no answer within {timeout}s")
        except LOST as exc:  # the host reset or closed the connection mid-command
            return Result(name, False, "", "", f"connection lost: {str(exc) or type(exc).__name__}")
        return Result(name, ok, "\n".join(output.stdout_lines), "\n".join(output.stderr_lines))

    def run_all(self, commands: dict[str, str], timeout: int) -> dict[str, Result]:
        """Each host's command, all at once (pyinfra's greenlets), each within ``timeout``."""
        return self.each(commands, lambda name, command: self.run(name, command, timeout))

    def each(self, items: dict[str, Any], work: Callable[[str, Any], Any]) -> dict[str, Any]:
        """``work(host, item)`` for every host at once; a host's items run in its own greenlet."""
        import gevent

        jobs = {name: gevent.spawn(work, name, item) for name, item in items.items()}
        try:
            gevent.joinall(list(jobs.values()), raise_error=True)
        except BaseException:  # an interrupt, or a bug in one host's work: no host goes on to its next command
            gevent.killall(list(jobs.values()))
            raise
        return {name: job.value for name, job in jobs.items()}


def json_after(stdout: str, mark: str) -> Any:
    """The JSON a command printed after its last ``mark`` line (a benchmark's result, a probe's answers), whatever it
    printed before; None when there is no such line or what follows does not parse."""
    _, found, text = ("\n" + stdout).rpartition(f"\n{mark}\n")
    if not found:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
