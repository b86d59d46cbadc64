"""The router's front (managed by instinct-fleet): clients reach the router's OpenAI routes here, and nothing else.

Usage: front.py LISTEN_PORT ROUTER_PORT -- COMMAND...

Why: vllm-router serves its worker API (/add_worker, /remove_worker, /list_workers, /flush_cache, /workers, ...) on
the port its clients use, without any key, so whoever could send it a completion could also add their own worker
and receive every client's prompt and API key. This process starts the router (COMMAND, listening on ROUTER_PORT,
which the firewall keeps to loopback, the serving hosts of its pool and router_admin_from) and listens for clients
on LISTEN_PORT, where it passes a request on only when its method and path are one of ROUTES; any other request
gets a 404 from the front itself and never reaches the router.

One request per connection: a request is passed on with ``Connection: close`` and a body of exactly its
Content-Length (a chunked body is refused with 411, as is a request with two lengths), so that no second request
can ride on a connection after a checked one. A client that goes away ends its request at the router too.

The front and the router live and die together: when the router exits, the front exits with its status and
systemd restarts the unit; SIGTERM and SIGINT are passed on to the router. Standard library only.
"""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys

# The routes of vllm-router's clients: OpenAI's API as the router serves it, and its health.
ROUTES = {
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/rerank"),
}
PATH = re.compile(r"/[A-Za-z0-9._~/-]*")  # no percent-encoding, no '..' segment that a router could read otherwise
TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header name (RFC 9110)
HOP = {b"connection", b"keep-alive", b"proxy-connection", b"te", b"upgrade", b"trailer", b"transfer-encoding"}
HEAD_LIMIT = 64 * 1024
HEAD_SECONDS = 30
CHUNK = 64 * 1024


class Refused(Exception):
    """A request the front answers itself: its status, reason and message."""

    def __init__(self, status, reason, message):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def parse(head):
    """(method, target, headers to pass on, content length, whether the client waits for 100 Continue) of a request
    head without its final CRLF CRLF. The front answers 100 Continue itself: it reads the body before the router's
    answer."""
    lines = head.split(b"\r\n")
    try:
        method, target, version = lines[0].decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "Bad Request", "malformed request line") from None
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise Refused(400, "Bad Request", f"unsupported version {version}")
    path = target.split("?", 1)[0]
    if not PATH.fullmatch(path) or "/../" in path + "/" or "//" in path or (method, path) not in ROUTES:
        raise Refused(404, "Not Found", f"{method} {path} is not a route of this router's clients")
    kept, length, expect = [], None, False
    for raw in lines[1:]:
        name, colon, value = raw.partition(b":")
        if not colon or not TOKEN.fullmatch(name) or b"\n" in raw or b"\r" in raw:
            raise Refused(400, "Bad Request", "malformed header")
        lower = name.lower()
        if lower == b"transfer-encoding":
            raise Refused(411, "Length Required", "send the body with a Content-Length")
        if lower == b"content-length":
            text = value.strip()
            if length is not None or not text.isdigit():
                raise Refused(400, "Bad Request", "one Content-Length, a number")
            length = int(text)
        if lower == b"expect":
            expect = value.strip().lower() == b"100-continue"
        elif lower not in HOP:
            kept.append(raw)
    if method == "POST" and length is None:
        raise Refused(411, "Length Required", "send the body with a Content-Length")
    return method, target, kept, length or 0, expect


async def answer(writer, refused):
    body = json.dumps({"error": {"message": refused.message, "type": refused.reason, "code": refused.status}}).encode()
    head = f"HTTP/1.1 {refused.status} {refused.reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
    await writer.drain()


async def pipe(reader, writer, left=None):
    """Copy ``left`` bytes (None: until the end) from reader to writer."""
    while left is None or left > 0:
        data = await reader.read(CHUNK if left is None else min(CHUNK, left))
        if not data:
            if left:
                raise ConnectionError("the client closed before the end of its body")
            return
        writer.write(data)
        await writer.drain()
        if left is not None:
            left -= len(data)


async def handle(reader, writer, router_port):
    upstream = None
    try:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
            method, target, headers, length, expect = parse(head[:-4])
        except Refused as refused:
            await answer(writer, refused)
            return
        except asyncio.LimitOverrunError:
            await answer(writer, Refused(431, "Request Header Fields Too Large", "request head over 64 KiB"))
            return
        try:
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", router_port)
        except OSError:
            await answer(writer, Refused(502, "Bad Gateway", "the router is not listening (starting or stopped)"))
            return
        if expect:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        upstream.write(f"{method} {target} HTTP/1.1\r\n".encode() + b"".join(h + b"\r\n" for h in headers) + b"Connection: close\r\n\r\n")
        await pipe(reader, upstream, length)
        # The answer, until the router closes; the client closing first ends the request at the router too.
        relay = asyncio.ensure_future(pipe(up_reader, writer))
        gone = asyncio.ensure_future(reader.read(CHUNK))  # after the body: only its end (or bytes, dropped)
        while not relay.done():
            await asyncio.wait({relay, gone}, return_when=asyncio.FIRST_COMPLETED)
            if gone.done() and not relay.done():
                if not gone.result():
                    relay.cancel()
                    break
                gone = asyncio.ensure_future(reader.read(CHUNK))
        gone.cancel()
    except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
        pass
    finally:
        for stream in (writer, upstream):
            if stream is not None:
                stream.close()


def main():
    listen_port, router_port, dashes, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    if dashes != "--" or not command:
        sys.exit("usage: front.py LISTEN_PORT ROUTER_PORT -- COMMAND...")
    child = subprocess.Popen(command)
    loop = asyncio.new_event_loop()
    stopping = []

    def stop(number):
        stopping.append(number)
        child.send_signal(number)

    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop, number)
    server = loop.run_until_complete(
        asyncio.start_server(lambda r, w: handle(r, w, router_port), "0.0.0.0", listen_port, limit=HEAD_LIMIT, reuse_address=True)
    )
    code = loop.run_until_complete(loop.run_in_executor(None, child.wait))
    server.close()
    if stopping:  # stopped: end as the signal ends a process, which systemd counts as a clean stop
        signal.signal(stopping[0], signal.SIG_DFL)
        os.kill(os.getpid(), stopping[0])
    sys.exit(code if code > 0 else 128 - code if code < 0 else 1)  # the router ended by itself: the unit restarts


if __name__ == "__main__":
    main()
