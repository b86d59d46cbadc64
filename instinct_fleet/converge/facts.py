"""pyinfra facts: each keeps its command apart from how its output is read.

The parsing lives in :mod:`instinct_fleet.converge.preflight` (the probe's command in :mod:`instinct_fleet.converge.probe`) and :mod:`instinct_fleet.converge.health`,
pure functions that unit tests run on captured output.
"""

from __future__ import annotations

import shlex

from pyinfra.api.facts import FactBase

from instinct_fleet.converge import health, preflight
from instinct_fleet.converge.probe import Probe, script


class HostReport(FactBase[preflight.HostReport]):
    """Everything preflight needs, in one SSH round trip (see :mod:`instinct_fleet.converge.probe`)."""

    def command(self, token_path: str, probe: Probe) -> str:
        return script(token_path, probe)

    def process(self, output: list[str]) -> preflight.HostReport:
        return preflight.parse_report("\n".join(output))


class DockerImageId(FactBase[str | None]):
    """The local id of an image, None when the image (or docker) is absent."""

    def command(self, image: str) -> str:
        return f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        value = "\n".join(output).strip()
        return value if value.startswith("sha256:") else None


class InstanceHealth(FactBase[health.Health]):
    """Wait until one instance is healthy (health.serving); stop early if its unit fails or restarts."""

    def command(
        self,
        unit: str,
        port: int,
        served: str,
        timeout: int,
        key_path: str | None = None,
        generates: bool = True,
        anchors: tuple[str, ...] = (),
    ) -> str:
        return health.wait_script(unit, port, served, timeout, key_path, generates, anchors)

    def process(self, output: list[str]) -> health.Health:
        return health.parse("\n".join(output))


class UnitProblems(FactBase[list[str]]):
    """What ``systemd-analyze verify`` finds wrong with a unit file; empty when it passes."""

    def command(self, path: str) -> str:
        return f"out=$(systemd-analyze verify {shlex.quote(path)} 2>&1) || printf '%s\\n' \"$out\"; true"

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line.strip()]
