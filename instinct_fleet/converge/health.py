"""Health of one vLLM instance: the one definition of healthy, the wait loop that runs on the host, and its verdict.

Healthy (:func:`serving`) means ``/health`` answers 200, ``/v1/models`` lists
the served model, and the model generates: a completion of one token answers
(a pooling model, which generates nothing, stops at ``/v1/models``). ``/health``
answers before the first forward pass, so only a generated token shows a model
that crashes at its first request (AITER kernels faulting on gfx942, vllm#34641).
The preflight fact, the health gate, ``status``, ``bench`` (through status) and
the verify module all run that one check.

The loop runs on the host (curl against 127.0.0.1) so that it needs no open
port towards the control machine. It stops early when the unit fails or
restarts (or waits to restart: systemd's ``auto-restart`` state, RestartSec before the restart itself),
so a bad flag shows its journal at once instead of after the timeout.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from instinct_fleet.model import paths

MARK = "@@health:"
POLL_SECONDS = 2


# The key's place in a curl config, where printf puts the key the shell read from vllm_api_key_path.
_KEY = "\x00key\x00"
# What serving's curl writes after each answer: its HTTP code, on a line of its own (a JSON body never holds a raw newline).
ANSWERED = "@@answered:"


@dataclass(frozen=True)
class Request:
    """One request of :func:`curl_on_stdin`: ``body``, a POST of JSON; ``keyed``, a /v1 route (vLLM guards /v1 with
    the API key, not /health or /metrics); ``write_out``, what curl writes after the answer; ``discard``, no body."""

    url: str
    seconds: int
    body: str | None = None
    keyed: bool = True
    write_out: str | None = None
    discard: bool = False


def _config_value(text: str) -> str:
    """A value in curl's config syntax (``-K``): double-quoted, with backslash, quote and newline escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def curl_on_stdin(requests: list[Request], key_path: str | None, fail: bool = True) -> str:
    """One curl that makes ``requests`` in order, read as its config from stdin (``-K -``), stopping at the first
    that fails (``fail``: an HTTP error is a failure). With ``vllm_api_key_path``, the shell reads the key (its own
    ``read``, no process) and printf puts it in the config, so it never shows in a process list. The preflight
    fact, the health gate, ``status`` and the verify module share this."""
    lines: list[str] = []
    for request in requests:
        lines += ["next"] if lines else []
        lines += [f"url = {_config_value(request.url)}", f"max-time = {int(request.seconds)}", "silent", "show-error"]
        lines += ["fail"] if fail else []
        if request.write_out is not None:
            lines.append(f"write-out = {_config_value(request.write_out)}")
        if request.discard:
            lines.append('output = "/dev/null"')
        if request.keyed and key_path is not None:
            lines.append("header = " + _config_value("Authorization: Bearer " + _KEY))
        if request.body is not None:
            lines += ['header = "Content-Type: application/json"', f"data-binary = {_config_value(request.body)}"]
    config = "\n".join(lines) + "\n"
    # printf's format, on one line: its own escapes doubled, newlines as \n, and one %s where each copy of the key goes.
    fmt = config.replace("\\", "\\\\").replace("%", "%%").replace("\n", "\\n").replace(_KEY, "%s")
    feed = f"printf {shlex.quote(fmt)}"
    if key_path is not None:
        feed = f"{{ key=; read -r key 2>/dev/null <{shlex.quote(key_path)}; {feed}" + ' "$key"' * fmt.count("%s") + "; }"
    return f"{feed} | curl --fail-early -K -"


def v1_curl(url: str, key_path: str | None, timeout: int, body: str | None = None, show_code: bool = False) -> str:
    """``curl`` of one /v1 route on the host, the key sent as :func:`curl_on_stdin` sends it; ``show_code``: the
    answer whatever its HTTP code, followed by `` (HTTP <code>)``."""
    request = Request(url, timeout, body, write_out=" (HTTP %{http_code})" if show_code else None)
    return curl_on_stdin([request], key_path, fail=not show_code)


def completion(served: str) -> str:
    """The gate's request: one token, so that it costs a real instance next to nothing."""
    return json.dumps({"model": served, "prompt": "Hello", "max_tokens": 1})


def serving(port: int, served: str, key_path: str | None, timeout: int = 3, generates: bool = True) -> str:
    """Shell: exits 0 when the instance on ``port`` is healthy, as every part of this tool means it.

    One curl (:func:`curl_on_stdin`) asks /health, /v1/models and, for a model that generates, a one-token
    completion, stopping at the first that fails; awk reads the answers. Three curls and two greps per instance
    were the largest part of what the preflight fact cost a host on a no-op: starting curl, not the requests.
    """
    url = f"http://127.0.0.1:{int(port)}"

    def answered(name: str) -> str:
        return f"\n{ANSWERED}{name} %{{http_code}}\n"

    requests = [
        Request(f"{url}/health", timeout, keyed=False, write_out=answered("health"), discard=True),
        Request(f"{url}/v1/models", timeout, write_out=answered("models")),
    ]
    if generates:
        requests.append(Request(f"{url}/v1/completions", max(timeout, 10), completion(served), write_out=answered("choices")))
    check = (
        f'index($0, "{ANSWERED}") == 1 {{ split(substr($0, {len(ANSWERED) + 1}), a, " "); '
        'if (a[2] == 200 && (a[1] == "health" || (a[1] == "models" && index(body, ENVIRON["served"])) '
        '|| (a[1] == "choices" && index(body, "\\"choices\\"")))) ok++; body = ""; next } '
        f'{{ body = body $0 "\\n" }} END {{ exit (ok != {len(requests)}) }}'
    )
    return f"{curl_on_stdin(requests, key_path)} 2>/dev/null | served={shlex.quote(json.dumps(served))} awk {shlex.quote(check)}"


@dataclass(frozen=True)
class Health:
    code: str
    models: tuple[str, ...]
    state: str
    journal: tuple[str, ...]
    startup: tuple[str, ...] = ()  # healthy: "elapsed SECONDS", then this start's phase lines from the journal


@dataclass(frozen=True)
class Startup:
    """One start of a unit, from its journal: how long to healthy, and the phases vLLM logged on the way."""

    seconds: float | None  # from leaving inactive (ExecStartPre included) to the gate passing
    weights: float | None  # "Model loading took ... seconds"
    compile: float | None  # "torch.compile took ... s in total"
    graph_capture: float | None  # "Graph capturing finished in ... secs"
    cache: str | None  # "warm": every graph loaded from the compile cache; "cold": one compiled; None: not logged

    def describe(self) -> str:
        if self.seconds is None:
            return ""
        phases = [
            f"{name} {value:g} s"
            for name, value in (("weights", self.weights), ("compile", self.compile), ("graph capture", self.graph_capture))
            if value is not None
        ]
        return f"started in {self.seconds:g} s" + (f", {self.cache}" if self.cache else "") + (f" ({', '.join(phases)})" if phases else "")

    def as_json(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "weights": self.weights,
            "compile": self.compile,
            "graph_capture": self.graph_capture,
            "cache": self.cache,
        }


CONVERSION = re.compile(r"%(?:\.\d+)?[sdf]")


def _log_regex(fmt: str) -> re.Pattern[str]:
    """A logger format string as a regex: its text literal, %s any text, %d and %f a number (captured)."""
    out, pos = [], 0
    for m in CONVERSION.finditer(fmt):
        out.append(re.escape(fmt[pos : m.start()]))
        out.append(r".*?" if m.group().endswith("s") else r"([0-9.]+)")
        pos = m.end()
    out.append(re.escape(fmt[pos:]))
    return re.compile("".join(out))


def log_anchors(formats: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Fixed text that picks the phase lines out of a journal (grep -F): each format's longest literal run."""
    return tuple(sorted({max(CONVERSION.split(f), key=len).strip() for fs in formats.values() for f in fs}))


def startup_script(unit: str, anchors: tuple[str, ...]) -> str:
    """This start of ``unit`` so far, as a ``startup`` section: the seconds since it left inactive and the journal lines
    of its invocation that hold one of ``anchors`` (the gate's report when it passes, and the progress of a wait)."""
    u = shlex.quote(unit)
    grep = " ".join(f"-e {shlex.quote(a)}" for a in anchors)
    return f"echo '{MARK}startup'; awk -v t=\"$(systemctl show -p InactiveExitTimestampMonotonic --value {u})\" " + (
        "'{printf \"elapsed %.1f\\n\", $1 - t / 1000000}' /proc/uptime; "
        + (
            f'journalctl _SYSTEMD_INVOCATION_ID="$(systemctl show -p InvocationID --value {u})" -o cat --no-pager 2>/dev/null | grep -F {grep} | tail -n 40; '
            if anchors
            else ""
        )
    )


def phase_probe(read: Callable[[str], str | None], unit: str, formats: dict[str, tuple[str, ...]]) -> Callable[[], str | None] | None:
    """What a wait on ``unit``'s start asks its host (progress.Board): :func:`startup_script`'s output, through ``read``
    (a command's stdout on the host, None when it fails), as :func:`phase_now`. None without the formats to read it by."""
    if not formats:
        return None
    script = startup_script(unit, log_anchors(formats))

    def phase() -> str | None:
        text = read(script)
        return None if text is None else phase_now(text, formats)

    return phase


def phase_now(text: str, formats: dict[str, tuple[str, ...]]) -> str | None:
    """Where a start is, from :func:`startup_script`'s output: vLLM logs each phase when it ends, so the phase under
    way is the one after the last it logged. None when the output says nothing (the unit has not started)."""
    at = startup(parse(text).startup, formats)
    if at.seconds is None:
        return None
    if at.weights is None:
        return "loading the model"
    if at.compile is None and at.graph_capture is None:
        return f"compiling ({'cache hit' if at.cache == 'warm' else 'torch.compile'})" if at.cache else "compiling or capturing graphs"
    if at.graph_capture is None:
        return "capturing CUDA/HIP graphs"
    return "starting the API server"


def startup(lines: tuple[str, ...], formats: dict[str, tuple[str, ...]]) -> Startup:
    """The phases of one start from the gate's startup section (``formats``: the pinned vLLM's, knowledge.startup_log)."""
    seconds = next((float(line.split()[1]) for line in lines if line.startswith("elapsed ") and len(line.split()) == 2), None)
    found: dict[str, list[float]] = {}
    for phase, fmts in formats.items():
        patterns = [_log_regex(fmt) for fmt in fmts]
        for line in lines:
            for pattern in patterns:
                m = pattern.search(line)
                if m:
                    found.setdefault(phase, []).append(float(m.groups()[-1 if phase == "weights" else 0]) if m.groups() else 0.0)
    first = {phase: values[0] for phase, values in found.items()}
    cache = "cold" if "cache-miss" in found else "warm" if "cache-hit" in found else None
    return Startup(seconds, first.get("weights"), first.get("compile"), first.get("graph-capture"), cache)


# A listed model whose completion fails this many polls in a row fails the gate; a failure at the first
# forward pass that takes the server down shows at once as a crash loop, with the completion's answer.
COMPLETION_TRIES = 3


def wait_script(
    unit: str, port: int, served: str, timeout: int, key_path: str | None = None, generates: bool = True, anchors: tuple[str, ...] = ()
) -> str:
    """Poll until :func:`serving` passes; stop early when the unit fails or restarts, when /health answers
    but lists another model, or when the model is listed but its completions keep failing (the verdict says
    which, with the first failed completion's answer). Healthy, it also reports this start: the seconds since
    the unit left inactive, and the journal lines of this invocation that hold one of ``anchors``."""
    u = shlex.quote(unit)
    started = startup_script(unit, anchors)
    url = f"http://127.0.0.1:{int(port)}"
    # The same request as serving's, with the answer kept (and its HTTP code) for the verdict.
    sent = v1_curl(f"{url}/v1/completions", key_path, 10, completion(served), show_code=True)
    held = shlex.quote(paths.watch_out(unit))
    # A unit the watch holds out (a hung engine it gave up on) says so, with how to re-admit it.
    watched = (
        f'[ -e {held} ] && why="$why; the watch holds it out of its router pools ($(cat {held})): once fixed, rm {paths.watch_out(unit)}"; '
    )
    report = f"{watched}echo '{MARK}code'; echo \"$code\"; echo '{MARK}state'; echo \"$why\"; echo '{MARK}journal'; journalctl -u {u} -n 25 --no-pager -o cat 2>/dev/null; exit 0"
    answer = "${answer:+; its first completion failed: $answer}"
    return (
        f"end=$(( $(date +%s) + {int(timeout)} )); start=$(systemctl show -p NRestarts --value {u}); tries=0; answer=''; "
        "while :; do "
        f"if {serving(port, served, key_path, 10, generates)}; then echo '{MARK}code'; echo 200; echo '{MARK}state'; echo healthy; "
        f"echo '{MARK}models'; {v1_curl(f'{url}/v1/models', key_path, 10)} 2>/dev/null; echo; {started}exit 0; fi; "
        f"code=$(curl -s -o /dev/null -m 5 -w '%{{http_code}}' {url}/health); "
        f'if [ "$code" = 200 ] && {serving(port, served, key_path, 10, generates=False)}; then '
        f'tries=$((tries + 1)); [ -n "$answer" ] || answer="$({sent} 2>&1 | tr -d "\\n" | head -c 400)"; '
        f'if [ "$tries" -ge {COMPLETION_TRIES} ]; then why="its first completion failed: $answer"; {report}; fi; '
        f"elif [ \"$code\" = 200 ]; then echo '{MARK}code'; echo 200; echo '{MARK}state'; echo 'lists another model'; "
        f"echo '{MARK}models'; {v1_curl(f'{url}/v1/models', key_path, 10)} 2>/dev/null; echo; exit 0; fi; "
        f"active=$(systemctl show -p ActiveState --value {u}); now=$(systemctl show -p NRestarts --value {u}); "
        f"sub=$(systemctl show -p SubState --value {u}); "
        f'if [ "$active" = failed ] || [ "$active" = inactive ]; then why="unit is $active{answer}"; {report}; fi; '
        # Its process ended and systemd waits RestartSec to start it again: a crash loop, known now rather than at the restart.
        f'if [ "$sub" = auto-restart ]; then why="unit exited and waits to restart (crash loop){answer}"; {report}; fi; '
        f'if [ "$now" != "$start" ]; then why="unit restarted while starting (crash loop){answer}"; {report}; fi; '
        f'if [ "$(date +%s)" -ge "$end" ]; then why="no answer within {int(timeout)}s (health_timeout){answer}"; {report}; fi; '
        f"sleep {POLL_SECONDS}; done"
    )


def parse(text: str) -> Health:
    parts: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(MARK):
            current = line[len(MARK) :]
            parts[current] = []
        elif current is not None:
            parts[current].append(line)
    models: tuple[str, ...] = ()
    try:
        listing = json.loads("\n".join(parts.get("models", [])) or "{}")
        models = tuple(str(card.get("id")) for card in listing.get("data", []) if isinstance(card, dict))
    except (json.JSONDecodeError, AttributeError):
        models = ()
    return Health(
        code="\n".join(parts.get("code", [])).strip(),
        models=models,
        state="\n".join(parts.get("state", [])).strip(),
        journal=tuple(parts.get("journal", [])),
        startup=tuple(parts.get("startup", [])),
    )


def verdict(unit: str, port: int, served_model: str, result: Health) -> str | None:
    """None when healthy and serving the model; otherwise what is wrong and where to look."""
    if result.state == "healthy" and served_model in result.models:
        return None
    if result.state in ("healthy", "lists another model"):
        return f"{unit}: /health answers on :{port} but /v1/models lists {list(result.models)}, not {served_model!r}"
    tail = "\n    ".join(result.journal[-12:]) or "(no journal lines)"
    return f"{unit}: not healthy on :{port}: {result.state}; last journal lines (journalctl -u {unit}):\n    {tail}"
