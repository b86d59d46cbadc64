"""Shared helpers for the unit tests: plan one host from plain data, as ``instinct-fleet plan`` does."""

from __future__ import annotations

from typing import Any

from instinct_fleet.inventory import HostData, plan_hosts
from instinct_fleet.rules import Finding
from instinct_fleet.spec import HostSpec


def check(data: dict[str, Any], host: str = "h1") -> tuple[HostSpec, list[Finding]]:
    ((spec, findings),) = plan_hosts([HostData(host, ("all",), data)])
    return spec, findings


def rules_of(findings: list[Finding]) -> set[str]:
    return {f.rule for f in findings}
