"""A Prometheus HTTP API for tests, run as its own process (the CLI's gevent must not share threads with it):
``python promserver.py LOG [refuse]`` prints its port, answers /api/v1/query_range with two series per query, their
values a function of the query (:func:`answer`), appends each query's parameters to LOG (JSON lines), and with
``refuse`` answers every query 400 as Prometheus does a query it cannot parse."""

from __future__ import annotations

import json
import sys
import urllib.parse
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def answer(params: dict[str, str]) -> list[dict[str, Any]]:
    seed = zlib.crc32(params["query"].encode()) % 1000
    start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
    times = [start + i * step for i in range(int((end - start) / step) + 1)][:5]
    return [
        {
            "metric": {"model": f"m{k}", "host": f"h{k}", "instance": f"i{k}"},
            "values": [[t, str(seed + k + i)] for i, t in enumerate(times)],
        }
        for k in (1, 2)
    ]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        params = {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).items()}
        with open(sys.argv[1], "a") as log:
            log.write(json.dumps(params) + "\n")
        if sys.argv[2:] == ["refuse"]:
            body, code = {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}, 400
        else:
            body, code = {"status": "success", "data": {"resultType": "matrix", "result": answer(params)}}, 200
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
