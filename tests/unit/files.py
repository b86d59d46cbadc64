"""The managed files of a plan, grouped as the tests read them, from its desired state (instinct_fleet/converge/managed.py)."""

from __future__ import annotations

from instinct_fleet.converge.hostplan import HostPlan


def unit_files(plan: HostPlan) -> dict[str, dict[str, str]]:
    """Per serving unit (ray-* first): its unit file's and env file's path and content."""
    return {unit: plan.desired.unit_files(unit) for unit in plan.desired.serving}


def docker_files(plan: HostPlan) -> dict[str, str | None]:
    """daemon.json and dockerd's drop-in; None: must be absent."""
    return {f.path: None if f.content is None else f.text for f in plan.desired.stage("docker")}


def exporter_files(plan: HostPlan) -> dict[str, str]:
    """The device metrics exporter's unit and config, when it is on."""
    return {f.path: f.text for f in plan.desired.stage("exporter") if f.content is not None}
