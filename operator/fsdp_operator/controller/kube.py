"""A small async Kubernetes client on aiohttp: just the calls the operator makes.

The official ``kubernetes`` client pins an incompatible pydantic, and kopf's
own client is private API, so this wraps aiohttp with the credentials kopf's
login functions produce (``kopf.ConnectionInfo``): the operator and kopf
authenticate identically, in-cluster or from a kubeconfig.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import kopf
from fsdp_api.contract import (
    BACKENDS,
    KIND,
    NETWORKPOLICY_KIND,
    NETWORKPOLICY_PLURAL,
    PLURAL,
    PODMONITOR_KIND,
    PODMONITOR_PLURAL,
    WORKLOAD_KIND,
    WORKLOAD_PLURAL,
)

FIELD_MANAGER = "fsdp-operator"
USER_AGENT = "fsdp-operator"

# Plural resource names of the kinds the operator touches (no discovery round-trip).
PLURALS = {
    "ConfigMap": "configmaps",
    "Event": "events",
    "Pod": "pods",
    **{b.kind: b.plural for b in BACKENDS.values()},
    PODMONITOR_KIND: PODMONITOR_PLURAL,
    NETWORKPOLICY_KIND: NETWORKPOLICY_PLURAL,
    WORKLOAD_KIND: WORKLOAD_PLURAL,
    "ServiceMonitor": "servicemonitors",
    KIND: PLURAL,
    "KopfPeering": "kopfpeerings",
    "ClusterKopfPeering": "clusterkopfpeerings",
}
CLUSTER_SCOPED = {"ClusterKopfPeering"}

Json = dict[str, Any]

# What a lost connection or an API server restart raises (TimeoutError is an OSError). A tuple of
# known length, so that ``except (ApiError, *NETWORK_ERRORS)`` type-checks.
NETWORK_ERRORS = (aiohttp.ClientError, OSError)


class ApiError(Exception):
    """A non-2xx answer from the API server, with its Status message."""

    def __init__(self, status: int, method: str, url: str, body: str) -> None:
        self.status = status
        self.reason = ""
        message = body
        try:
            doc = json.loads(body)
            message = doc.get("message", body)
            self.reason = doc.get("reason", "")
        except ValueError:
            pass
        self.message = message
        super().__init__(f"{method} {url}: {status} {self.reason} {message}".strip())

    @property
    def retryable(self) -> bool:
        # 409 on apply cannot happen with force=true; 429/5xx are load or restarts.
        return self.status in (408, 429) or self.status >= 500


@dataclass(frozen=True)
class ApplyResult:
    body: Json
    created: bool  # the server answered 201: this apply created the object


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    plural = PLURALS.get(kind) or kind.lower() + "s"
    path = base
    if namespace and kind not in CLUSTER_SCOPED:
        path += f"/namespaces/{quote(namespace)}"
    path += f"/{plural}"
    if name:
        path += f"/{quote(name)}"
    return path


def default_login(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo:
    """In-cluster service account first, then $KUBECONFIG / ~/.kube/config (what kopf does)."""
    settings = settings or kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no credentials: neither in-cluster nor a kubeconfig")
    return info


class KubeClient:
    """Async JSON client for one API server; re-logs in once on 401 (rotated tokens)."""

    def __init__(
        self,
        login: Callable[[], kopf.ConnectionInfo],
        *,
        request_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        max_connections: int = 64,
    ) -> None:
        self._login = login
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=connect_timeout)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._server = ""
        self._lock = asyncio.Lock()

    async def _ensure_session(self, relogin: bool = False) -> aiohttp.ClientSession:
        async with self._lock:
            if self._session is not None and not relogin:
                return self._session
            if self._session is not None:
                await self._session.close()
            info = self._login()
            self._server = info.server.rstrip("/")
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, ssl=info.as_ssl_context()),
                headers={**info.as_http_headers(), "User-Agent": USER_AGENT},
                timeout=self._timeout,
            )
            return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, Json]:
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        query = f"?{urlencode(params)}" if params else ""
        for attempt in (0, 1):
            session = await self._ensure_session(relogin=attempt == 1)
            url = f"{self._server}{path}{query}"
            async with session.request(method, url, data=data, headers=headers) as rsp:
                text = await rsp.text()
                if rsp.status == 401 and attempt == 0:
                    continue  # a rotated service-account token: read it again and retry once
                if rsp.status >= 400:
                    raise ApiError(rsp.status, method, path, text)
                return rsp.status, (json.loads(text) if text else {})
        raise AssertionError("unreachable")

    # ------------------------------------------------------------- the verbs

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Json | None:
        try:
            return (await self.request("GET", resource_path(api_version, kind, namespace, name)))[1]
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Json]:
        params = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        _, doc = await self.request("GET", resource_path(api_version, kind, namespace), params=params or None)
        return list(doc.get("items") or [])

    async def create(self, obj: Mapping[str, Any]) -> Json:
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        return (await self.request("POST", path, body=obj))[1]

    async def apply(self, obj: Mapping[str, Any]) -> ApplyResult:
        """Server-side apply as ``fsdp-operator``, forcing ownership of the fields we set.

        Idempotent by construction: the same manifest applied twice (say, by
        an operator restarted mid-reconcile) leaves one object, unchanged.
        """
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        status, body = await self.request(
            "PATCH",
            path,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=obj,  # JSON is YAML, which is what apply-patch+yaml takes
            content_type="application/apply-patch+yaml",
        )
        return ApplyResult(body=body, created=status == 201)

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str, uid: str) -> None:
        """Delete that exact object (uid precondition); already gone is fine."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        try:
            await self.request("DELETE", resource_path(api_version, kind, namespace, name), body=body)
        except ApiError as e:
            if e.status not in (404, 409):  # 409: replaced by a new object meanwhile, not ours to delete
                raise

    async def merge_patch(
        self, api_version: str, kind: str, namespace: str | None, name: str, patch: Mapping[str, Any]
    ) -> Json:
        path = resource_path(api_version, kind, namespace, name)
        return (await self.request("PATCH", path, body=dict(patch), content_type="application/merge-patch+json"))[1]

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Json:
        """Merge-patch the status subresource (metadata in the body would be ignored there)."""
        path = resource_path(api_version, kind, namespace, name) + "/status"
        body = {"status": dict(patch)}
        return (await self.request("PATCH", path, body=body, content_type="application/merge-patch+json"))[1]

    async def discover(self, group_version: str) -> set[str]:
        """Resource names served under ``group/version`` (empty if the group is not served)."""
        path = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        try:
            _, doc = await self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return set()
            raise
        return {r["name"] for r in doc.get("resources", [])}
