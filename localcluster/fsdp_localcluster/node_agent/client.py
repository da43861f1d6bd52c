"""A minimal, dependency-free Kubernetes API client: what the node agent needs.

Authenticates from a kubeconfig (client certificate or bearer token), keeps
one keep-alive connection per thread, and streams watches.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]


def now() -> str:
    """RFC 3339 with seconds, as metav1.Time."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """RFC 3339 with microseconds, as metav1.MicroTime (Lease renewals)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:500]}")
        self.status = status


class KubeAPI:
    """A minimal, thread-safe Kubernetes API client built from a kubeconfig (client cert or token)."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg["current-context"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"]
        url = urllib.parse.urlsplit(self.server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        workdir.mkdir(parents=True, exist_ok=True)
        self.ca_file = workdir / "api-ca.crt"
        self.ca_file.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        self.ssl = ssl.create_default_context(cafile=str(self.ca_file))
        self.headers = {"Accept": "application/json"}
        if "client-certificate-data" in user:
            crt, key = workdir / "api-client.crt", workdir / "api-client.key"
            crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            key.chmod(0o600)
            self.ssl.load_cert_chain(str(crt), str(key))
        elif "token" in user:
            self.headers["Authorization"] = f"Bearer {user['token']}"
        self._local = threading.local()
        self._watches: set[http.client.HTTPSConnection] = set()
        self._watch_lock = threading.Lock()

    def _conn(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=timeout)

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", timeout: float = 30
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, **({"Content-Type": content_type} if data is not None else {})}
        # One keep-alive connection per thread; a stale one is replaced once.
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self._conn(timeout)
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        if resp.status >= 300:
            raise ApiError(resp.status, method, path, raw.decode(errors="replace"))
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def watch(
        self, path: str, resource_version: str, stop: threading.Event, timeout_seconds: int = 60
    ) -> Iterator[Obj]:
        """Watch events from ``resource_version`` until the server closes the stream or ``stop`` is set."""
        sep = "&" if "?" in path else "?"
        query = f"watch=1&allowWatchBookmarks=true&resourceVersion={resource_version}&timeoutSeconds={timeout_seconds}"
        conn = self._conn(timeout_seconds + 15)
        with self._watch_lock:
            self._watches.add(conn)
        try:
            conn.request("GET", f"{path}{sep}{query}", headers=self.headers)
            resp = conn.getresponse()
            if resp.status >= 300:
                raise ApiError(resp.status, "WATCH", path, resp.read().decode(errors="replace"))
            while not stop.is_set():
                line = resp.readline()
                if not line:
                    return
                yield json.loads(line)
        finally:
            with self._watch_lock:
                self._watches.discard(conn)
            conn.close()

    def close_watches(self) -> None:
        """End every open watch now (their readers see the stream end)."""
        with self._watch_lock:
            conns = list(self._watches)
        for conn in conns:
            if conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
