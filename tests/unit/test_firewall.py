"""The firewall denies by default, and what ``plan`` states of it is the ruleset the deploy loads.

Both come from one list (firewall.openings); these tests hold the statement to the ruleset, port by port, and the
ruleset to nft itself. What the deployed ruleset does to real packets is tests/e2e/test_front.py's hostile-network test.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from instinct_fleet.converge import firewall
from instinct_fleet.converge.hostfacts import HostFacts
from instinct_fleet.converge.preflight import parse_report
from instinct_fleet.model.inventory import HostData, plan_hosts
from tests.unit.consumers import nft_check

from .test_preflight import mi300x_host

CASES: dict[str, list[HostData]] = {
    "plain": [HostData("h", (), {"scrape_address": "10.0.0.5"})],
    "router": [
        HostData("r", (), {"router": True, "scrape_address": "10.0.0.1", "router_admin_from": ["10.8.0.0/24"]}),
        HostData("b", (), {"scrape_address": "10.0.0.2"}),
    ],
    # sim-gpu-2 of the demo without its vllm_allow_from: keyed, its instance in the router's pool.
    "keyed": [
        HostData("r", (), {"router": True, "scrape_address": "10.0.0.1", "vllm_instances": []}),
        HostData("k", (), {"scrape_address": "10.0.0.2", "vllm_api_key_path": "/etc/instinct-fleet/api-key"}),
    ],
    "narrowed": [
        HostData(
            "h",
            (),
            {
                "scrape_address": "10.0.0.5",
                "vllm_allow_from": ["10.0.0.0/8"],
                "prometheus_allow_from": ["10.9.0.5"],
                "metrics_exporter": True,
                "ssh_allow_from": ["10.7.0.0/16", "fd00::/64"],
            },
        )
    ],
}


def ruleset_of(case: str, host: str, report_text: str = "") -> tuple[str, list[str]]:
    specs = {str(s.host): s for s, _ in plan_hosts(CASES[case])}
    spec = specs[host]
    text = firewall.firewall(HostFacts(spec, parse_report(report_text), None, None))
    assert text is not None
    return text, firewall.exposure(spec)


@pytest.mark.parametrize(("case", "host"), [("plain", "h"), ("router", "r"), ("router", "b"), ("keyed", "k"), ("narrowed", "h")])
def test_what_plan_states_is_what_the_ruleset_opens_and_nft_loads_it(case: str, host: str, tmp_path: Path) -> None:
    text, said = ruleset_of(case, host)
    (tmp_path / "fw.nft").write_text(text)
    assert nft_check(tmp_path / "fw.nft") == ""
    assert "policy drop;" in text and said[-1] == "any other port, one opened at run time included: nobody"
    for sentence in said[:-1]:
        what, ports, who = re.fullmatch(r"(.+) \(port (.+)\): (.+)", sentence).groups()  # type: ignore[union-attr]
        if who == "anyone":
            assert f'tcp dport {{ {ports} }} accept comment "{what}: anyone"' in text, sentence
            assert f'tcp dport {{ {ports} }} counter drop comment "{what}:' not in text
        else:
            assert f'tcp dport {{ {ports} }} counter drop comment "{what}: {who} only"' in text, sentence
            assert f'tcp dport {{ {ports} }} accept comment "{what}: anyone"' not in text
            assert re.search(rf"tcp dport {{ {re.escape(ports)} }} ip6? saddr @\w+ accept", text), sentence
    # Nothing else is accepted by port: every accept for anyone is one the statement names.
    anyone = set(re.findall(r'tcp dport \{ ([^}]+) \} accept comment "', text))
    assert anyone == {re.fullmatch(r".+ \(port (.+)\): anyone", s).group(1) for s in said if s.endswith(": anyone")}  # type: ignore[union-attr]


def test_the_router_worker_api_is_never_open_to_anyone() -> None:
    text, said = ruleset_of("router", "r")
    assert "router worker API (port 31000): its pools' serving hosts and router_admin_from" in said
    assert "router clients (port 30000): anyone" in said
    assert "10.0.0.1/32, 10.0.0.2/32, 10.8.0.0/24" in text


def test_ssh_stays_open_on_the_port_sshd_answered_the_deploy_on() -> None:
    """$SSH_CONNECTION's server port, not the inventory's (a NAT or a published port in front of sshd)."""
    report = mi300x_host(ssh="10.0.0.9 51234 10.0.0.5 2222")
    assert parse_report(report).ssh_port == 2222
    text, _ = ruleset_of("plain", "h", report)
    assert 'tcp dport { 2222 } accept comment "SSH: anyone"' in text and "dport { 22 }" not in text
    narrowed, said = ruleset_of("narrowed", "h", report)
    assert said[0] == "SSH (port 22): ssh_allow_from"  # plan, before any connection, names the inventory's port
    assert "tcp dport { 2222 } ip saddr @ssh_allowed_v4 accept" in narrowed and "elements = { 10.7.0.0/16 }" in narrowed
    assert 'tcp dport { 2222 } counter drop comment "SSH: ssh_allow_from only"' in narrowed
    for bad in ("", "10.0.0.9 51234", "a b c d", "1 2 3 70000"):
        assert parse_report(mi300x_host(ssh=bad)).ssh_port is None


def test_a_firewall_switched_off_is_said_so(capsys: pytest.CaptureFixture[str]) -> None:
    spec = plan_hosts([HostData("h", (), {"firewall": False})])[0][0]
    assert firewall.exposure(spec) == [] and firewall.firewall(HostFacts(spec, parse_report(""), None, None)) is None
    from instinct_fleet.cli import _exposure_lines

    planned: list[tuple[Any, list[Any]]] = [(spec, [])]
    assert _exposure_lines(planned) == ["Firewall of h: off (firewall = False): every port is open to anyone"]


def test_a_keyed_instance_behind_routers_answers_its_routers_alone() -> None:
    """vLLM checks the key on its /v1 routes only (/tokenize, /pooling, /score, /invocations answer anyone), so a keyed
    host in a pool with no vllm_allow_from opens its vLLM ports to its routers (and the scrapers) alone."""
    text, said = ruleset_of("keyed", "k")
    assert "vLLM (port 8080, 9401): its routers (vllm_api_key_path)" in said
    assert "tcp dport { 8080, 9401 } ip saddr @routers_v4 accept" in text and "elements = { 10.0.0.1/32 }" in text
    # A router reached at a name cannot be admitted: refused before any host.
    hosts = [HostData("r", (), {"router": True, "vllm_instances": []}), *CASES["keyed"][1:]]
    reach = [f for _, fs in plan_hosts(hosts) for f in fs if f.rule == "router-reach"]
    assert [(f.host, f.key, f.severity) for f in reach] == [("k", "vllm_allow_from", "error")] and "reached at a name (r)" in reach[
        0
    ].message
    # Without a key, or with vllm_allow_from, the rule does not apply.
    plain = [
        HostData("r", (), {"router": True, "scrape_address": "10.0.0.1", "vllm_instances": []}),
        HostData("k", (), {"scrape_address": "10.0.0.2"}),
    ]
    assert "vLLM (port 8080, 9401): anyone" in firewall.exposure(next(s for s, _ in plan_hosts(plain) if str(s.host) == "k"))


def test_verify_reads_the_allow_list_back_as_nft_lists_it(tmp_path: Path) -> None:
    """nft merges neighbouring addresses (172.17.0.4 and .5 into 172.17.0.4/31) and wraps long sets: verify's reading of
    the live table (verify.test_hosts.live_set) is checked on nft's own listing, loaded in a namespace of its own."""
    import subprocess

    from instinct_fleet.verify.test_hosts import live_set
    from tests.unit.consumers import IP, NFT

    allow = ("172.17.0.1", "172.17.0.2", "172.17.0.4", "172.17.0.5", "fd00::/64", *(f"10.1.{i}.9" for i in range(40)))
    text = firewall.firewall_ruleset([], [], [8000], allow, scrapers=("10.9.0.5",))
    (tmp_path / "fw.nft").write_text(text)
    netns = "instinct-fleet-live-set"
    subprocess.run([IP, "netns", "add", netns], check=True)
    try:
        subprocess.run([IP, "netns", "exec", netns, NFT, "-f", str(tmp_path / "fw.nft")], check=True)
        listing = subprocess.run(
            [IP, "netns", "exec", netns, NFT, "list", "table", "inet", "instinct_fleet"], capture_output=True, text=True, check=True
        ).stdout
    finally:
        subprocess.run([IP, "netns", "delete", netns], check=True)
    assert "172.17.0.4/31" in listing and "172.17.0.5" not in listing  # what the old check looked for is not there
    networks = live_set(listing, "vllm_allowed")
    import ipaddress

    for entry in allow:
        network = ipaddress.ip_network(entry, strict=False)
        assert any(network.version == n.version and network.subnet_of(n) for n in networks), entry  # type: ignore[arg-type]
    assert not any(ipaddress.ip_address("10.9.0.5") in n for n in networks)  # another set's element is not this one's
