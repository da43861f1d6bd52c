"""The pod section: labels, annotations, priority, node selection, tolerations, affinity, volumes, grace period."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field
from pydantic.alias_generators import to_snake

from ..base import ApiModel
from ..contract import GROUP, KUEUE_GROUP
from ..rules import Rule
from .placement import Affinity, Toleration
from .values import DNS_SUBDOMAIN, QUALIFIED_NAME_PATTERN, AnnotationValue, LabelValue
from .volumes import RESERVED_VOLUME_NAMES, Volume, VolumeMount

# Label and annotation keys that are ours or the Kubeflow training operator's:
# the renderer sets them and selectors, the PodMonitor and the operator's pod
# loop rely on them, so a user value must not replace them.
RESERVED_KEY_PREFIXES = ("app.kubernetes.io/", f"{GROUP}/", "training.kubeflow.org/")
# Set on every pod under placement karpenter (docs/renderer.md).
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
# Keys of the nodeSelector that resources.nodePool and resources.capacityType own.
KARPENTER_SELECTOR_KEYS = ("karpenter.sh/nodepool", "karpenter.sh/capacity-type")
# Where the default grace period comes from: docs/renderer.md, "Pod settings".
DEFAULT_GRACE_SECONDS = 300


def _reserved_key(key: str) -> bool:
    return key.startswith(RESERVED_KEY_PREFIXES)


_RESERVED_CEL = " || ".join(f"k.startsWith('{p}')" for p in RESERVED_KEY_PREFIXES)
_RESERVED_TEXT = ", ".join(f"{p}*" for p in RESERVED_KEY_PREFIXES)


def _keys_rule(field: str, what: str) -> Rule:
    return Rule(
        cel=f"!has(self.{field}) || self.{field}.all(k, k.matches('{QUALIFIED_NAME_PATTERN}'))",
        message=f"{field} keys must be {what}: an optional DNS-subdomain prefix and '/', then a name of at most 63 "
        "letters, digits, '-', '_' or '.' that starts and ends with a letter or digit",
        field_path=f".{field}",
        check=lambda p: all(re.match(QUALIFIED_NAME_PATTERN, k) for k in getattr(p, to_snake(field))),
    )


class PodSettings(ApiModel):
    """Settings of the training pods beyond what the renderer derives (docs/renderer.md, "Pod settings").

    Immutable: the training operator does not re-create running pods when their
    template changes, so a change would apply to some pods and not others.
    """

    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "Labels added to the PyTorchJob and to its pods (e.g. a team or cost-center label). "
            f"Keys under {_RESERVED_TEXT} are the operator's and are refused."
        ),
    )
    annotations: dict[str, AnnotationValue] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "Annotations added to the PyTorchJob and to its pods. Keys under "
            f"{_RESERVED_TEXT} and {DO_NOT_DISRUPT} are the operator's and are refused."
        ),
    )
    priority_class_name: str | None = Field(
        default=None, pattern=DNS_SUBDOMAIN, max_length=253, description="PriorityClass of the pods."
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description=(
            "Node labels the pods require, added to the Karpenter selector of resources "
            "(karpenter.sh/nodepool and karpenter.sh/capacity-type come from resources and are refused here)."
        ),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=16, description="Tolerations added to the pods' own."
    )
    affinity: Affinity | None = Field(
        default=None, description="Affinity merged with the pods' own (docs/renderer.md)."
    )
    volumes: list[Volume] = Field(
        default_factory=list, max_length=16, description="Extra volumes (a data PVC, FSx for Lustre, a Secret)."
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=16, description="Mounts of the extra volumes in the trainer container."
    )
    termination_grace_period_seconds: int = Field(
        default=DEFAULT_GRACE_SECONDS,
        ge=0,
        le=86400,
        description=(
            "Seconds between SIGTERM and SIGKILL on pod deletion (drain, spot interruption, suspend, preemption); "
            "the trainer checkpoints its current step in that time, and torchrun waits for it up to 15 s less. "
            f"Default {DEFAULT_GRACE_SECONDS}: room for a sharded save (docs/renderer.md)."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        _keys_rule("labels", "label keys"),
        Rule(
            cel=f"!has(self.labels) || !self.labels.exists(k, {_RESERVED_CEL})",
            message=f"labels must not use the operator's keys ({_RESERVED_TEXT}): they select the job's pods",
            field_path=".labels",
            check=lambda p: not any(_reserved_key(k) for k in p.labels),
        ),
        Rule(
            cel=f"!has(self.labels) || !self.labels.exists(k, k.startsWith('{KUEUE_GROUP}/'))",
            message=f"labels must not set Kueue's keys ({KUEUE_GROUP}/*): use spec.scheduling",
            field_path=".labels",
            check=lambda p: not any(k.startswith(f"{KUEUE_GROUP}/") for k in p.labels),
        ),
        _keys_rule("annotations", "qualified names"),
        Rule(
            cel=f"!has(self.annotations) || !self.annotations.exists(k, {_RESERVED_CEL} || k == '{DO_NOT_DISRUPT}')",
            message=f"annotations must not use the operator's keys ({_RESERVED_TEXT}, {DO_NOT_DISRUPT})",
            field_path=".annotations",
            check=lambda p: not any(_reserved_key(k) or k == DO_NOT_DISRUPT for k in p.annotations),
        ),
        _keys_rule("nodeSelector", "label keys"),
        Rule(
            cel="!has(self.nodeSelector) || !["
            + ", ".join(f"'{k}'" for k in KARPENTER_SELECTOR_KEYS)
            + "].exists(k, k in self.nodeSelector)",
            message=(
                "nodeSelector must not set karpenter.sh/nodepool or karpenter.sh/capacity-type: "
                "use resources.nodePool and resources.capacityType"
            ),
            field_path=".nodeSelector",
            check=lambda p: not any(k in p.node_selector for k in KARPENTER_SELECTOR_KEYS),
        ),
        Rule(
            cel=(
                "!has(self.volumes) || self.volumes.all(v, !(v.name in ["
                + ", ".join(f"'{n}'" for n in RESERVED_VOLUME_NAMES)
                + "]) && self.volumes.filter(w, w.name == v.name).size() == 1)"
            ),
            message=(
                "volume names must be unique and not one of the pod's own (" + ", ".join(RESERVED_VOLUME_NAMES) + ")"
            ),
            field_path=".volumes",
            check=lambda p: (
                len({v.name for v in p.volumes}) == len(p.volumes)
                and not any(v.name in RESERVED_VOLUME_NAMES for v in p.volumes)
            ),
        ),
        Rule(
            cel=(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, "
                "has(self.volumes) && self.volumes.exists(v, v.name == m.name))"
            ),
            message="each volumeMount must name a volume of pod.volumes",
            field_path=".volumeMounts",
            check=lambda p: all(any(v.name == m.name for v in p.volumes) for m in p.volume_mounts),
        ),
        Rule(
            cel=(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, self.volumeMounts.all(n, "
                "m == n || (m.mountPath != n.mountPath && !n.mountPath.startsWith(m.mountPath + '/'))))"
            ),
            message="volumeMounts must not share a mountPath nor lie inside one another",
            field_path=".volumeMounts",
            check=lambda p: all(
                m is n or (m.mount_path != n.mount_path and not n.mount_path.startswith(m.mount_path + "/"))
                for m in p.volume_mounts
                for n in p.volume_mounts
            ),
        ),
    )
