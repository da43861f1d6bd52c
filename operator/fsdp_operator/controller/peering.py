"""kopf peering, seen from the operator's own background work.

kopf pauses its watchers when a peer with a higher (or equal) priority is
alive, but a plain asyncio task of ours (the progress scraper) does not see
that pause. It asks here instead, with kopf's rule applied to the same
peering object: so a paused, stray instance writes nothing at all.
"""

from __future__ import annotations

import getpass
import os
import socket
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from .kube import ApiError, KubeClient

PEERING_API_VERSION = "kopf.dev/v1"
# What kopf assumes for peers that do not say (kopf's own hard-coded default).
DEFAULT_LIFETIME_SECONDS = 60


def operator_identity() -> str:
    """The peer id: the pod name in a cluster, else user@host plus a random suffix.

    A pod's id must survive a container restart: a crashed operator leaves
    its keep-alive behind for up to the peering lifetime, and a restarted
    container with a new id would see that record as a rival of equal
    priority and pause until it expires.
    """
    pod = os.environ.get("POD_NAME")
    if pod:
        return pod
    return f"{getpass.getuser()}@{socket.gethostname()}/{uuid.uuid4().hex[:8]}"


def peering_kind(clusterwide: bool) -> str:
    return "ClusterKopfPeering" if clusterwide else "KopfPeering"


def is_active(status: Mapping[str, Any] | None, identity: str, priority: int, now: datetime | None = None) -> bool:
    """kopf's rule: active unless another live peer has a priority at least ours."""
    now = now or datetime.now(UTC)
    for peer, info in (status or {}).items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        try:
            lastseen = datetime.fromisoformat(str(info["lastseen"]))
        except (KeyError, ValueError):
            lastseen = now  # kopf treats a peer without a timestamp as just seen
        if lastseen.tzinfo is None:
            lastseen = lastseen.replace(tzinfo=UTC)
        lifetime = timedelta(seconds=int(info.get("lifetime", DEFAULT_LIFETIME_SECONDS)))
        if lastseen + lifetime <= now:
            continue  # dead peer
        if int(info.get("priority", 0)) >= priority:
            return False
    return True


async def ensure_peering_object(client: KubeClient, name: str, clusterwide: bool, namespaces: list[str]) -> None:
    """Create the peering object(s) if missing: without one, kopf has nowhere to meet its peers."""
    kind = peering_kind(clusterwide)
    # A namespace pattern names no namespace to create in: those objects are the installer's.
    targets: list[str | None] = [None] if clusterwide else [n for n in namespaces if not set(n) & set("*?[!")]
    for ns in targets:
        if await client.get(PEERING_API_VERSION, kind, ns, name) is not None:
            continue
        meta: dict[str, Any] = {"name": name}
        if ns:
            meta["namespace"] = ns
        try:
            await client.create({"apiVersion": PEERING_API_VERSION, "kind": kind, "metadata": meta})
        except ApiError as e:
            if e.status != 409:  # another instance created it first: fine
                raise


async def we_are_active(
    client: KubeClient, name: str, clusterwide: bool, namespace: str | None, identity: str, priority: int
) -> bool:
    kind = peering_kind(clusterwide)
    obj = await client.get(PEERING_API_VERSION, kind, None if clusterwide else namespace, name)
    return is_active((obj or {}).get("status"), identity, priority)
