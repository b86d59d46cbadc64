"""Render a typed service into what runs: the env file lines and the ``vllm serve`` argv.

Both the CLI's JSON and the deploy's templates call these functions, so what
``instinct-fleet plan`` prints is exactly what the unit runs.
"""

from __future__ import annotations

from typing import Any

from instinct_fleet import knowledge
from instinct_fleet.recipes import ArgValue
from instinct_fleet.spec import ServiceSpec


def _format(value: ArgValue) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def render_args(svc: ServiceSpec) -> list[str]:
    """The flags after ``vllm serve MODEL``; the port comes last, from the instance."""
    try:
        table: knowledge.VllmKnowledge | None = knowledge.load(svc.version)
    except KeyError:
        table = None
    argv: list[str] = []
    for flag, value in svc.args.items():
        kind = table.flag(flag).kind if table is not None and f"--{flag}" in table.flags else "bool"
        if value is True:
            argv.append(f"--{flag}")
        elif value is False:
            if kind == "bool":
                argv.append(f"--no-{flag}")
        else:
            argv += [f"--{flag}", _format(value)]
    return [*argv, "--port", str(svc.port)]


def service_json(svc: ServiceSpec) -> dict[str, Any]:
    """The contract of ``--json`` output for one service."""
    return {
        "name": svc.name,
        "host": svc.host,
        "image": svc.image,
        "model": svc.model,
        "env": dict(svc.env),
        "vllm_args": render_args(svc),
        "gpus": list(svc.gpus),
        "port": svc.port,
    }
