#!/usr/bin/env python3
"""Where the CPU of a ``make test`` goes: per host process and per container, sampled while a command runs.

Run by hand as root, around a clean-clone CI run:

    sudo .venv/bin/python benchmarks/ci_cpu.py -- bash .ci/run

Every 5 s it reads, for each process outside Docker's cgroups, its user and system CPU since it started
(less what it had used when the sampling began), and each container's cgroup usage (cgroup v1 ``cpuacct``),
with the command lines of the processes it holds, read when it is first seen: the simulated hosts, and the
containers their own dockerd starts beside them (stand-in vLLM instances, Ray nodes, benchmark clients). It
prints the machine's CPU over the run and the largest consumers, grouped by what they run. A process that starts
and ends between two samples is missed (its CPU shows only in the machine's total), so the groups add up to less.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
TICK = os.sysconf("SC_CLK_TCK")
PERIOD = 5.0


def read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def processes() -> dict[tuple[str, str], tuple[float, str, str]]:
    """(pid, start time) -> (CPU seconds, command line, INSTINCT_FLEET_SLOT) of every process outside Docker's cgroups."""
    found = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        pid = stat.split("/")[2]
        text, cgroup = read(stat), read(f"/proc/{pid}/cgroup")
        if not text or re.search(r"cpuacct:/docker", cgroup):
            continue
        fields = text[text.rindex(")") + 2 :].split()
        command = read(f"/proc/{pid}/cmdline").replace("\0", " ").strip()[:160] or f"[{text.split('(')[1].split(')')[0]}]"
        slot = re.search(r"INSTINCT_FLEET_SLOT=(\d+)", read(f"/proc/{pid}/environ"))
        found[(pid, fields[19])] = ((int(fields[11]) + int(fields[12])) / TICK, command, slot.group(1) if slot else "-")
    return found


def containers() -> dict[str, tuple[float, str]]:
    """Container id -> (CPU seconds of its cgroup, the command lines it holds)."""
    found = {}
    for usage in glob.glob(str(CPUACCT / "docker" / "*" / "cpuacct.usage")):
        directory = Path(usage).parent
        pids = read(directory / "cgroup.procs").split()[:30]
        commands = sorted({read(f"/proc/{p}/cmdline").replace("\0", " ")[:80] for p in pids} - {""})
        found[directory.name] = (int(read(usage) or 0) / 1e9, " | ".join(commands[:3]))
    return found


# The Python tools, named by the program an interpreter runs, never by an argument: the end-to-end tests' instinct-fleet
# and pyinfra commands take inventories under pytest's tmp_path (/tmp/pytest-of-root/...), and a pattern that found
# "pytest" anywhere in a command line counted them as the tests' own CPU.
TOOLS = {"pyinfra": "pyinfra", "instinct_fleet": "instinct-fleet command", "instinct-fleet": "instinct-fleet command", "pip": "pip"}


def program(command: str) -> str:
    """The program a command line runs: the module of ``python -m``, the script a Python interpreter runs, else its executable."""
    words = command.split()
    if len(words) > 1 and Path(words[0]).name.startswith("python"):
        return words[2] if words[1] == "-m" and len(words) > 2 else Path(words[1]).name
    return Path(words[0]).name if words else ""


def kind(command: str) -> str:
    """What a container or process runs, in a few words."""
    for pattern, name in (
        (r"ray::|ray/_private|ray start|gcs_server|raylet|ray/dashboard", "Ray node"),
        (r"vllm_standin.py serve", "stand-in vLLM instance"),
        (r"bench_standin|vllm_standin.py bench", "benchmark client"),
        (r"/lib/systemd/systemd", "simulated host (systemd, sshd, dockerd, the watch)"),
        (r"device-metrics|exporter", "metrics exporter stand-in"),
    ):
        if re.search(pattern, command):
            return name
    tool = program(command)
    if tool == "pytest":
        return (
            "unit tests" if " tests/unit" in command else "verify's testinfra" if "instinct_fleet/verify" in command else "end-to-end tests"
        )
    if tool in TOOLS:
        return TOOLS[tool]
    for pattern, name in ((r"dockerd|containerd", "dockerd and containerd"), (r"^ssh ", "ssh client")):
        if re.search(pattern, command):
            return name
    return "other: " + command.split(" ")[0][-40:]


def main() -> None:
    argv = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else sys.exit(__doc__)
    before, total_before = processes(), int(read(CPUACCT / "cpuacct.usage") or 0)
    boxes_before = {cid: used for cid, (used, _) in containers().items()}
    seen: dict[tuple[str, str], tuple[float, str, str]] = {}
    boxes: dict[str, tuple[float, str]] = {}
    started = time.monotonic()
    child = subprocess.Popen(argv)
    while child.poll() is None:
        seen.update(processes())
        for cid, (used, commands) in containers().items():
            boxes[cid] = (used, boxes[cid][1] if cid in boxes and boxes[cid][1] else commands)
        time.sleep(PERIOD)
    wall = time.monotonic() - started
    total = (int(read(CPUACCT / "cpuacct.usage") or 0) - total_before) / 1e9
    groups: Counter[str] = Counter()
    for key, (used, command, _slot) in seen.items():
        groups[kind(command)] += used - (before[key][0] if key in before else 0.0)
    for cid, (used, commands) in boxes.items():
        groups["container: " + kind(commands)] += used - boxes_before.get(cid, 0.0)
    print(f"\n{argv} exited {child.returncode} after {wall:.0f} s; the machine's CPU: {total:.0f} s ({total / wall:.2f} cores)")
    print(f"containers: {len(boxes)}, {sum(u - boxes_before.get(c, 0.0) for c, (u, _) in boxes.items()):.0f} s")
    for name, used in groups.most_common(20):
        print(f"{used:8.0f} s  {name}")
    sys.exit(child.returncode)


if __name__ == "__main__":
    main()
