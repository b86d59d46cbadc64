"""Ctrl-C and SIGTERM in the commands whose hosts run in greenlets: raised in the main greenlet only.

Real signals to real processes: this one (gevent's greenlets as the commands run them), and
``instinct-fleet status`` and ``bench`` against a host that accepts SSH connections and never answers,
where a KeyboardInterrupt raised in paramiko's transport greenlet used to read as an unreachable host.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gevent
import gevent.event
import pytest

from instinct_fleet.live import bench, remote
from instinct_fleet.live.interrupts import Interrupted, ignored, raised_in_main
from instinct_fleet.model import workload

from .conftest import check

ROOT = Path(__file__).resolve().parents[2]


def test_a_signal_reaches_the_main_greenlet_where_it_waits_and_no_other(capfd: pytest.CaptureFixture[str]) -> None:
    counts = [0, 0, 0]

    def step(i: int) -> None:
        for _ in range(30):
            gevent.sleep(0.01)
            counts[i] += 1

    def kill() -> None:
        gevent.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs in this greenlet, or in the hub

    workers = [gevent.spawn(step, i) for i in range(3)]
    # Python's own handler, or SIG_IGN where the test runs in the background of a shell (which ignores SIGINT for it).
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as raised, raised_in_main():
        gevent.joinall([*workers, gevent.spawn(kill)])
    assert raised.value.name == "SIGINT"
    assert not any(w.dead for w in workers)  # none of them got the exception
    gevent.joinall(workers, raise_error=True)
    assert counts == [30, 30, 30]
    assert "Traceback" not in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before and before in (signal.default_int_handler, signal.SIG_IGN)


def test_a_signal_while_the_main_greenlet_runs_is_raised_at_once() -> None:
    began = time.monotonic()
    with pytest.raises(Interrupted) as raised, raised_in_main():
        os.kill(os.getpid(), signal.SIGTERM)
        while time.monotonic() - began < 5:  # busy, never waits: nothing else would run
            pass
    assert raised.value.name == "SIGTERM" and time.monotonic() - began < 4  # not after the 5 s loop
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_ignored_keeps_a_signal_from_cutting_a_restore_short() -> None:
    with raised_in_main():
        with ignored():
            gevent.spawn(os.kill, os.getpid(), signal.SIGINT).join()
            gevent.sleep(0.1)
        with pytest.raises(Interrupted):  # and the handler is back after it
            gevent.spawn(os.kill, os.getpid(), signal.SIGINT).join()
            gevent.sleep(1)


HOLD = 600  # seconds the silent host holds a command that does not stop: paramiko's timeouts, through the inventory


@dataclass
class Silent:
    """An inventory whose one host accepts TCP connections and never sends an SSH banner.

    paramiko waits for the banner ``HOLD`` seconds (pyinfra passes the host's ``ssh_paramiko_connect_kwargs`` on),
    so a command that stopped only when its host let it go stands apart from one that stopped at once, however
    loaded the machine is (a fixed bound of 2 s failed on a CI machine that ran three suites at once).
    """

    inventory: Path
    connected: threading.Event


@pytest.fixture
def silent_ssh(tmp_path: Path) -> Iterator[Silent]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    connected = threading.Event()

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return
            connected.set()

    threading.Thread(target=accept, daemon=True).start()
    path = tmp_path / "inventories" / "silent.py"
    path.parent.mkdir()
    timeouts = {"banner_timeout": HOLD, "auth_timeout": HOLD, "timeout": HOLD}
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": listener.getsockname()[1], "ssh_paramiko_connect_kwargs": timeouts}
    path.write_text(f"silent = [('s1', {data!r})]\n")
    yield Silent(path, connected)
    listener.close()
    for conn in held:
        conn.close()


@pytest.mark.parametrize(("command", "number"), [("status", signal.SIGINT), ("bench", signal.SIGTERM)])
def test_a_command_waiting_on_its_hosts_stops_at_once_with_one_line(silent_ssh: Silent, command: str, number: signal.Signals) -> None:
    argv = [sys.executable, "-m", "instinct_fleet", command, str(silent_ssh.inventory)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert silent_ssh.connected.wait(60)  # the connection is open; paramiko waits for the banner
    time.sleep(0.2)
    assert proc.poll() is None
    sent = time.monotonic()
    proc.send_signal(number)
    stdout, stderr = proc.communicate(timeout=HOLD / 10)  # raises if the command still waits on its host
    assert proc.returncode == 130 and time.monotonic() - sent < HOLD / 10, stdout + stderr
    assert stderr == f"instinct-fleet: {number.name}: stopped\n" and "unreachable" not in stdout


class Benching(remote.Hosts):
    """remote.Hosts' own ``each`` (a greenlet per host), with a host whose benchmark runs until its container is
    removed, as ``docker rm -f`` ends ``docker run``."""

    def __init__(self) -> None:
        self.commands: list[str] = []
        self.benchmarking = gevent.event.Event()
        self.removed = gevent.event.Event()

    def run(self, name: str, command: str, timeout: int) -> remote.Result:
        self.commands.append(command)
        if "bench serve" in command:
            self.benchmarking.set()
            self.removed.wait(60)
            return remote.Result(name, False, "", "the container was removed")
        self.removed.set()
        return remote.Result(name, True, "", "")


def test_an_interrupted_bench_removes_its_containers_and_starts_no_other_run(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    spec, _ = check({})
    jobs = workload.jobs(spec, spec.services[0], "seed-001-gpt-oss", None, [1, 2])
    runner = Benching()
    said: list[str] = []
    gevent.spawn(lambda: (runner.benchmarking.wait(), os.kill(os.getpid(), signal.SIGINT)))
    with pytest.raises(Interrupted):
        bench.run(runner, jobs, None, tmp_path / "T", 60, said.append, {})
    first, stop = runner.commands
    assert first == bench.command(jobs[0], "T", None) and f"--label {bench.LABEL}=T " in first
    assert (
        stop
        == bench.stop_command("T")
        == f"/usr/bin/docker ps -q --filter label={bench.LABEL}=T | xargs -r /usr/bin/docker rm -f >/dev/null"
    )
    assert said[-1] == f"SIGINT: stopping the benchmark containers on {spec.host}"
    gevent.sleep(0.1)
    assert len(runner.commands) == 2  # the first run's greenlet was killed: the host's second run never started
    assert "Traceback" not in capfd.readouterr().err


# ``python -m instinct_fleet`` whose load of gevent (the first module after the early handlers) says so on stdout and
# then takes 10 s: a signal sent on that line lands while the command loads, however fast or loaded the machine is.
SLOW_LOAD = """
import importlib.abc, runpy, sys, time

class SlowGevent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "gevent":
            sys.meta_path.remove(self)
            print("loading gevent", flush=True)
            time.sleep(10)
        return None

sys.meta_path.insert(0, SlowGevent())
sys.argv = ["instinct-fleet", *sys.argv[1:]]
runpy.run_module("instinct_fleet", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_command_loads_stops_it_with_one_line(number: signal.Signals) -> None:
    """Loading pyinfra and the package takes a second or more, and a Ctrl-C there is one line, not a traceback. The
    signal is sent while gevent loads (SLOW_LOAD): a fixed sleep once landed before the interpreter had even
    imported ``site`` on a loaded CI machine, and on a fast one it lands after the loading."""
    argv = [sys.executable, "-c", SLOW_LOAD, "status", "inventories/local.py"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "loading gevent\n"
    proc.send_signal(number)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and stderr == f"instinct-fleet: {number.name}: stopped\n", stderr
