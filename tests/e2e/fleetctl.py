"""What the end-to-end tests do to the simulated fleet: deploy, verify, ssh, inventories, faults."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fleet"))
import fleet as simulated  # noqa: E402  (tests/fleet/fleet.py: its slot, INSTINCT_FLEET_SLOT, decides where its state is)

FLEET_FILE = simulated.STATE / "fleet.json"
INVENTORY = "inventories/local.py"
CLI = [sys.executable, "-m", "instinct_fleet"]  # as the instinct-fleet script runs it (instinct_fleet/__main__.py)
FLEET = [sys.executable, str(ROOT / "tests" / "fleet" / "fleet.py")]
SERVING = "sim-[gc]*"  # every host but sim-nogpu
# The serving units of the test fleet and the endpoints each answers on (host, port).
UNITS = {
    "sim-gpu-1": (("sim-gpu-1", 18001), ("sim-gpu-1", 8081)),
    "sim-gpu-2": (("sim-gpu-2", 18002), ("sim-gpu-2", 8001)),
    "cluster sim-405b": (("sim-c1", 18004),),
}


SECRETS = {"the Hugging Face token": simulated.HF_TOKEN, "the API key": simulated.API_KEY}


def unleaked(argv: Any, *outputs: str) -> None:
    """No output of the tool holds a secret of the fleet: every end-to-end call of the CLI passes its output here."""
    for name, secret in SECRETS.items():
        for output in outputs:
            assert secret not in output, f"`{' '.join(map(str, argv))}` printed {name}"


def run_cli(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The instinct-fleet CLI as a user runs it, from the repository; its output never holds a secret (:func:`unleaked`)."""
    command = [*CLI, *argv]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    unleaked(command, done.stdout, done.stderr)
    return done


@dataclass
class Run:
    rc: int
    results: dict[str, Any]
    stderr: str
    roll: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def changed(self) -> set[tuple[str, str]]:
        """(host, operation names) for every operation that changed something on a host."""
        return {(host, " / ".join(op["names"])) for op in self.results["operations"] for host in op["success"]}

    def changed_ops(self) -> set[tuple[str, str]]:
        """(host, operation name without the deploy functions' prefixes) for every operation that changed something."""
        return {(host, names.split(" | ")[-1]) for host, names in self.changed()}

    def status(self, host: str) -> set[str]:
        """The roll summary's statuses for one host's instances."""
        return {row["status"] for row in self.roll if row["host"] == host}

    def why(self, host: str) -> str:
        return " ".join(row["why"] for row in self.roll if row["host"] == host)


def deploy(*extra: str, inventory: str = INVENTORY, results: bool = True, command: str = "deploy") -> Run:
    """``instinct-fleet deploy --json`` (or ``command``: rollback); ``results=False`` when pyinfra is expected
    to stop with no host left."""
    started = time.monotonic()
    argv = [command, inventory, "--project-dir", str(ROOT), "--json", "-y", *extra]
    done = run_cli(*argv, timeout=3600)
    try:
        payload = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"deploy printed no JSON (rc {done.returncode}): {done.stdout[-1000:]}\n{done.stderr[-4000:]}") from None
    assert (payload["results"] is not None) == results, f"rc {done.returncode}: {done.stderr[-3000:]}"
    return Run(done.returncode, payload["results"] or {}, done.stderr, payload["roll"], time.monotonic() - started)


def verify(limit: str, inventory: str = INVENTORY) -> subprocess.CompletedProcess[str]:
    return run_cli("verify", inventory, "--project-dir", str(ROOT), "--limit", limit, "--", "-q", "-x")


def ssh(fleet: dict[str, Any], host: str, command: str) -> str:
    port = next(h["ssh_port"] for h in fleet["hosts"] if h["name"] == host)
    argv = ["ssh", "-i", fleet["ssh_key"], "-p", str(port), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    done = subprocess.run([*argv, "-o", "LogLevel=ERROR", "root@127.0.0.1", command], capture_output=True, text=True)
    assert done.returncode == 0, f"{host}: {command}: {done.stderr}"
    return done.stdout


# Every serving unit and env file a host has, and the roll marker: what a rollback or a tune's restore
# must leave byte for byte.
SERVING_FILES = (
    "sha256sum /etc/systemd/system/vllm-*.service /etc/systemd/system/ray-*.service /etc/instinct-fleet/*.env; ls /run/instinct-fleet"
)


def serving_files(fleet: dict[str, Any], hosts: tuple[str, ...] = ("sim-gpu-1", "sim-gpu-2", "sim-c1", "sim-c2")) -> dict[str, str]:
    return {h: ssh(fleet, h, SERVING_FILES + " 2>/dev/null; true") for h in hosts}


def quiet(run: Run, failed: tuple[str, ...] = ("sim-nogpu",)) -> None:
    """Nothing changed anywhere, and only the hosts in ``failed`` failed (the demo's GPU-less host)."""
    assert run.results["totals"]["success"] == 0, run.changed()
    assert run.results["failed_hosts"] == list(failed), run.stderr[-3000:]


def container(fleet: dict[str, Any], host: str) -> str:
    """The machine's name for a simulated host (``docker pause`` it, ``docker kill`` it)."""
    return str(next(h["container"] for h in fleet["hosts"] if h["name"] == host))


def started_at(fleet: dict[str, Any], host: str, container: str) -> str:
    return ssh(fleet, host, f"docker inspect --format '{{{{.State.StartedAt}}}}' {container}").strip()


def fleet_tool(*argv: str) -> str:
    done = subprocess.run([*FLEET, *argv], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"fleet {argv}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return done.stdout.strip()


def inventory(
    directory: Path, name: str, everywhere: dict[str, Any], hosts: dict[str, dict[str, Any]] | None = None, extra_hosts: str = ""
) -> str:
    """An inventory file: inventories/local.py with ``everywhere`` added to every host and ``hosts`` to some."""
    (directory / "inventories").mkdir(parents=True, exist_ok=True)
    path = directory / "inventories" / f"{name}.py"
    path.write_text(
        "import runpy\n"
        f"base = runpy.run_path({str(ROOT / INVENTORY)!r})\n"
        f"everywhere = {everywhere!r}\n"
        f"hosts = {hosts or {}!r}\n"
        "def extend(group):\n"
        "    return [(n, {**d, **everywhere, **hosts.get(n, {})}) for n, d in group]\n"
        "sim_gpu = extend(base['sim_gpu'])\n"
        "sim_nogpu = extend(base['sim_nogpu'])\n"
        "sim_cluster = extend(base['sim_cluster'])\n" + extra_hosts
    )
    return str(path)


class Probe:
    """Polls every serving endpoint's /health from the test machine, at ``hz``, while a deploy runs."""

    def __init__(self, fleet: dict[str, Any], hz: float = 5.0, units: dict[str, tuple[tuple[str, int], ...]] | None = None) -> None:
        self.address = {h["name"]: h["address"] for h in fleet["hosts"]}
        self.units = units or UNITS
        self.period = 1.0 / hz
        self.samples: list[tuple[float, dict[str, bool]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _up(self, host: str, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address[host]}:{port}/health", timeout=1) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def _run(self) -> None:
        end = time.monotonic() + 900  # bounded, whatever happens to the deploy
        while not self._stop.is_set() and time.monotonic() < end:
            begun = time.monotonic()
            units = {unit: all(self._up(h, p) for h, p in endpoints) for unit, endpoints in self.units.items()}
            self.samples.append((begun, units))
            self._stop.wait(max(0.0, self.period - (time.monotonic() - begun)))

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def worst(self) -> int:
        """The fewest serving units that were fully healthy at any sample."""
        return min(sum(units.values()) for _, units in self.samples)

    def seen_down(self) -> set[str]:
        """The units some sample found not healthy: the probe resolved their restarts, whatever its rate on a loaded
        machine (a probe too sparse to see a restart would make :meth:`worst` vacuous)."""
        return {unit for _, units in self.samples for unit, up in units.items() if not up}

    def rate(self) -> float:
        span = self.samples[-1][0] - self.samples[0][0]
        return (len(self.samples) - 1) / span if span else 0.0


FLAG = "max-num-seqs"
# A short drain, so that test_faults' hang test's short command_timeout still lets a normal restart finish
# (rolling_drain_timeout plus docker's 30 s stop margin must stay below it: rule timeouts).
# The re-tunes of the tests: the canary off, said by plan (the demo's own default canary: test_roll_gates.DEMO).
BASELINE = {"vllm_args": {FLAG: 160}, "rolling_drain_timeout": 5, "canary_profile": None}


Fault = list[str] | Callable[["subprocess.Popen[str]"], None]


def streamed_deploy(inventory_path: str, when: str, fault: Fault) -> tuple[int, str, float]:
    """Run a deploy and inject ``fault`` (a command, or a function of the deploy's process) as soon as its
    output shows ``when``."""
    started = time.monotonic()
    argv = [*CLI, "deploy", inventory_path, "--project-dir", str(ROOT), "-y"]
    pending = True
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if when in line and pending:
                if callable(fault):
                    fault(proc)
                else:
                    subprocess.run(fault, check=True, capture_output=True)
                pending = False
        rc = proc.wait(timeout=600)
    unleaked(argv, "".join(lines))
    return rc, "".join(lines), time.monotonic() - started


def give_work(fleet: dict[str, Any], host: str) -> None:
    """A converged host runs no operation at all; a drifted file gives it one to hang or die in."""
    ssh(fleet, host, "sed -i 's/= 0/= 1/' /etc/sysctl.d/90-instinct-fleet.conf")


# Figures the tests measured (roll time, worst healthy fraction), printed at the end of the run.
FIGURES: list[str] = []


OSS = "openai/gpt-oss-120b"
ROUTER_PORT = 30000  # inventories/local.py: the router on sim-gpu-1, its first pool gpt-oss-120b


def router_url(fleet: dict[str, Any], port: int = ROUTER_PORT) -> str:
    return f"http://{next(h['address'] for h in fleet['hosts'] if h['name'] == 'sim-gpu-1')}:{port}"


# The router itself on sim-gpu-1 (router_admin_port): its worker API, which its clients' port (ROUTER_PORT) answers
# with 404; inventories/local.py admits the machine to it through router_admin_from.
ADMIN_PORT = 31000


def admin_url(fleet: dict[str, Any], port: int = ADMIN_PORT) -> str:
    return router_url(fleet, port)


def pool(fleet: dict[str, Any]) -> list[str]:
    """The workers of sim-gpu-1's router, as its own /list_workers says."""
    with urllib.request.urlopen(f"{admin_url(fleet)}/list_workers", timeout=10) as reply:
        return sorted(json.loads(reply.read())["urls"])


def until(what: Callable[[], bool], seconds: float) -> float:
    """Seconds until ``what()`` holds; fails after ``seconds``."""
    started = time.monotonic()
    while not what():
        assert time.monotonic() - started < seconds, f"not within {seconds} s"
        time.sleep(0.5)
    return time.monotonic() - started


@dataclass(frozen=True)
class Sample:
    """One client request: streamed or not, whether it succeeded (a streamed one must end with [DONE]), its wall time."""

    streamed: bool
    ok: bool
    seconds: float
    why: str = ""
    at: float = 0.0  # when it was sent (time.monotonic())


class Load:
    """A steady client: ``rate`` requests a second to ``url`` (a router, or one instance), streaming and not in turn,
    each on its own thread, so a slow or failing request never delays the next."""

    def __init__(self, url: str, rate: float = 8.0, key: str | None = None, model: str = OSS, vary: bool = False) -> None:
        self.url, self.period, self.model = url, 1.0 / rate, model
        self.vary = vary  # a prompt of its own per request, so that a cache-aware router spreads them over its pool
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.done: list[Sample] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _one(self, stream: bool, n: int) -> None:
        prompt = f"{n} route me" if self.vary else "route me"
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": 8, "stream": stream}).encode()
        request = urllib.request.Request(f"{self.url}/v1/completions", body, self.headers)
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                text = reply.read().decode()
            ok, why = ("[DONE]" in text, text[-200:]) if stream else ('"choices"' in text, text[-200:])
        except OSError as error:
            ok, why = False, str(error)
        sample = Sample(stream, ok, time.monotonic() - started, "" if ok else why, started)
        with self._lock:
            self.done.append(sample)

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self.period):
            thread = threading.Thread(target=self._one, args=(n % 2 == 1, n), daemon=True)
            thread.start()
            self._threads.append(thread)
            n += 1

    def __enter__(self) -> Load:
        self._main = threading.Thread(target=self._run, daemon=True)
        self._main.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._main.join()
        for thread in self._threads:
            thread.join(70)

    def failed(self) -> list[str]:
        return [s.why for s in self.done if not s.ok]

    def served(self, streamed: bool) -> int:
        return sum(1 for s in self.done if s.ok and s.streamed == streamed)


def hang(url: str, key: str) -> None:
    """Hang the stand-in engine at ``url`` (POST /standin/hang: /health stays 200, no step, requests wait, as
    vllm#39863's engine core did), and send it two requests of its own that wait: a router's cache-aware policy may
    send a client's prompts elsewhere, and a hung engine that nobody asks is idle, not stalled."""
    urllib.request.urlopen(urllib.request.Request(f"{url}/standin/hang", b"{}", method="POST"), timeout=10).close()
    body = json.dumps({"model": OSS, "prompt": "stuck", "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    for _ in range(2):
        threading.Thread(target=_ask, args=(urllib.request.Request(f"{url}/v1/completions", body, headers),), daemon=True).start()


def _ask(request: urllib.request.Request) -> None:
    with contextlib.suppress(OSError):
        urllib.request.urlopen(request, timeout=300).close()
