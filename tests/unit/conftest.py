"""Shared helpers for the unit tests: resolve + validate a host from plain data."""

from __future__ import annotations

from typing import Any

from instinct_fleet.rules import Finding
from instinct_fleet.spec import HostSpec, resolve_host
from instinct_fleet.validate import validate_host


def check(data: dict[str, Any], host: str | None = "h1") -> tuple[HostSpec, list[Finding]]:
    spec, findings = resolve_host(host, data)
    return spec, [*findings, *validate_host(spec)]


def rules_of(findings: list[Finding]) -> set[str]:
    return {f.rule for f in findings}
