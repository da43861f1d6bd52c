"""A core v1 Event as the pod loop reads it: when it was last seen, and its message."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .meta import metadata

Json = Mapping[str, Any]


@dataclass(frozen=True)
class EventView:
    message: str
    # lastTimestamp, else eventTime (events.k8s.io writers), else the object's creation, as text;
    # RFC 3339 in UTC orders as text.
    last_seen: str

    @classmethod
    def of(cls, event: Json) -> EventView:
        return cls(
            message=str(event.get("message") or ""),
            last_seen=str(
                event.get("lastTimestamp") or event.get("eventTime") or metadata(event).get("creationTimestamp")
            ),
        )
