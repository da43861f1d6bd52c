"""Stand-ins for the network around a tracker's check: an HTTP server with one answer, and the resolver."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def answering_server(status: int, body: bytes) -> Iterator[dict[str, Any]]:
    """A plain HTTP server on loopback answering every GET and POST with ``state``'s status and body.

    ``state["url"]`` is its address; ``state["seen"]`` lists (path, Authorization, body) per request.
    Change ``state["status"]`` and ``state["body"]`` between requests.
    """
    state: dict[str, Any] = {"status": status, "body": body, "seen": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            sent = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state["seen"].append((self.path, self.headers.get("Authorization"), sent))
            self.send_response(state["status"])
            self.end_headers()
            self.wfile.write(state["body"])

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()


def dns_answers(monkeypatch: pytest.MonkeyPatch, code: int, text: str) -> None:
    """Names under .invalid get ``code`` from the resolver, whatever resolver the machine has."""
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        if str(host).endswith(".invalid"):
            raise socket.gaierror(code, text)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
