"""The status as stored, and the JSON merge patch that writes only what changed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdp_api.status import FSDPTrainingStatus

Json = Mapping[str, Any]


def status_document(status: FSDPTrainingStatus) -> dict[str, Any]:
    """The status as stored: camelCase, unset fields left out."""
    return status.model_dump(by_alias=True, mode="json", exclude_none=True)


def declared_subset(previous: Json | None) -> dict[str, Any]:
    """Only the fields FSDPTrainingStatus declares (anything else would be pruned anyway)."""
    keys = {f.alias or n for n, f in FSDPTrainingStatus.model_fields.items()}
    return {k: v for k, v in (previous or {}).items() if k in keys}


def merge_patch(old: Json | None, new: Json) -> dict[str, Any]:
    """An RFC 7386 JSON merge patch turning ``old`` into ``new`` (empty: nothing to do).

    Lists are replaced whole, as merge patch does; keys missing from ``new``
    are deleted with null, so stale replica types or times disappear.
    """
    old = old or {}
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before or key not in old:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def status_patch(previous: Json | None, status: FSDPTrainingStatus) -> dict[str, Any]:
    """The merge patch for the status subresource; ``{}`` when the stored status is already right."""
    return merge_patch(declared_subset(previous), status_document(status))
