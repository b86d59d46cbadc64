"""``instinct-fleet report --fleet`` (instinct_fleet/commands/picture.py): the fleet board's main panels drawn from a
Prometheus HTTP API (here one in this process that answers each query with its own series), and the PNG held to the
answers: its panels, their lines and points, read back from the PNG itself; and what it refuses."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from instinct_fleet.cli import main
from instinct_fleet.commands import boards, picture
from instinct_fleet.model.inventory import HostData, plan_hosts
from tests.unit.promserver import answer

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = str(ROOT / "inventories" / "prod.py")  # needs no simulated fleet


class Prometheus:
    """tests/unit/promserver.py in its own process: its URL, and the queries it was asked."""

    def __init__(self, directory: Path, refuse: bool = False) -> None:
        self.log = directory / f"asked-{refuse}.jsonl"
        argv = [sys.executable, str(Path(__file__).with_name("promserver.py")), str(self.log), *(["refuse"] if refuse else [])]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.url = f"http://127.0.0.1:{self.process.stdout.readline().strip()}"

    def asked(self) -> list[dict[str, str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path)
    yield server
    server.stop()


def size(png: Path) -> tuple[int, int]:
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_picture_holds_each_main_panel_as_prometheus_answered_it(tmp_path: Path, prometheus: Prometheus) -> None:
    png = tmp_path / "fleet.png"
    assert main(["report", "--fleet", INVENTORY, "--prometheus", prometheus.url, "--since", "30m", "-o", str(png)]) == 0
    asked = prometheus.asked()
    assert size(png) == (picture.WIDTH_PX, picture.HEIGHT_PX)
    drawn = picture.read_back(png)
    assert [p.title for p in drawn] == list(picture.MAIN)
    board = boards.fleet_board([spec for spec, _ in plan_hosts([HostData("a", (), {"vllm_instances": [{"name": "one", "port": 8000}]})])])
    panels = {p["title"]: p for p in board["panels"]}
    for panel in drawn:
        targets = panels[panel.title]["targets"]
        mine = [a for a in asked if a["query"] in {picture._promql(t["expr"], 7.5) for t in targets}]
        assert len(mine) == len(targets), panel.title
        # Each line is one series of the answers, its legend the board's, its points the answer's, in order.
        expected = sorted(
            (
                t["legendFormat"].replace("{{model}}", f"m{k}").replace("{{host}}", f"h{k}"),
                [(float(x), float(y)) for x, y in series["values"]],
            )
            for t, a in zip(targets, mine, strict=True)
            for k, series in zip((1, 2), answer(a), strict=True)
        )
        assert [(line.legend, line.points) for line in panel.lines] == expected, panel.title
    # Grafana's variables are given values; the window is the last 30 minutes in 240 steps, rates over 4 of them or 1m.
    assert all("$" not in a["query"] for a in asked)
    assert {a["step"] for a in asked} == {"7.5"}
    assert {float(a["end"]) - float(a["start"]) for a in asked} == {1800.0}
    assert any("[60s]" in a["query"] for a in asked)


def test_what_it_cannot_draw_is_refused_with_what_to_do(tmp_path: Path, prometheus: Prometheus, capsys: pytest.CaptureFixture[str]) -> None:
    png = str(tmp_path / "fleet.png")
    assert main(["report", "--fleet", INVENTORY, "-o", png]) != 0
    assert "give its address with --prometheus URL" in capsys.readouterr().err
    assert main(["report", "--fleet", INVENTORY, "--prometheus", prometheus.url, "--since", "90 minutes", "-o", png]) != 0
    assert "--since '90 minutes' is not a Prometheus duration" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--fleet", INVENTORY, "--prometheus", prometheus.url, "-o", png]) != 0
    assert "one of the two" in capsys.readouterr().err
    assert main(["report", "--fleet", INVENTORY, "--prometheus", "http://127.0.0.1:9", "-o", png]) != 0
    assert "cannot be asked" in capsys.readouterr().err
    refusing = Prometheus(tmp_path, refuse=True)
    try:
        assert main(["report", "--fleet", INVENTORY, "--prometheus", refusing.url, "-o", png]) != 0
    finally:
        refusing.stop()
    said = capsys.readouterr().err
    assert "refused the query of 'Request rate': " in said and "parse error at char 5" in said
    assert not Path(png).exists()
