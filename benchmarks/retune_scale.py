#!/usr/bin/env python3
"""What a re-tune costs as the fleet grows: N = 8, 16, 32, 64 and 128 simulated hosts, in one run.

For each N it starts a light fleet (``tests/fleet/fleet.py up --hosts N``) and measures:

* first converge: wall time of ``pyinfra -y benchmarks/scale_inventory.py deploy.py``;
* upstream image fetches: blob requests, and bytes, that the upstream registry
  served while the fleet pulled through the pull-through cache (which starts empty);
* no-op re-tune: the median of 5 runs, against the SSH floor (``ssh true`` to
  every host in parallel, median of 5) measured in the same run;
* commands per host on a no-op, counted from pyinfra's ``--debug`` log;
* CPU seconds of a no-op and of the floor: the whole machine's (from /proc/stat) and the control side's
  alone (pyinfra's process; the ssh clients): on this machine every simulated host shares the same 2
  CPUs with the controller, so the machine's CPU is what sets both times, and the hosts' part of it
  (machine minus control side) runs on each host's own CPUs in a real fleet;
* peak memory (max RSS) of the pyinfra process, first converge and no-op;
* memory per simulated host, from each host container's cgroup;
* disk the fleet took, on the filesystem of Docker's root, after its first converge.

It writes its section of ``benchmarks/RESULTS.md`` with the machine it ran on and prints how each
figure grows with N. Needs root (dockerd) and takes about an hour and a half on 2 CPUs (128 hosts
need about 40 GiB of disk); it is not part of ``make test``. ``fleet.py up`` refuses a fleet the
disk cannot hold, before starting any host. Usage: ``sudo .venv/bin/python benchmarks/retune_scale.py [N ...]``
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fleet"))
import fleet as simulated  # noqa: E402  (the fleet's slot, its state and its SSH options)

STATE = simulated.STATE  # the slot fleet.py runs in (INSTINCT_FLEET_SLOT)
FLEET = [sys.executable, str(ROOT / "tests" / "fleet" / "fleet.py")]
PYINFRA = [sys.executable, "-m", "pyinfra", "-y", "benchmarks/scale_inventory.py", "deploy.py"]
# pyinfra runs the package as pip installs it, its bytecode compiled once (pip compiles at install); a
# PYTHONDONTWRITEBYTECODE in the environment would have it compile every module on every run.
PYCACHE = Path(tempfile.mkdtemp(prefix="retune-scale-pyc-"))
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "PYTHONPYCACHEPREFIX": str(PYCACHE)}
DOCKER = "/usr/bin/docker"
BLOB = re.compile(r'"GET /v2/\S+/blobs/sha256:[0-9a-f]+ HTTP/[\d.]+" 200 (\d+)')


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy since boot (every state of /proc/stat's cpu line but idle and iowait)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class Timed(NamedTuple):
    """One command's run: wall seconds, its peak RSS in MiB (from wait4), its output, and the CPU seconds of the
    machine and of the command itself (with its children) while it ran."""

    wall: float
    rss_mib: int
    output: str
    machine_cpu: float
    control_cpu: float


class Floor(NamedTuple):
    """One SSH floor: wall seconds, and the CPU seconds of the machine and of the ssh clients."""

    wall: float
    machine_cpu: float
    control_cpu: float


def timed(argv: list[str], check: bool = True) -> Timed:
    """Run ``argv`` in the checkout with the benchmark's environment; exit with its output if it fails (``check``)."""
    with tempfile.TemporaryFile("w+") as sink:
        busy = machine_cpu()
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, text=True, env=ENV)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.monotonic() - started
        machine = machine_cpu() - busy
        proc.returncode = os.waitstatus_to_exitcode(status)
        sink.seek(0)
        output = sink.read()
    if check and proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}:\n{output[-3000:]}")
    return Timed(elapsed, int(usage.ru_maxrss / 1024), output, machine, usage.ru_utime + usage.ru_stime)


def ssh_floor(hosts: list[dict], key: str) -> Floor:
    """One `ssh true` per host, all at once: the least any tool needs to reach every host once."""

    def one(port: int) -> float:
        proc = subprocess.Popen(["ssh", *simulated.ssh_options(Path(key), port), "root@127.0.0.1", "true"])
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"retune_scale: ssh to port {port} failed")
        return usage.ru_utime + usage.ru_stime

    busy = machine_cpu()
    started = time.monotonic()
    with ThreadPoolExecutor(len(hosts)) as pool:
        clients = sum(pool.map(one, [h["ssh_port"] for h in hosts]))
    return Floor(time.monotonic() - started, machine_cpu() - busy, clients)


def upstream_blobs() -> tuple[int, int]:
    log = STATE / "registry.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    sizes = [int(m.group(1)) for m in BLOB.finditer(text)]
    return len(sizes), sum(sizes)


def host_memory_mib(hosts: list[dict]) -> float:
    """Mean resident memory of a host container (systemd, sshd, dockerd and its containers), from its cgroup.

    cgroup v1: total_rss of memory.stat (page cache, which the kernel reclaims, left out);
    cgroup v2: anon of memory.stat.
    """
    values = []
    for h in hosts:
        cid = subprocess.run(
            [DOCKER, "inspect", "-f", "{{.Id}}", h["container"]], capture_output=True, text=True, check=True
        ).stdout.strip()
        for path, key in (
            (f"/sys/fs/cgroup/memory/docker/{cid}/memory.stat", "total_rss"),
            (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.stat", "anon"),
            (f"/sys/fs/cgroup/docker/{cid}/memory.stat", "anon"),
        ):
            if Path(path).exists():
                stat = dict(line.split() for line in Path(path).read_text().splitlines())
                values.append(int(stat[key]) / 2**20)
                break
    if not values:
        sys.exit("retune_scale: no memory cgroup found for the host containers")
    return statistics.mean(values)


def reset_cache() -> None:
    """An empty pull-through cache, so that the first converge shows what the upstream registry sends."""
    subprocess.run(["pkill", "-f", f"docker-registry serve {STATE / 'cache.yml'}"], check=False)
    time.sleep(1)
    subprocess.run(["rm", "-rf", str(STATE / "cache")], check=True)


def free_gib() -> float:
    root = subprocess.run([DOCKER, "info", "-f", "{{.DockerRootDir}}"], capture_output=True, text=True, check=True).stdout.strip()
    return shutil.disk_usage(root).free / 2**30


def measure(count: int) -> dict[str, float | int | str]:
    subprocess.run([*FLEET, "down"], check=True)
    reset_cache()
    free_before = free_gib()
    started = time.monotonic()
    subprocess.run([*FLEET, "up", "--hosts", str(count)], check=True)
    up_seconds = time.monotonic() - started
    fleet = json.loads((STATE / "fleet.json").read_text())
    hosts = fleet["hosts"]
    blobs_before, bytes_before = upstream_blobs()
    first = timed(PYINFRA)
    blobs_after, bytes_after = upstream_blobs()
    disk = free_before - free_gib()  # hosts, their images and containers, the cache's copy
    noops = [timed(PYINFRA) for _ in range(5)]
    floors = [ssh_floor(hosts, fleet["ssh_key"]) for _ in range(5)]
    debug = timed([*PYINFRA, "--debug"]).output
    commands = Counter(re.findall(r"Running command on (sim-[\w-]+):", debug))
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "instinct-fleet"), "deploy", "benchmarks/scale_inventory.py", "-y", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    results = json.loads(cli.stdout)["results"] or {}
    noop, floor = statistics.median(run.wall for run in noops), statistics.median(run.wall for run in floors)
    return {
        "hosts": count,
        "fleet_up_s": round(up_seconds, 1),
        "host_mem_mib": round(host_memory_mib(hosts)),
        "disk_gib": round(disk, 1),
        "first_converge_s": round(first.wall, 1),
        "first_peak_rss_mib": first.rss_mib,
        "upstream_blob_fetches": blobs_after - blobs_before,
        "upstream_mib": round((bytes_after - bytes_before) / 2**20),
        "noop_median_s": round(noop, 2),
        "ssh_floor_s": round(floor, 2),
        "noop_over_floor": round(noop / floor, 2),
        "noop_cpu_s": round(statistics.median(run.machine_cpu for run in noops), 2),
        "noop_control_cpu_s": round(statistics.median(run.control_cpu for run in noops), 2),
        "floor_cpu_s": round(statistics.median(run.machine_cpu for run in floors), 2),
        "floor_control_cpu_s": round(statistics.median(run.control_cpu for run in floors), 2),
        "noop_peak_rss_mib": max(run.rss_mib for run in noops),
        "commands_per_host_max": max(commands.values()) if commands else 0,
        "changed_ops_on_noop": results.get("totals", {}).get("success", "?"),
        "first_converge_tail": first.output.strip().splitlines()[-1] if first.output.strip() else "",
    }


def machine() -> str:
    cpus = os.cpu_count()
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // 2**20
    pyinfra = subprocess.run([sys.executable, "-m", "pyinfra", "--version"], capture_output=True, text=True).stdout.strip()
    return f"{cpus} CPUs, {mem} GiB RAM, Linux {platform.release()}, Python {platform.python_version()}, {pyinfra}"


def growth(rows: list[dict], key: str) -> str:
    first, last = rows[0], rows[-1]
    if not first[key]:
        return "n/a"
    ratio = float(last[key]) / float(first[key])
    return f"x{ratio:.1f} for x{last['hosts'] / first['hosts']:.0f} hosts"


def main() -> None:
    counts = [int(a) for a in sys.argv[1:]] or [8, 16, 32, 64, 128]
    rows = []
    for n in counts:
        rows.append(measure(n))
        print(json.dumps(rows[-1]), flush=True)
        write_results(rows)
    subprocess.run([*FLEET, "down"], check=True)
    shutil.rmtree(PYCACHE, ignore_errors=True)


BEGIN = "<!-- benchmarks/retune_scale.py writes from here to the end marker -->"
END = "<!-- end of benchmarks/retune_scale.py -->"


def write_results(rows: list[dict]) -> None:
    keys = [k for k in rows[0] if k != "first_converge_tail"]
    table = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    table += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    grows = [
        f"- `{k}`: {growth(rows, k)}"
        for k in (
            "first_converge_s",
            "noop_median_s",
            "ssh_floor_s",
            "noop_cpu_s",
            "noop_control_cpu_s",
            "floor_cpu_s",
            "noop_peak_rss_mib",
            "upstream_mib",
        )
    ]
    text = "\n".join(
        [
            f"Measured by `benchmarks/retune_scale.py` on {time.strftime('%Y-%m-%d')}: {machine()}.",
            "Simulated hosts (tests/fleet/fleet.py, light fleet): single-node hosts run the slim stand-in (no Ray),",
            "cluster hosts the full one (421 MB); each host's dockerd stores them with overlay2 on a volume.",
            "Every host pulls through a pull-through cache that starts empty.",
            "",
            *table,
            "",
            "How each figure grows:",
            *grows,
        ]
    )
    # Only its own part of RESULTS.md, between the markers: the other sections are other measurements.
    results = ROOT / "benchmarks" / "RESULTS.md"
    before, rest = results.read_text().split(BEGIN + "\n", 1)
    after = rest.split(END, 1)[1]
    results.write_text(f"{before}{BEGIN}\n{text}\n{END}{after}")


if __name__ == "__main__":
    main()
