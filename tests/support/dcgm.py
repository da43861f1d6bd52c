"""A stand-in dcgm-exporter: a loopback HTTP server with dcgm-exporter's XID gauge and labels, for a real Prometheus.

``codes`` maps (node, gpu) to the XID the GPU last reported; change it and the
next scrape sees it. ``node_label`` is dcgm-exporter's label for the node:
``Hostname`` up to release 4.5.3-4.8.2, ``hostname`` after it
(NVIDIA/dcgm-exporter#655).
"""

from __future__ import annotations

import http.server
import threading

from fsdp_api.ports import free_port

LINE = 'DCGM_FI_DEV_XID_ERRORS{{gpu="{gpu}",UUID="GPU-{gpu}",modelName="H100",{label}="{node}"}} {code}\n'


class StandInExporter:
    def __init__(self, codes: dict[tuple[str, int], int], node_label: str = "Hostname") -> None:
        self.codes = codes
        self.labels: dict[str, str] = {}  # node -> its label, where it differs from node_label
        self.node_label = node_label
        self.port = free_port()
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n" + "".join(
                    LINE.format(gpu=gpu, label=exporter.labels.get(node, exporter.node_label), node=node, code=code)
                    for (node, gpu), code in sorted(exporter.codes.items())
                )
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
