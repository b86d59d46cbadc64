"""Connect the verify module to a pyinfra inventory: one testinfra host per inventory host.

    pytest --pyargs instinct_fleet.verify --inventory inventories/prod.py [--limit GROUP_OR_HOST]
    instinct-fleet verify inventories/prod.py [--limit GROUP_OR_HOST]

Expected values come from the same code the deploy renders with (instinct_fleet),
fed with the host's data and its preflight report, so a check can only pass when
the host holds exactly what a deploy would write.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import testinfra

from instinct_fleet.converge import evaluate, preflight, probe
from instinct_fleet.converge.hostplan import HostPlan
from instinct_fleet.model.catalog import Catalog
from instinct_fleet.model.inventory import HostData, load_inventory, select
from instinct_fleet.model.spec import HostSpec
from instinct_fleet.roll.plan import plan_inventory


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--inventory", required=True, help="pyinfra inventory file, e.g. inventories/prod.py")
    parser.addoption("--limit", action="append", help="a group name or a glob of host names, as pyinfra's --limit (repeatable)")
    parser.addoption("--project-dir", default=None, help="the directory holding group_data/ (default: the current directory)")


@dataclass
class Target:
    name: str
    plan: HostPlan
    host: Any  # testinfra.host.Host

    def sh(self, command: str) -> str:
        """Run as root (sudo when connecting as another user); fail the test on a non-zero exit."""
        result = self.host.run(command)
        assert result.rc == 0, f"{self.name}: `{command}` exited {result.rc}: {result.stderr}"
        return str(result.stdout)

    def inspect(self, container: str) -> dict[str, Any]:
        return dict(json.loads(self.sh(f"docker inspect {container}"))[0])


def _connect(host: HostData) -> Any:
    data = host.data
    user = data.get("ssh_user") or "root"
    spec = f"ssh://{user}@{data.get('ssh_hostname') or host.name}:{data.get('ssh_port') or 22}"
    # One SSH connection per host for the whole module: each check is a command over it, not a new handshake.
    extra = ["-o ControlMaster=auto", "-o ControlPath=/tmp/instinct-fleet-verify-%C", "-o ControlPersist=30"]
    if data.get("ssh_known_hosts_file"):
        extra.append(f"-o UserKnownHostsFile={data['ssh_known_hosts_file']}")
    if str(data.get("ssh_strict_host_key_checking", "")).lower() in ("no", "off", "false"):
        extra.append("-o StrictHostKeyChecking=no")
    return testinfra.get_host(spec, ssh_identity_file=data.get("ssh_key"), ssh_extra_args=" ".join(extra), sudo=user != "root")


_ALL: list[HostData] = []
_HOSTS: dict[str, HostData] = {}
_TARGETS: dict[str, Target] = {}
_UNREAD: dict[str, str] = {}  # a chosen host whose preflight fact could not be read, and why (its last line of stderr)


_CATALOG: list[Catalog] = []  # the project's recipes and vLLM tables, as the deploy read them


def pytest_configure(config: pytest.Config) -> None:
    project = config.getoption("--project-dir")
    everyone = load_inventory(config.getoption("--inventory"), project)
    _CATALOG.append(Catalog.of(Path(project) if project else None))
    _ALL.extend(everyone)
    _HOSTS.update({h.name: h for h in select(everyone, config.getoption("--limit"))})


def _plan_all() -> None:
    """Plan the chosen hosts (and their cluster peers) from the inventory and each host's preflight output."""
    connections = {h.name: _connect(h) for h in _ALL}

    def report_of(name: str, spec: HostSpec) -> preflight.HostReport | None:
        result = connections[name].run(probe.script(spec.vars.hf_token_path, evaluate.probe(spec)))
        if result.rc != 0:
            lines = str(result.stderr).strip().splitlines()
            _UNREAD[name] = f"exit {result.rc}: {lines[-1] if lines else 'no output'}"
            return None
        return preflight.parse_report(result.stdout)

    def read_reports(specs: dict[str, HostSpec]) -> dict[str, preflight.HostReport | None]:
        with ThreadPoolExecutor(max(1, min(32, len(specs)))) as pool:  # every host's fact at once, as the deploy reads them
            reports = dict(zip(specs, pool.map(report_of, specs, specs.values()), strict=True))
        return reports

    for name, plan in plan_inventory(_ALL, set(_HOSTS), read_reports, catalog=_CATALOG[0]).items():
        if name in _HOSTS:
            _TARGETS[name] = Target(name, plan, connections[name])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        metafunc.parametrize("target", sorted(_HOSTS), indirect=True, scope="module")


@pytest.fixture(scope="module")
def target(request: pytest.FixtureRequest) -> Target:
    name = str(request.param)
    if not _TARGETS:
        _plan_all()
    if name not in _TARGETS or name in _UNREAD:
        pytest.fail(f"{name}: its preflight fact could not be read ({_UNREAD.get(name, 'cannot connect')})", pytrace=False)
    return _TARGETS[name]
