"""The watch of one serving host (managed by instinct-fleet): hung instances out of rotation, restarted, put back.

Usage: watch.py CONFIG_JSON

Every ``interval`` seconds it reads each local instance's /metrics and applies the
progress rule (liveness.py beside it, the package's own module): requests running
or waiting, and no engine step for ``stall`` seconds, is a stall. A stalled
instance is taken out of every router pool that lists it, its unit restarted
(systemd's stop drains it as a roll's does), and put back once its gate passes:
/health, its model listed, one token generated, and the step counters advanced.
At most ``max_restarts`` restarts in ``window`` seconds; a stall after that leaves
the instance out (still running, for its journal), said in the journal at error
level, in /state and in /metrics, until an operator re-admits it by removing its
``<unit>.out`` file in ``state_dir`` (or a roll restarts it with new serving files).

While a roll batch runs on the host (its marker, for at most ``roll_pause``
seconds: a failed roll leaves it behind) or a tune trial holds its lock, the watch only reads: the roll and tune own the units then. An instance whose
/metrics does not answer is down or starting: systemd and the roll own that.

Between deploys it also reads the GPUs' evidence every ``gpu.interval`` seconds, with
the commands and the per-GPU rules of the deploy's own (evidence.py beside it, the
package's module): an error on a GPU an instance runs on (at the host's severity,
``gpu_health_levels``) quarantines that instance at once: out of its router pools,
stopped through its drain, its ``<unit>.out`` record in state "quarantined". It stays
so: the next deploy reads the same evidence, holds it out while the error is there,
and starts it behind its gate once it has cleared (its budget of re-admissions is the
deploy's), as ``instinct-fleet admit`` does.

State lives in ``state_dir``, one ``<unit>.out`` (JSON: state "restarting" or
"left-out", since, reason) while an instance is out, and ``<unit>.restarts``
(the times of its restarts): a restarted watch, and the roll's join and the
router hosts' pool sync, read it (GET /state on ``listen_port``).
"""

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evidence  # the package's instinct_fleet/converge/evidence.py, installed beside this file
import liveness  # the package's instinct_fleet/model/liveness.py, installed beside this file

with open(sys.argv[1]) as handle:
    CONFIG = json.load(handle)
NAMES = liveness.Series(tuple(CONFIG["series"]["steps"]), tuple(CONFIG["series"]["busy"]))
LOCK = threading.Lock()
OUT = ("restarting", "left-out", "quarantined")  # the states in which the instance is out of its pools
VIEW = {}  # unit -> what /state and /metrics show
GPUS = {}  # GPU index -> its errors at the last reading of the evidence (the gpu thread's; empty before the first)
EVENTS = {"rolls": 0, "canaries": 0, "rollbacks": 0}  # what the roll's marker showed since this watch started
MARKER_POLL = 0.25  # seconds between two readings of the roll's marker


def log(message, error=False):
    # systemd reads a leading <3> as the error priority (SyslogLevelPrefix): `journalctl -p err` finds them.
    print(("<3>" if error else "") + message, flush=True)


def path(unit, kind):
    return os.path.join(CONFIG["state_dir"], f"{unit}.{kind}")


def read_json(name, default):
    try:
        with open(name) as handle:
            return json.load(handle)
    except (OSError, ValueError):  # absent (FileNotFoundError is one), or cut short
        return default


def write_json(name, value):
    temporary = name + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(value, handle, sort_keys=True)
    os.replace(temporary, name)


def paused():
    """A roll batch or a tune trial owns the units now."""
    try:  # a failed roll leaves its marker behind: older than the longest batch, it no longer pauses the watch
        if time.time() - os.stat(CONFIG["roll_marker"]).st_mtime < CONFIG["roll_pause"]:
            return "a roll batch runs on this host"
    except FileNotFoundError:
        pass
    try:
        fd = os.open(CONFIG["tune_lock"], os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return "a tune trial runs on this host"
    finally:
        os.close(fd)
    return None


def http(method, url, body=None, key=None, timeout=10):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return reply.status, reply.read().decode()


def api_key(unit):
    """The key the instance serves with, read in its own container (paths.API_KEY_IN_CONTAINER): the watch follows the
    unit that runs, a rolled-back generation's too, and no key path of the inventory's. None without a key, or while
    the container is not running (then /v1 refuses, and the gate says "starting")."""
    try:
        result = subprocess.run(
            [CONFIG["docker"], "exec", unit, "cat", CONFIG["key_in_container"]], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return (result.stdout.splitlines() or [""])[0].strip() or None


def read_gpus():
    """Each GPU's errors at the host's thresholds and levels (evidence.read_here); None when amd-smi lists no GPU."""
    found = evidence.read_here(CONFIG["gpu"]["amd_smi"])
    if not found.gpus:
        return None
    return evidence.errors(found, evidence.Thresholds(**CONFIG["gpu"]["thresholds"]), CONFIG["gpu"]["levels"])


def refresh_gpus():
    """Read the GPUs' evidence now and make it the watch's, saying in the journal what appeared and what cleared; a
    reading that lists no GPU keeps the last one's verdict (None)."""
    found = read_gpus()
    if found is None:
        return None
    with LOCK:
        before = dict(GPUS)
        GPUS.clear()
        GPUS.update(found)
    for index in sorted(set(found) - set(before)):
        log(f"GPU {index}: {'; '.join(found[index])}", True)
    for index in sorted(set(before) - set(found)):
        log(f"GPU {index}: its evidence has cleared")
    return found


def watch_gpus():
    """Read the GPUs' evidence every gpu.interval seconds."""
    while True:
        refresh_gpus()
        time.sleep(CONFIG["gpu"]["interval"])


def watch_rolls():
    """Count the roll's events on this host from its marker: a batch (a new first line, ``roll batch N started T``),
    its canary (a ``canary`` line) and its rollback (``rolled back to generation N``, which the restore adds before it
    removes the marker, seconds later: hence a reading every MARKER_POLL seconds, one small file's). A tune trial's
    marker is none of these."""
    batch, counted = None, set()
    while True:
        try:
            with open(CONFIG["roll_marker"]) as handle:
                lines = handle.read().splitlines()
        except OSError:
            lines = []
        if lines and lines[0].startswith("roll batch"):
            if lines[0] != batch:
                batch, counted = lines[0], set()
            shown = {"rolls": True, "canaries": "canary" in lines, "rollbacks": any(x.startswith("rolled back") for x in lines)}
            for kind in sorted(k for k, seen in shown.items() if seen and k not in counted):
                counted.add(kind)
                with LOCK:
                    EVENTS[kind] += 1
        time.sleep(MARKER_POLL)


class Instance:
    def __init__(self, spec):
        self.spec = spec
        self.unit = spec["unit"]
        self.base = f"http://127.0.0.1:{spec['port']}"
        self.progress = liveness.Progress()
        self.restarts_total = 0
        self.left = False  # left out at the last look: a record gone since is an operator's re-admission

    def recent(self):
        """The times of this instance's restarts within the budget's window."""
        return [t for t in read_json(path(self.unit, "restarts"), []) if time.time() - t < CONFIG["window"]]

    def show(self, state, stalled=0.0, reason=""):
        recent = self.recent()
        with LOCK:
            VIEW[self.unit] = {
                "port": self.spec["port"],
                "state": state,
                "stalled_seconds": round(stalled, 1),
                "restarts": len(recent),
                "restarts_total": self.restarts_total,
                "reason": reason,
            }

    def gpu_errors(self):
        """The errors of the GPUs this instance runs on, at the last reading."""
        with LOCK:
            return [why for index in self.spec["gpus"] for why in GPUS.get(index, ())]

    def confirmed(self):
        """Its GPUs' errors in a reading taken now, before the watch acts on them: the last reading may predate a reset
        that a deploy has since read, and re-admitted the instance on. No reading now: nothing to act on."""
        if refresh_gpus() is None:
            return []
        return self.gpu_errors()

    def quarantined_now(self):
        """Quarantine it when its GPUs show an error that a fresh reading confirms and no roll or tune owns the unit."""
        if self.gpu_errors() and paused() is None and (errors := self.confirmed()):
            self.quarantine(errors)
            return True
        return False

    def quarantine(self, errors):
        """Out of every pool, then stopped (systemd's stop drains it, as the deploy's quarantine does), and recorded."""
        reason = "; ".join(errors)
        write_json(path(self.unit, "out"), {"state": "quarantined", "since": time.time(), "reason": reason})
        self.show("quarantined", reason=reason)
        out = self.routers("remove")
        log(
            f"{self.unit} is quarantined: {reason}. Out of its router pools{'' if out else ' (not every router answered: retried)'}, "
            "stopping it; the next deploy holds it out while the error is there and re-admits it once the evidence clears",
            True,
        )
        self.progress.reset()
        self.systemctl("stop")

    def systemctl(self, verb):
        """systemctl VERB on the unit (its stop drains it); a failure is said in the journal, and the watch goes on."""
        try:
            result = subprocess.run(
                ["systemctl", verb, self.unit], capture_output=True, text=True, timeout=self.spec["start_seconds"] + 600
            )
            failed = result.stderr.strip() if result.returncode else None
        except (OSError, subprocess.TimeoutExpired) as error:
            failed = str(error)
        if failed is not None:
            log(f"{self.unit}: systemctl {verb} failed: {failed}", True)

    def reading(self):
        try:
            return liveness.sample(http("GET", self.base + "/metrics", timeout=5)[1], NAMES)
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def routers(self, verb):
        """Every router pool that lists this instance; the worker is out (or in) of each when it returns True."""
        done = True
        for member in self.spec["routers"]:
            target = f"{member['api']}/{verb}_worker?url={urllib.parse.quote(member['url'], safe='')}"
            try:
                http("POST", target, timeout=30)
            except urllib.error.HTTPError as error:
                text = error.read().decode(errors="replace")
                if not (verb == "add" and "already exists" in text) and not (verb == "remove" and error.code in (400, 404)):
                    log(
                        f"{self.unit}: {verb} {member['url']} at the router on {member['router']} answered {error.code}: {text[:200]}", True
                    )
                    done = False
            except (OSError, urllib.error.URLError) as error:
                log(
                    f"{self.unit}: the router on {member['router']} ({member['api']}) cannot be reached to {verb} {member['url']}: {error}",
                    True,
                )
                done = False
        return done

    def gate(self):
        """Healthy as the deploy's gate means it, and the engine stepped for it: "passed"; "starting" while it loads
        (/health does not answer 200 before the engine is up); "stalled" when /health answers 200 but the one-token
        completion gets no answer within the stall window, or its answer moved no step counter."""
        try:
            if http("GET", self.base + "/health", timeout=5)[0] != 200:
                return "starting"
            key = api_key(self.unit)
            if self.spec["served"] not in http("GET", self.base + "/v1/models", key=key, timeout=5)[1]:
                return "starting"
        except (OSError, urllib.error.URLError, ValueError):
            return "starting"
        if not self.spec["generates"]:
            return "passed"
        before = self.reading()
        body = json.dumps({"model": self.spec["served"], "prompt": "Hello", "max_tokens": 1}).encode()
        try:
            answer = http("POST", self.base + "/v1/completions", body, key, timeout=CONFIG["stall"])[1]
        except TimeoutError:
            return "stalled"
        except urllib.error.URLError as error:
            return "stalled" if isinstance(error.reason, TimeoutError) else "starting"
        except (OSError, ValueError):
            return "starting"
        after = self.reading()
        if '"choices"' not in answer or before is None or after is None:
            return "starting"
        return "passed" if after.steps > before.steps else "stalled"

    def leave_out(self, reason, restarts):
        write_json(path(self.unit, "out"), {"state": "left-out", "since": time.time(), "reason": reason})
        self.routers("remove")
        log(
            f"{self.unit} is left out of its router pools: {reason}, after {len(restarts)} restarts in "
            f"{CONFIG['window']} s (watch_max_restarts). It keeps running for its journal; re-admit it with "
            f"`rm {path(self.unit, 'out')}` once its cause is fixed",
            True,
        )
        self.show("left-out", reason=reason)

    def restart(self, reason):
        restarts = self.recent()
        if len(restarts) >= CONFIG["max_restarts"]:
            self.leave_out(reason, restarts)
            return
        write_json(path(self.unit, "out"), {"state": "restarting", "since": time.time(), "reason": reason})
        self.show("restarting", reason=reason)
        out = self.routers("remove")
        log(f"{self.unit}: {reason}; out of its router pools{'' if out else ' (not every router answered: retried)'}, restarting it", True)
        write_json(path(self.unit, "restarts"), [*restarts, time.time()])
        self.restarts_total += 1
        self.systemctl("restart")
        self.progress.reset()
        self.admit()

    def admit(self):
        """Gate the instance, then put it back into its pools; a gate that stalls, or does not pass in time, is a stall."""
        deadline = time.monotonic() + self.spec["start_seconds"]
        while time.monotonic() < deadline:
            record = read_json(path(self.unit, "out"), None)
            if record is None or record.get("state") not in ("restarting", "admitting"):  # a roll's join took it meanwhile
                return
            if self.quarantined_now():
                return
            if paused() is None:
                verdict = self.gate()
                if verdict == "stalled":
                    self.restart(f"its gate's one-token completion made no engine step within {CONFIG['stall']} s")
                    return
                if verdict == "passed" and self.routers("add"):
                    os.unlink(path(self.unit, "out"))
                    log(f"{self.unit}: its gate passed after the restart; back in its router pools")
                    self.show("in")
                    return
            self.routers("remove")  # a pool sync or a router restart may have added it meanwhile
            time.sleep(CONFIG["interval"])
        self.restart(f"its gate did not pass within {self.spec['start_seconds']} s of the restart")

    def tick(self):
        held = read_json(CONFIG["quarantine"], {}).get("units", {}).get(self.unit)
        if held:  # the deploy's GPU health verdict holds it out, stopped; the deploy re-admits it when the evidence clears
            self.progress.reset()
            self.show("quarantined", reason="; ".join(held))
            return
        record = read_json(path(self.unit, "out"), None)
        if record is not None and record.get("state") == "quarantined":  # until a deploy starts it again (and removes it)
            self.progress.reset()
            self.routers("remove")  # kept out, whoever added it
            cleared = "" if self.gpu_errors() else " (its evidence has cleared: the next deploy, or `instinct-fleet admit`, re-admits it)"
            self.show("quarantined", reason=record.get("reason", "") + cleared)
            return
        if self.quarantined_now():
            return
        if record is not None and record.get("state") == "left-out":
            self.left = True
            self.routers("remove")  # kept out, whoever added it
            self.show("left-out", reason=record.get("reason", ""))
            return
        if record is None and self.left:
            self.left = False
            log(f"{self.unit}: re-admitted by an operator (its .out file removed): gating it")
            write_json(path(self.unit, "out"), {"state": "admitting", "since": time.time(), "reason": "re-admitted by an operator"})
            record = {"state": "admitting"}
        why = paused()
        if why is not None:
            self.progress.reset()
            self.show("paused", reason=why)
            return
        if record is not None:  # restarting (this watch stopped during a restart) or admitting
            self.show("restarting", reason=record.get("reason", ""))
            self.admit()
            return
        reading = self.reading()
        if reading is None:
            self.progress.reset()
            self.show("down", reason="its /metrics does not answer: stopped or starting")
            return
        seconds = self.progress.observe(time.monotonic(), reading)
        if liveness.stalled(seconds, CONFIG["stall"]):
            self.restart(f"no engine step for {seconds:.0f} s with {reading.busy:g} requests running or waiting")
        else:
            self.show("in", stalled=seconds)

    def run(self):
        self.show("in")
        while True:
            self.tick()
            time.sleep(CONFIG["interval"])


# The watch's series: name, type and help, per instance (labelled with its unit and port) and then the host's.
INSTANCE_SERIES = (
    ("out", "gauge", "Whether the watch holds the instance out of its router pools (1), for a restart or left out."),
    ("left_out", "gauge", "Whether the instance is left out after watch_max_restarts restarts in watch_restart_window."),
    ("quarantined", "gauge", "Whether the instance is quarantined on its GPUs' evidence (by the watch or the deploy)."),
    ("stalled_seconds", "gauge", "Seconds the instance has been busy without an engine step."),
    ("restarts", "gauge", "Restarts the watch made within watch_restart_window."),
    ("restarts_total", "counter", "Restarts the watch made since it started."),
)
HOST_SERIES = (  # what the roll's marker showed on this host since the watch started: the boards' annotations
    ("rolls_total", "counter", "Roll batches on this host."),
    ("canaries_total", "counter", "Roll batches that measured a canary on this host."),
    ("rollbacks_total", "counter", "Roll batches that rolled this host back."),
)


def metrics_text():
    def described(name, kind, text):
        return [f"# HELP instinct_fleet_watch_{name} {text}", f"# TYPE instinct_fleet_watch_{name} {kind}"]

    lines = [line for series in INSTANCE_SERIES for line in described(*series)]
    with LOCK:
        view, events = dict(VIEW), dict(EVENTS)
    for unit, seen in sorted(view.items()):
        labels = f'unit="{unit}",port="{seen["port"]}"'
        values = {
            "out": int(seen["state"] in OUT),
            "left_out": int(seen["state"] == "left-out"),
            "quarantined": int(seen["state"] == "quarantined"),
            **{key: seen[key] for key in ("stalled_seconds", "restarts", "restarts_total")},
        }
        lines += [f"instinct_fleet_watch_{name}{{{labels}}} {values[name]}" for name, _, _ in INSTANCE_SERIES]
    for name, kind, text in HOST_SERIES:
        lines += [*described(name, kind, text), f"instinct_fleet_watch_{name} {events[name.removesuffix('_total')]}"]
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):
        pass

    def do_GET(self):
        if self.path == "/state":
            with LOCK:
                view = dict(VIEW)
            out = sorted(s["port"] for s in view.values() if s["state"] in OUT)
            body, kind = json.dumps({"instances": view, "out": out}, sort_keys=True), "application/json"
        elif self.path == "/metrics":
            body, kind = metrics_text(), "text/plain; version=0.0.4"
        else:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def died(args):
    """A watch thread that dies is a bug: end the process, so that systemd restarts it (Restart=always) and says so."""
    log(f"the watch of {args.thread.name if args.thread else '?'} failed: {args.exc_type.__name__}: {args.exc_value}", True)
    sys.stdout.flush()
    os._exit(1)


def main():
    threading.excepthook = died
    os.makedirs(CONFIG["state_dir"], exist_ok=True)
    watched = [Instance(spec) for spec in CONFIG["instances"]]
    if CONFIG["gpu"] is not None:
        threading.Thread(target=watch_gpus, name="gpu evidence", daemon=True).start()
    threading.Thread(target=watch_rolls, name="roll events", daemon=True).start()
    for instance in watched:
        threading.Thread(target=instance.run, name=instance.unit, daemon=True).start()
    names = ", ".join(f"{i.unit} (:{i.spec['port']})" for i in watched) or "no instance"
    gpus = f"; the GPUs' evidence read every {CONFIG['gpu']['interval']} s" if CONFIG["gpu"] is not None else ""
    log(f"watching {names}: a stall is {CONFIG['stall']} s busy without an engine step, read every {CONFIG['interval']} s{gpus}")
    server = ThreadingHTTPServer(("", CONFIG["listen_port"]), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
