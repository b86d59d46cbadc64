"""STAND-IN for AMD's device-metrics-exporter, for the simulated fleet only. It is not the exporter.

It reads the config file the exporter reads (/etc/metrics/config.json: ServerPort,
GPUConfig.Fields and Labels), and answers /metrics on ServerPort with one series
per configured field and GPU. Metric names are the field names in lower case, as
the exporter names them; the label names and the card values are those of the
captured MI300X scrape (tests/fixtures/device-metrics-exporter-*). It needs
/dev/kfd, like the exporter, and one GPU per /dev/dri/renderD* node.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from glob import glob
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

CONFIG = "/etc/metrics/config.json"
# Values of the captured MI300X OAM scrape (first line of the fixture).
CARD = {
    "card_model": "102-G30211-0C",
    "card_series": "AMD Instinct MI300X OAM",
    "card_vendor": "AMD",
    "driver_version": "6.12.12",
    "vbios_version": "022.040.003.043.000001",
    "gpu_compute_partition_type": "spx",
    "gpu_memory_partition_type": "nps1",
    "gpu_partition_id": "0",
}
VALUES = {"gpu_total_vram": 196592.0, "gpu_junction_temperature": 45.0, "gpu_hbm_temperature": 40.0, "gpu_package_power": 140.0}
# Not in the capture: a healthy Gen5 x16 link (PCIe speed in GT/s, as amd-smi gives it) and a cool HBM.
VALUES |= {"pcie_speed": 32.0, "pcie_max_speed": 32.0, "gpu_memory_temperature": 40.0}


def labels(gpu: int, names: list[str]) -> str:
    values = {
        **CARD,
        "gpu_id": str(gpu),
        "gpu_uuid": f"{gpu:02x}ff74a1-0000-1000-80e0-c6d49f5b0d86",
        "serial_number": f"6924090054{gpu:02d}",
        "hostname": socket.gethostname(),
    }
    chosen = [n.lower() for n in names if n.lower() in values]
    return ",".join(f'{n}="{values[n]}"' for n in chosen)


class Handler(BaseHTTPRequestHandler):
    config: ClassVar[dict[str, Any]] = {}

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_response(404)
            self.end_headers()
            return
        gpu_config = self.config.get("GPUConfig", {})
        gpus = len(glob("/dev/dri/renderD*"))
        lines = []
        for field in gpu_config.get("Fields", []):
            name = field.lower()
            lines.append(f"# TYPE {name} gauge")
            for gpu in range(gpus):
                lines.append(f"{name}{{{labels(gpu, gpu_config.get('Labels', []))}}} {VALUES.get(name, 0.0)}")
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    if not os.path.exists("/dev/kfd"):
        sys.exit("stand-in exporter: /dev/kfd is not in the container")
    with open(CONFIG) as handle:
        Handler.config = json.load(handle)
    port = int(Handler.config.get("ServerPort", 5000))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # docker stop: a clean exit, as the exporter's own
    print(f"stand-in device-metrics-exporter on :{port}", flush=True)
    ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
