"""``instinct-fleet status``: what every unit of the fleet is doing now, read in one round trip per host.

For each vLLM instance: its unit's state, ``/health``, the image its container
runs, and from its ``/metrics`` the requests running and waiting and the
KV-cache usage, by the metric names of the vLLM version it runs. Ray and
device-metrics-exporter units get a row too, so a cluster worker and a host
whose exporter died show up; so does each router, with its live pool (its own
``/workers``: which instances its health checks pass) against the inventory's. A roll in progress (the marker a deploy writes
while a host's batch runs) is shown on every row of that host; ``bench``
reads the same rows to refuse such a host. Each instance's row carries the watch's verdict (its /state, the one
progress rule of instinct_fleet/model/liveness.py): in, down, paused, restarting, or left out with why.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from instinct_fleet.converge import gpuhealth, health, preflight, probe
from instinct_fleet.converge.evidence import SECTIONS
from instinct_fleet.converge.preflight import HostReport, sections
from instinct_fleet.model import knowledge, paths, render
from instinct_fleet.model.pools import Pool
from instinct_fleet.model.spec import HostSpec

MARK = "@@instinct-fleet-status "
# vLLM's own metric names (vllm/v1/metrics/loggers.py). The KV-cache usage gauge was vllm:gpu_cache_usage_perc
# until 0.9.1 renamed it (vllm-project/vllm#18354); which one the pinned version has is read from its source.
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
KV_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def kv_cache_metric(table: knowledge.VllmKnowledge | None) -> str | None:
    """The KV-cache usage gauge the pinned vLLM creates (its extracted ``metrics``); None when its table names neither."""
    metrics = table.metrics if table is not None else {}
    return next((name for name in KV_CACHE if metrics.get(name) == "gauge"), None)


@dataclass(frozen=True)
class Row:
    """One unit of one host, as status shows it."""

    host: str
    instance: str  # an instance name, or the Ray or exporter unit
    unit: str
    state: str  # systemd's ActiveState: active, activating, failed, inactive ... ; unreachable
    health: str  # "ok", an HTTP status, "no answer" or "-" where the unit has no endpoint
    image: str = "-"
    image_id: str = ""
    wanted_image: str = "-"
    port: int | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache: float | None = None
    rolling: str | None = None  # the roll marker's line while a roll runs on the host
    error: str | None = None
    pool: str | None = None  # a router: how many of its pool's instances its health checks pass
    pool_drift: str | None = None  # a router: how its live pool differs from the inventory's
    compile_cache: int | None = None  # an instance: bytes in its image's compile-cache directory on the host
    watch: str | None = None  # an instance on a host with the watch: its verdict (in, down, paused, restarting, left-out)
    watch_reason: str = ""
    watch_restarts: int | None = None  # the watch's restarts of it within watch_restart_window
    quarantined: str | None = None  # why the GPU health verdict holds it out (paths.QUARANTINE), stopped

    @property
    def ok(self) -> bool:
        """Active, answering where it has an endpoint, and running the image the inventory names."""
        return self.problem() is None

    def problem(self) -> str | None:
        """Why this unit is not serving as it should, in words for the user; None when it is."""
        if self.error:
            return self.error
        if self.quarantined is not None:
            return (
                f"{self.unit} is quarantined, out of its pools and stopped: {self.quarantined}; the next deploy re-admits it "
                "once amd-smi shows the evidence cleared"
            )
        if self.state != "active":
            return f"{self.unit} is {self.state}"
        if self.health not in ("ok", "-"):
            return f"{self.unit} is active but its endpoint gives {self.health}"
        if self.wanted_image not in ("-", self.image):
            return f"{self.unit} runs {self.image}, not {self.wanted_image}: deploy to roll it"
        if self.pool_drift:
            return f"{self.unit}'s pool is not the inventory's ({self.pool_drift}): deploy to converge it"
        if self.watch == "left-out":
            out = paths.watch_out(self.unit)
            return f"{self.unit} is left out of its router pools by the watch ({self.watch_reason}): find the cause in its journal, then `rm {out}` on {self.host}"
        if self.watch == "restarting":
            return f"{self.unit} is out of its router pools while the watch restarts it ({self.watch_reason})"
        if self.watch == "no answer":
            return f"the watch of {self.host} does not answer: `systemctl status {paths.WATCH_UNIT}` there"
        return None


EVIDENCE = (*SECTIONS, "partitions")  # the preflight fact's probes that GPU health reads


def script(spec: HostSpec) -> str:
    """One shell command that reads every unit of this host."""
    q = shlex.quote
    parts = [
        f"printf '{MARK}roll\\n'; cat {paths.ROLL_MARKER} 2>/dev/null; true",
        f"printf '{MARK}quarantine\\n'; tr -d '\\n' < {paths.QUARANTINE} 2>/dev/null; echo; true",
    ]
    for svc in spec.serves:
        unit = paths.vllm_unit(svc.name)
        metrics = "|".join(re.escape(m) for m in (RUNNING, WAITING, kv_cache_metric(svc.table)) if m is not None)
        parts.append(
            f"printf '{MARK}instance {unit}\\n'; systemctl show -p ActiveState --value {unit}.service; "
            f"if {health.serving(svc.port, render.served_model(svc), spec.vars.vllm_api_key_path, generates=render.generates(svc))}; then echo 'health ok'; "
            f"else echo \"health $(curl -s -o /dev/null -m 3 -w '%{{http_code}}' http://127.0.0.1:{svc.port}/health)\"; fi; "
            f"docker inspect -f 'image {{{{.Config.Image}}}} {{{{.Image}}}}' {unit} 2>/dev/null; "
            f'echo "cache $(du -sb {q(spec.compile_cache(svc))} 2>/dev/null | cut -f1)"; '
            f"curl -s -m 3 http://127.0.0.1:{svc.port}/metrics 2>/dev/null | grep -E {q(f'^({metrics})[{{ ]')}; true"
        )
    if spec.vars.watch and spec.serves:  # the watch's verdict on every instance, by the one progress rule (liveness.py)
        parts.append(f"printf '{MARK}watch\\n'; curl -s -m 3 http://127.0.0.1:{spec.vars.watch_port}/state; echo; true")
    if spec.vars.gpu_health:  # the evidence the deploy's preflight judges, read by the same probes
        parts.append(evidence_script())
    cluster = spec.cluster
    if cluster is not None:
        ray = paths.ray_unit(cluster.role)
        parts.append(f"printf '{MARK}unit {ray}\\n'; systemctl show -p ActiveState --value {paths.service(ray)}")
    for pool in spec.pools:  # the router's own view of its pool: every worker and whether its health checks pass
        # and whether each instance of the inventory answers /health from here (a deploy adds none that does not)
        urls = " ".join(q(w.url) for w in pool.workers)
        parts.append(
            f"printf '{MARK}router {pool.unit}\\n'; systemctl show -p ActiveState --value {pool.unit}.service; "
            f"curl -s -m 3 http://127.0.0.1:{pool.admin_port}/workers | tr -d '\\n'; echo; "
            # at once (a pool of many down instances would take 2 s each in turn); each line is one write
            f'for u in {urls}; do printf \'answers %s %s\\n\' "$u" "$(curl -s -o /dev/null -m 2 -w \'%{{http_code}}\' "$u/health")" & done; wait; true'
        )
    if spec.vars.metrics_exporter:
        port = spec.vars.metrics_exporter_port
        parts.append(
            f"printf '{MARK}unit {paths.EXPORTER_UNIT}\\n'; systemctl show -p ActiveState --value {paths.EXPORTER_UNIT}.service; "
            f"curl -s -o /dev/null -m 3 -w 'health %{{http_code}}\\n' http://127.0.0.1:{port}/metrics; true"
        )
    return "; ".join(parts)


def _sections(text: str) -> dict[str, list[str]]:
    return {name: [line.strip() for line in body.splitlines() if line.strip()] for name, body in sections(text, MARK).items()}


def _metric(lines: list[str], name: str, combine: Any) -> float | None:
    """The value of ``name`` over its label sets (one per engine): summed or the highest."""
    values = []
    for line in lines:
        match = re.match(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+(\S+)", line)
        if match:
            try:
                values.append(float(match.group(1)))
            except ValueError:
                continue
    return combine(values) if values else None


def _health(lines: list[str], instance: bool = True) -> str:
    code = next((line.split()[1] for line in lines if line.startswith("health ") and len(line.split()) > 1), "000")
    if code in ("ok", "200"):  # the exporter's /metrics gives 200; an instance gives ok only when health.serving passes
        return "ok" if code == "ok" or not instance else "lists another model"
    return "no answer" if code == "000" else f"HTTP {code}"


def parse(spec: HostSpec, text: str) -> list[Row]:
    """The rows of one host from its script's output."""
    part = _sections(text)
    rolling = part["roll"][0] if part.get("roll") else None
    host = str(spec.host)
    watched = _watch(part.get("watch")) if spec.vars.watch and spec.serves else None
    held = _quarantine(part.get("quarantine"))
    rows = []
    for svc in spec.serves:
        unit = paths.vllm_unit(svc.name)
        lines = part.get(f"instance {unit}", [])
        state = lines[0] if lines and not lines[0].startswith(("health ", "image ")) else "unknown"
        image_line = next((line.split() for line in lines if line.startswith("image ")), ["image", "-", ""])
        cache = next((line[len("cache ") :] for line in lines if line.startswith("cache ")), "")  # du's bytes; none without the directory
        rows.append(
            Row(
                host=host,
                instance=svc.name,
                unit=paths.service(unit),
                state=state,
                health=_health(lines),
                image=image_line[1] if len(image_line) > 1 else "-",
                image_id=image_line[2] if len(image_line) > 2 else "",
                wanted_image=svc.image,
                port=svc.port,
                running=_metric(lines, RUNNING, sum),
                waiting=_metric(lines, WAITING, sum),
                kv_cache=_metric(lines, kv, max) if (kv := kv_cache_metric(svc.table)) else None,
                rolling=rolling,
                compile_cache=int(cache) if cache.isdigit() else None,
                **_watched(watched, unit),
                quarantined="; ".join(held[unit]) if unit in held else None,
            )
        )
    for pool in spec.pools:
        rows.append(_router_row(host, pool, part.get(f"router {pool.unit}", []), rolling))
    for key, lines in part.items():
        if key.startswith("unit "):
            name = key[5:]
            exporter = name == paths.EXPORTER_UNIT
            state = lines[0] if lines and not lines[0].startswith("health ") else "unknown"
            rows.append(Row(host, name, paths.service(name), state, _health(lines, instance=False) if exporter else "-", rolling=rolling))
    return rows


def evidence_script() -> str:
    """The part of :func:`script` that reads a host's GPU evidence, by the preflight fact's own probes; ``plan
    --gpus`` runs it alone."""
    probes = probe.join((name, command) for name, command in probe.HARDWARE if name in EVIDENCE)
    return f"printf '{MARK}evidence\\n'; {probes}; true"


def gpu_verdicts(read: Mapping[str, tuple[HostSpec, str]]) -> dict[str, list[gpuhealth.Judged] | None]:
    """Each host's GPU verdict from what :func:`evidence_script` printed there (host -> its spec and output), judged
    against the majority of the hosts read, as the deploy judges it; None for a host whose output holds no evidence."""
    reports = {host: (spec, evidence_of(text)) for host, (spec, text) in read.items()}
    most = gpuhealth.majority(report for _, report in reports.values() if report is not None)
    return {host: gpuhealth.judge(report, spec, most) if report is not None else None for host, (spec, report) in reports.items()}


def evidence_of(text: str) -> HostReport | None:
    """The host's GPU evidence from its status output, as the deploy's preflight fact reads it; None without it."""
    lines = _sections(text).get("evidence")
    return preflight.parse_report("\n".join(lines)) if lines else None


def health_row(host: str, judged: list[gpuhealth.Judged]) -> Row:
    """The GPU health verdict of one host (:func:`gpu_verdicts`) as a row: its errors are its problem, its warnings
    shown with it; the next deploy quarantines what an error touches."""
    errors = [j.finding.brief for j in judged if j.finding.severity == "error"]
    warnings = [j.finding.brief for j in judged if j.finding.severity == "warning"]
    health = f"{len(errors)} error(s), {len(warnings)} warning(s)" if judged else "ok"
    why = "; ".join(errors) + ("; warnings: " + "; ".join(warnings) if warnings and errors else "")
    return Row(host, "gpu health", "-", "active", health, error=f"GPU health: {why}" if errors else None)


def _quarantine(lines: list[str] | None) -> dict[str, list[str]]:
    """The quarantine record's units and their reasons (converge/gpuhealth.py); {} without one."""
    try:
        units = json.loads(lines[0])["units"] if lines else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return {str(u): [str(r) for r in reasons] for u, reasons in units.items()} if isinstance(units, dict) else {}


def _watch(lines: list[str] | None) -> dict[str, Any]:
    """The watch's /state (its instances by unit); {} when it did not answer."""
    try:
        return dict(json.loads(lines[0])["instances"]) if lines else {}
    except (ValueError, KeyError, TypeError):
        return {}


def _watched(watched: dict[str, Any] | None, unit: str) -> dict[str, Any]:
    """An instance's watch fields of its Row: none without the watch, "no answer" when the watch gave nothing."""
    if watched is None:
        return {}
    seen = watched.get(unit)
    if seen is None:
        return {"watch": "no answer"}
    return {"watch": str(seen.get("state")), "watch_reason": str(seen.get("reason", "")), "watch_restarts": seen.get("restarts")}


def _router_row(host: str, pool: Pool, lines: list[str], rolling: str | None) -> Row:
    """A router's row: its unit, whether it answers, and its live pool against the inventory's."""
    state = lines[0] if lines and not lines[0].startswith("{") else "unknown"
    try:
        workers = json.loads(next(line for line in lines if line.startswith("{")))["workers"]
    except (StopIteration, ValueError, KeyError, TypeError):
        return Row(host, pool.model, paths.service(pool.unit), state, "no answer", port=pool.port, rolling=rolling)
    live = {str(w.get("url")): bool(w.get("is_healthy")) for w in workers}
    want = {w.url for w in pool.workers}
    # A worker missing from the pool is drift only while it answers: a deploy leaves out an instance that does not
    # serve (its host failed preflight, it is down or held out), and the router would send it nothing.
    answers = {p[1] for line in lines if (p := line.split())[:1] == ["answers"] and len(p) == 3 and p[2] == "200"}
    missing = sorted(u for u in want - set(live) if u in answers)
    drift = [f"missing {u}" for u in missing] + [f"not in the inventory {u}" for u in sorted(set(live) - want)]
    summary = f"{sum(live.values())} of {len(want)} healthy"
    return Row(
        host,
        pool.model,
        paths.service(pool.unit),
        state,
        "ok",
        port=pool.port,
        rolling=rolling,
        pool=summary,
        pool_drift="; ".join(drift) or None,
    )


def unreachable(spec: HostSpec, why: str) -> list[Row]:
    """One row per unit of a host that could not be read, each saying why."""
    units: list[tuple[str, str, str, int | None]] = [
        (svc.name, paths.service(paths.vllm_unit(svc.name)), svc.image, svc.port) for svc in spec.serves
    ]
    if spec.cluster is not None:
        ray = paths.ray_unit(spec.cluster.role)
        units.append((ray, paths.service(ray), "-", None))
    if spec.vars.metrics_exporter:
        units.append((paths.EXPORTER_UNIT, paths.service(paths.EXPORTER_UNIT), "-", None))
    units += [(pool.model, paths.service(pool.unit), "-", pool.port) for pool in spec.pools]
    return [
        Row(str(spec.host), name, unit, "unreachable", "-", wanted_image=image, port=port, error=why) for name, unit, image, port in units
    ]


def _num(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.1f}%" if percent else f"{value:g}"


def _size(value: int | None) -> str:
    """Bytes as du -h writes them (the image's compile cache; shared by the host's instances of that image)."""
    if value is None:
        return "-"
    size, unit = float(value), "B"
    for unit in ("B", "K", "M", "G", "T"):
        if size < 1024 or unit == "T":
            break
        size /= 1024
    return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"


def table(rows: list[Row]) -> str:
    """The fleet as a terminal table; an image other than the inventory's is marked with '!'."""
    header = ["host", "instance", "unit", "health", "image", "running", "waiting", "kv cache", "compile cache", "watch"]
    body = []
    for r in rows:
        image = r.image if r.image == r.wanted_image or r.wanted_image == "-" else f"! {r.image} (wants {r.wanted_image})"
        state = r.state + (" (rolling)" if r.rolling else "") + (" (quarantined)" if r.quarantined is not None else "")
        health = r.health if r.pool is None else f"{r.health}, pool {r.pool}" + (f" ! {r.pool_drift}" if r.pool_drift else "")
        row = [r.host, r.instance, state, health, image, _num(r.running), _num(r.waiting), _num(r.kv_cache, percent=True)]
        watch = "-" if r.watch is None else r.watch + (f" ({r.watch_restarts} restarts)" if r.watch_restarts else "")
        body.append([*row, _size(r.compile_cache), watch])
    widths = [max(len(str(x)) for x in column) for column in zip(header, *body, strict=True)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *body]]
    errors = sorted(
        {f"{r.host}: {r.error}" for r in rows if r.error}
        | {f"{r.host}: {r.problem()}" for r in rows if r.watch in ("left-out", "restarting") or r.quarantined is not None}
    )
    return "\n".join([*lines, *errors])


def as_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) | {"ok": r.ok} for r in rows]
