"""Reading objects by kubectl's resource names over one keep-alive API connection.

The tests poll statuses every half second for minutes; a ``kubectl get`` per
poll started a process and a TLS handshake each time (about 0.1 s of CPU
on each side), which on a 2-core machine competed with the trainings under
test. Names resolve as ``kubectl get`` resolves them: plural, singular, kind,
short name, or ``<name>.<group>``, the core group first.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from typing import Any

from .node_agent.client import ApiError, KubeAPI

Obj = dict[str, Any]


class Resources:
    """``get``/``list`` by resource name; discovery is read once and again on a name it does not know."""

    def __init__(self, api: KubeAPI) -> None:
        self.api = api
        self._lock = threading.Lock()
        self._known: dict[str, tuple[str, str, bool]] = {}  # name -> (group-version path, plural, namespaced)

    def _get(self, path: str) -> Any:
        """GET, retried while the server says 429 (a restarted API server's storage re-initializing),
        as kubectl retries it: the next test otherwise failed on the previous one's restart."""
        for _ in range(30):
            try:
                return self.api.get(path)
            except ApiError as e:
                if e.status != 429:
                    raise
                time.sleep(1)
        return self.api.get(path)

    def _discover(self) -> None:
        docs = [("/api/v1", "")]
        docs += [(f"/apis/{g['preferredVersion']['groupVersion']}", g["name"]) for g in self._get("/apis")["groups"]]
        known: dict[str, tuple[str, str, bool]] = {}
        for base, group in docs:
            for r in self._get(base)["resources"]:
                if "/" in r["name"]:  # a subresource (pods/log, .../status)
                    continue
                target = (base, r["name"], bool(r["namespaced"]))
                for name in {r["name"], r.get("singularName") or r["kind"].lower(), *r.get("shortNames", [])}:
                    known.setdefault(name, target)  # the core group's "events" before events.k8s.io's
                    if group:
                        known[f"{name}.{group}"] = target
        with self._lock:
            self._known = known

    def _resolve(self, resource: str) -> tuple[str, str, bool]:
        key = resource.lower()
        if key not in self._known:
            self._discover()  # a CRD installed since (Kueue's, Trainer v2's)
        try:
            return self._known[key]
        except KeyError:
            raise RuntimeError(f'the server doesn\'t have a resource type "{resource}"') from None

    def _collection(self, resource: str, namespace: str | None) -> tuple[str, str]:
        base, plural, namespaced = self._resolve(resource)
        scope = f"/namespaces/{namespace}" if namespaced and namespace else ""
        return f"{base}{scope}/{plural}", base.removeprefix("/api/").removeprefix("/apis/")

    def get(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        path, _ = self._collection(resource, namespace)
        try:
            return self._get(f"{path}/{urllib.parse.quote(name)}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, resource: str, namespace: str | None = None, selector: str | None = None) -> list[Obj]:
        path, version = self._collection(resource, namespace)
        query = f"?{urllib.parse.urlencode({'labelSelector': selector})}" if selector else ""
        doc = self._get(path + query)
        kind = doc["kind"].removesuffix("List")
        # As kubectl prints a list: each item names its kind, which the API leaves to the list.
        return [{"apiVersion": version, "kind": kind, **item} for item in doc["items"]]
