"""The few Kubernetes API calls the client makes, over urllib: get, list, create, patch, delete, streams.

Errors come back as :class:`ApiError` with the API server's own message (its
``Status`` object), or as one :class:`ClientError` line for a server that
cannot be reached; never as urllib's traceback.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import ApiError, ClientError
from .kubeconfig import Connection

Json = dict[str, Any]
DEFAULT_TIMEOUT_SECONDS = 30.0
MERGE_PATCH = "application/merge-patch+json"


class KubeApi:
    """Requests to one API server as one user."""

    def __init__(self, connection: Connection, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.connection = connection
        self.timeout = timeout

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        url = self.connection.server + path
        if query:
            url += "?" + urllib.parse.urlencode({k: _flag(v) for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        header = self.connection.credentials.header()
        if header:
            request.add_header("Authorization", header)
        try:
            return urllib.request.urlopen(request, timeout=timeout or self.timeout, context=self.connection.ssl_context)
        except urllib.error.HTTPError as e:
            raise api_error(e) from None
        except (TimeoutError, urllib.error.URLError, ConnectionError, ssl.SSLError) as e:
            reason = getattr(e, "reason", e)
            raise ClientError(f"cannot reach the API server {self.connection.server}: {reason}") from None

    def request(self, method: str, path: str, **kwargs: Any) -> Json:
        with self._open(method, path, **kwargs) as response:
            raw = response.read()
        return json.loads(raw) if raw else {}

    def text(self, path: str, query: Mapping[str, Any] | None = None, timeout: float | None = None) -> str:
        with self._open("GET", path, query=query, timeout=timeout) as response:
            return response.read().decode(errors="replace")

    def lines(self, path: str, query: Mapping[str, Any] | None = None) -> Iterator[str]:
        """A streamed response line by line (``follow=true`` logs), until the server ends it."""
        with self._open("GET", path, query=query, timeout=None) as response:
            for raw in response:
                yield raw.decode(errors="replace").rstrip("\n")

    # The verbs, on a collection path (".../namespaces/NS/fsdptrainings") and an object's path under it.
    def get(self, path: str) -> Json:
        return self.request("GET", path)

    def get_or_none(self, path: str) -> Json | None:
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, path: str, *, label_selector: str | None = None, field_selector: str | None = None) -> list[Json]:
        query = {"labelSelector": label_selector, "fieldSelector": field_selector}
        return list(self.request("GET", path, query=query).get("items") or [])

    def create(self, path: str, body: Json) -> Json:
        return self.request("POST", path, body=body)

    def merge_patch(self, path: str, patch: Json) -> Json:
        return self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    def delete(self, path: str, propagation: str = "Background") -> Json:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        return self.request("DELETE", path, body=body)


def _flag(value: Any) -> Any:
    return str(value).lower() if isinstance(value, bool) else value


def api_error(e: urllib.error.HTTPError) -> ApiError:
    """The Status the API server sent with an error, or what HTTP said when it sent none."""
    try:
        status = json.loads(e.read() or b"{}")
    except (json.JSONDecodeError, OSError):
        status = {}
    if not isinstance(status, dict):
        status = {}
    return ApiError(e.code, str(status.get("reason") or e.reason), str(status.get("message") or ""))


def core_path(resource: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    return _path("/api/v1", resource, namespace, name, sub)


def group_path(
    group: str, version: str, resource: str, namespace: str, name: str | None = None, sub: str | None = None
) -> str:
    return _path(f"/apis/{group}/{version}", resource, namespace, name, sub)


def _path(prefix: str, resource: str, namespace: str, name: str | None, sub: str | None) -> str:
    q = urllib.parse.quote
    out = f"{prefix}/namespaces/{q(namespace, safe='')}/{resource}"
    if name is not None:
        out += f"/{q(name, safe=':')}"
    if sub:
        out += f"/{sub}"
    return out
