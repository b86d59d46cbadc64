"""pyinfra operations instinct-fleet adds: each yields a command only when one is needed."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.operations import systemd
from pyinfra.operations.util import any_changed

from instinct_fleet import health
from instinct_fleet.facts import DockerImageId, InstanceHealth, UnitProblems


def _failure(message: str) -> str:
    """A command that fails this host, and only this host, with ``message`` on stderr."""
    return f"printf '%s\\n' {shlex.quote('instinct-fleet: ' + message)} >&2; exit 1"


@operation(is_idempotent=False)
def fail(message: str) -> Generator[str, None, None]:
    """Fail this host with a message that says what is wrong and how to fix it."""
    yield _failure(message)


@operation()
def image_present(image: str) -> Generator[str, None, None]:
    """Pull ``image`` only when the host does not have it; a pinned tag never moves."""
    if host.get_fact(DockerImageId, image=image) is None:
        yield f"docker pull --quiet {shlex.quote(image)}"
    else:
        host.noop(f"image {image} is present")


@operation()
def healthy(unit: str, port: int, served_model: str, timeout: int) -> Generator[str, None, None]:
    """Wait for an instance to answer /health and list its model; fail the host if it does not.

    Changes nothing, so it never counts as a change. It only waits while the
    deploy executes: at plan time the units may not even exist yet.
    """
    if not host.state.is_executing:
        return
    result = host.get_fact(InstanceHealth, unit=unit, port=port, timeout=timeout)
    problem = health.verdict(unit, port, served_model, result)
    if problem is None:
        host.noop(f"{unit} healthy on :{port}, serving {served_model}")
    else:
        yield _failure(problem)


@operation()
def unit_verified(path: str) -> Generator[str, None, None]:
    """Fail the host when ``systemd-analyze verify`` rejects the unit, before anything starts it."""
    if not host.state.is_executing:
        return
    problems = host.get_fact(UnitProblems, path=path)
    if problems:
        yield _failure(f"{path} fails systemd-analyze verify: " + " | ".join(problems[:10]))
    else:
        host.noop(f"{path} passes systemd-analyze verify")


def service_converged(unit: str, changed: list[Any]) -> None:
    """Restart ``unit`` only when one of the ``changed`` operations did change, then keep it running and enabled.

    A restart needs the unit running already (a stopped unit is simply started by
    the second operation), so a first deploy starts each unit once.
    """
    service = f"{unit}.service"
    systemd.service(
        name=f"Restart {unit} for its new unit, env or image", service=service, running=None, restarted=True, _if=any_changed(*changed)
    )
    systemd.service(name=f"{unit} running and enabled", service=service, running=True, enabled=True)
