"""A namespaced, single-version CustomResourceDefinition for the cluster tests, written to a file for install_crds()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_crd(
    directory: Path, group: str, kind: str, schema: dict[str, Any], short_names: tuple[str, ...] = ()
) -> Path:
    plural = kind.lower() + "s"
    names: dict[str, Any] = {"plural": plural, "singular": kind.lower(), "kind": kind}
    if short_names:
        names["shortNames"] = list(short_names)
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": names,
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
        },
    }
    path = directory / f"{plural}.json"
    path.write_text(json.dumps(crd))
    return path
