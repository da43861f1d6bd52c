"""Admission webhooks of the controllers next to a ControlPlane, registered by URL on loopback.

There is no pod network: the API server calls each webhook server at
``https://127.0.0.1:<port><path>``, with the control plane's webhook CA
(``ControlPlane.webhook_certs``). Upstream's configurations are applied with
only the webhooks a test needs, and deleted when the server stops: they fail closed.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any

import yaml

from .apiserver import TestCluster


def json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply the ``add``/``replace`` operations of an RFC 6902 patch (what upstream's kustomize patches use)."""
    for op in ops:
        if op["op"] not in ("add", "replace"):
            raise ValueError(f"unsupported JSON patch op {op['op']!r}")
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in op["path"].lstrip("/").split("/")]
        parent: Any = doc
        for t in tokens[:-1]:
            parent = parent[int(t)] if isinstance(parent, list) else parent[t]
        last = tokens[-1]
        if isinstance(parent, list):
            if op["op"] == "add":
                parent.insert(len(parent) if last == "-" else int(last), op["value"])
            else:
                parent[int(last)] = op["value"]
        else:
            parent[last] = op["value"]
    return doc


def register_webhooks(
    cluster: TestCluster,
    manifests: Path,
    patches: Mapping[str, Path],
    names: Mapping[str, str],
    keep: Set[str],
    port: int,
    ca_bundle: str,
) -> None:
    """Apply upstream's webhook configurations, pointed by URL at ``https://127.0.0.1:<port><path>``.

    ``patches`` maps a kind to upstream's JSON patch of it (applied first, so
    its indices are upstream's); ``names`` gives each kind its configuration
    name; only the webhooks named in ``keep`` are registered.
    """
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc or doc.get("kind") not in names:
            continue
        if doc["kind"] in patches:
            doc = json_patch(doc, yaml.safe_load(patches[doc["kind"]].read_text()))
        hooks = [h for h in doc.get("webhooks") or [] if h["name"] in keep]
        for h in hooks:
            path = h["clientConfig"]["service"]["path"]
            h["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
            h["timeoutSeconds"] = 10
        cluster.apply(
            {
                "apiVersion": doc["apiVersion"],
                "kind": doc["kind"],
                "metadata": {"name": names[doc["kind"]]},
                "webhooks": hooks,
            }
        )


def delete_webhooks(cluster: TestCluster, names: Mapping[str, str]) -> None:
    # Webhooks that fail closed must not outlive their server.
    for kind, name in names.items():
        cluster.kubectl("delete", kind.lower(), name, "--ignore-not-found")
