"""Where the pods may land, re-modelled from Kubernetes' core types: tolerations and affinity.

A typed subset of corev1's Toleration and Affinity, so the API server checks
what a user adds and the renderer merges it with the pods' own terms.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from ..base import ApiModel
from ..rules import Rule
from .values import (
    DNS_LABEL,
    LABEL_VALUE_PATTERN,
    QUALIFIED_NAME_MAX,
    QUALIFIED_NAME_PATTERN,
    LabelValue,
    qualified_name,
)


class Toleration(ApiModel):
    """A toleration of a node taint, added to the pods' own (the nvidia.com/gpu taint for GPU jobs)."""

    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=QUALIFIED_NAME_MAX,
        pattern=QUALIFIED_NAME_PATTERN,
        description="Taint key to tolerate; unset (with Exists): every taint.",
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Equal (default): the taint's value must equal value; Exists: any value."
    )
    value: str | None = Field(
        default=None, max_length=63, pattern=LABEL_VALUE_PATTERN, description="Taint value to match (operator Equal)."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; unset: every effect."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="NoExecute only: how long the pod stays bound after the taint appears.",
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="has(self.key) || (has(self.operator) && self.operator == 'Exists')",
            message="a toleration without key needs operator Exists (it then tolerates every taint)",
            field_path=".operator",
            check=lambda t: t.key is not None or t.operator == "Exists",
        ),
        Rule(
            cel="!(has(self.operator) && self.operator == 'Exists' && has(self.value))",
            message="value must be unset with operator Exists",
            field_path=".value",
            check=lambda t: not (t.operator == "Exists" and t.value is not None),
        ),
        Rule(
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds needs effect NoExecute",
            field_path=".tolerationSeconds",
            check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
        ),
    )


_SET_OPERATORS = ("In", "NotIn")
_VALUE_RULE_CEL = (
    "self.operator in ['Exists', 'DoesNotExist'] ? (!has(self.values) || size(self.values) == 0) : "
    "(has(self.values) && (self.operator in ['In', 'NotIn'] ? size(self.values) > 0 : size(self.values) == 1))"
)


def _values_ok(r: NodeSelectorRequirement | LabelSelectorRequirement) -> bool:
    n = len(r.values or [])
    if r.operator in ("Exists", "DoesNotExist"):
        return n == 0
    return n > 0 if r.operator in _SET_OPERATORS else n == 1


_VALUES_MESSAGE = (
    "values must be empty with Exists or DoesNotExist, non-empty with In or NotIn, one value with Gt or Lt"
)


class NodeSelectorRequirement(ApiModel):
    """A requirement on a node label."""

    key: str = qualified_name("Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="How the label relates to values."
    )
    values: list[LabelValue] | None = Field(
        default=None, max_length=64, description="Values (In, NotIn: one or more; Gt, Lt: one integer; else none)."
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(cel=_VALUE_RULE_CEL, message=_VALUES_MESSAGE, field_path=".values", check=_values_ok),
    )


class NodeSelectorTerm(ApiModel):
    """Requirements that a node must all meet (ANDed)."""

    match_expressions: list[NodeSelectorRequirement] = Field(
        min_length=1, max_length=16, description="Requirements on node labels, all of which must hold."
    )


class NodeSelector(ApiModel):
    """Node selector terms, any one of which suffices (ORed)."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=8, description="Terms; a node must meet at least one."
    )


class PreferredSchedulingTerm(ApiModel):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100, description="Weight of the preference (1-100).")
    preference: NodeSelectorTerm = Field(description="The preferred node term.")


class NodeAffinity(ApiModel):
    """Node affinity, combined with the pods' own (resources.instanceTypes)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pods must run on; each term is ANDed with resources.instanceTypes."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        default=None, max_length=8, description="Nodes the pods prefer."
    )


class LabelSelectorRequirement(ApiModel):
    """A requirement on a pod label."""

    key: str = qualified_name("Pod label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How the label relates to values.")
    values: list[LabelValue] | None = Field(
        default=None, max_length=64, description="Values (In, NotIn: one or more; else none)."
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(cel=_VALUE_RULE_CEL, message=_VALUES_MESSAGE, field_path=".values", check=_values_ok),
    )


class LabelSelector(ApiModel):
    """A pod label selector."""

    match_labels: dict[str, LabelValue] | None = Field(default=None, max_length=16, description="Labels to match.")
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=8, description="Requirements on pod labels."
    )


class PodAffinityTerm(ApiModel):
    """Pods (by label) in whose topology domain the pods must, or must not, run."""

    label_selector: LabelSelector | None = Field(default=None, description="Pods this term is about.")
    namespaces: list[Annotated[str, Field(pattern=DNS_LABEL, max_length=63, description="A namespace.")]] | None = (
        Field(default=None, max_length=16, description="Namespaces of those pods; unset: the training's namespace.")
    )
    topology_key: str = qualified_name("Node label of the domain (e.g. topology.kubernetes.io/zone).")


class WeightedPodAffinityTerm(ApiModel):
    """A weighted pod (anti-)affinity preference."""

    weight: int = Field(ge=1, le=100, description="Weight of the preference (1-100).")
    pod_affinity_term: PodAffinityTerm = Field(description="The preferred term.")


class PodAffinity(ApiModel):
    """Pod affinity or anti-affinity terms, added to the pods' own."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, max_length=8, description="Terms the pods must meet."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        default=None, max_length=8, description="Terms the pods prefer."
    )


class Affinity(ApiModel):
    """Extra affinity: a typed subset of the pod's affinity, merged with the renderer's (docs/renderer.md)."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity (added to the EFA zone affinity).")
    pod_anti_affinity: PodAffinity | None = Field(
        default=None, description="Pod anti-affinity (added to the one-pod-per-node term)."
    )
