"""The health section: what the operator does with a suspect node under a training's pods."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import ApiModel
from ..rules import applies_only_when


class HealthSpec(ApiModel):
    """What happens when a node under the pods is a suspect (docs/operator.md, "Bad nodes").

    A node is a suspect when one of its own conditions reports a problem (the
    EKS node monitoring agent's) or when a rank on it keeps its peers waiting
    (a straggler). The NodesHealthy condition and an Event say so either way.
    """

    on_suspect_node: Literal["alert", "exclude"] = Field(
        default="alert",
        description=(
            "alert: say so in NodesHealthy and an Event; exclude: also taint the node for trainings "
            "(training.fsdp.dev/excluded:NoSchedule, lifted after excludeSeconds) and delete the job's pods, so "
            "that they are re-created elsewhere and resume from the last checkpoint (needs checkpoint.claimName "
            "and an install allowed to taint nodes, docs/operator.md)."
        ),
    )
    max_excluded_nodes: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "onSuspectNode exclude: nodes this training may exclude over its life; after that it only alerts. "
            "The operator also caps the nodes excluded at once in the whole cluster."
        ),
    )
    exclude_seconds: int = Field(
        default=3600,
        ge=60,
        le=604800,
        description=(
            "onSuspectNode exclude: how long the taint stays before the operator lifts it (a replaced node "
            "is a new node without it)."
        ),
    )


# After the class: the rules read its fields' names and defaults.
HealthSpec.rules = tuple(
    applies_only_when(
        HealthSpec,
        attr,
        "has(self.onSuspectNode) && self.onSuspectNode == 'exclude'",
        lambda h: h.on_suspect_node == "exclude",
        "health.onSuspectNode: exclude",
    )
    for attr in ("max_excluded_nodes", "exclude_seconds")
)
