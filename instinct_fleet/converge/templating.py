"""The package's templates (instinct_fleet/templates), read through importlib.resources as pyinfra's packaged deploys read
theirs: an installed wheel renders exactly what a checkout does; the files copied as they are; the modules the watch
imports on the host."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

# The templates are package data (instinct_fleet/templates), read through importlib.resources as pyinfra's
# packaged deploys read theirs: an installed wheel renders exactly what a checkout does.
TEMPLATES = ("instinct_fleet", "templates")


@cache
def _templates() -> Environment:
    # The settings pyinfra's files.template uses, so a rendered file is byte for byte what pyinfra would write.
    return Environment(undefined=StrictUndefined, keep_trailing_newline=True, loader=PackageLoader(*TEMPLATES))


def template(name: str, **values: Any) -> str:
    """A file from ``templates/``, rendered: the deploy writes it, the verify module and the roll compare it."""
    return _templates().get_template(name).render(**values)


def watch_module(package: str, name: str) -> bytes:
    """A module of the package as it holds it (the progress rule, the GPU evidence): the watch imports this very file on
    the host, so each must use the standard library alone (test_watch)."""
    return resources.files(package).joinpath(name).read_bytes()


def template_bytes(name: str) -> bytes:
    """A file from ``templates/`` copied as it is (the Ray readiness script)."""
    return resources.files(TEMPLATES[0]).joinpath(TEMPLATES[1], name).read_bytes()
