"""Converge a running router's pool to its worker file (managed by instinct-fleet).

Usage: sync.py PORT WORKERS_FILE WATCH_FILE [--joining URL]... [--wait] [--check]

Through the router's worker API on 127.0.0.1:PORT: a worker the file no longer
lists is removed; a listed worker that is missing is added only if it answers
/health now (one that does not is added by its own host's roll, after its health
gate) and its host's watch does not hold it out (WATCH_FILE: one "URL STATE_URL"
line per worker whose host runs the watch; a hung instance answers /health, and
the watch took it out). A worker given with --joining (its unit was not running
when the deploy read its host: whatever answers its port is not ours yet) is
never added, and is removed when the router holds it; its own host's roll adds
it after its health gate. With --wait, a router that was just (re)started is
waited for (60 s) before it is read. With --check it changes nothing and prints one line per difference, exit 0
when there is none, 1 otherwise. A router that is not running reads the file
when it starts.
"""

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

port, workers_file, watch_file = sys.argv[1], sys.argv[2], sys.argv[3]
rest = sys.argv[4:]
check = "--check" in rest
wait = "--wait" in rest
joining = {rest[i + 1] for i, word in enumerate(rest[:-1]) if word == "--joining"}
base = f"http://127.0.0.1:{port}"


def call(method, url, timeout):
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def answers(url):
    try:
        call("GET", url + "/health", 3)
        return True
    except (OSError, urllib.error.URLError):
        return False


def held_out(url):
    """Whether the worker's watch holds it out (restarting it, or left out); a host without a watch holds nothing."""
    state = watches.get(url)
    if state is None:
        return False
    try:
        out = json.loads(call("GET", state, 5))["out"]
    except (OSError, urllib.error.URLError, ValueError, KeyError):
        return False  # no watch answers there: nothing to respect (its /health says whether the worker is up)
    return int(url.rsplit(":", 1)[1].split("/")[0]) in out


with open(workers_file) as handle:
    want = [line.strip() for line in handle if line.strip()]
try:
    with open(watch_file) as handle:
        watches = dict(line.split() for line in handle if line.strip())
except FileNotFoundError:  # written after this script, in the same stage, on a router host upgraded from before the watch
    watches = {}
deadline = time.monotonic() + (60 if wait and not check else 0)
while True:
    try:
        live = json.loads(call("GET", base + "/list_workers", 10))["urls"]
        break
    except urllib.error.URLError as error:
        if not isinstance(error.reason, ConnectionRefusedError):
            raise
        if time.monotonic() >= deadline:
            print(f"router on port {port} is not running: it starts with {workers_file}")
            sys.exit(0)
        time.sleep(1)
changes = [("remove", url) for url in live if url not in want or url in joining]
changes += [("add", url) for url in want if url not in live and url not in joining and answers(url) and not held_out(url)]
for verb, url in changes:
    print(f"{verb} {url}")
    if not check:
        call("POST", f"{base}/{verb}_worker?url={urllib.parse.quote(url, safe='')}", 60)
sys.exit(1 if check and changes else 0)
