"""Value types and patterns the spec's sections share: quantities, Kubernetes names, labels, images.

Each pattern is written once and used twice: in the CRD's schema (the API
server checks it) and by pydantic (``fsdp-operator validate`` checks it).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

# PyTorchJob pods and services are named <name>-worker-<index>; with up to
# 1000 nodes the index has 3 digits, and the whole must stay a 63-char label.
MAX_NODES = 1000
MAX_NAME_LENGTH = 63 - len("-worker-") - len(str(MAX_NODES - 1))

# Kubernetes resource.Quantity, as the API server parses it, without the
# minus sign: no request or limit of ours can be negative.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# A reference with a tag (after the last "/") or a digest: an untagged image
# means :latest, whatever is pushed under it next.
IMAGE_PINNED_PATTERN = r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@[A-Za-z0-9_+.-]+:[0-9a-fA-F]{32,})$"
# The longest image reference the API accepts (bounds the CEL rule's cost).
MAX_IMAGE_LENGTH = 512
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
# A qualified name, as label and annotation keys are (an optional DNS-subdomain
# prefix and '/', then at most 63 characters), bounded for the CEL cost budget.
QUALIFIED_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"

Quantity = Annotated[
    int | str,
    # pattern checks the strings, minimum the integers.
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "minimum": 0}),
]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN, description="A label value.")]
# The pod fields an environment variable may read (the downward API's env fields:
# kubernetes.io/docs/concepts/workloads/pods/downward-api/); the API server refuses others in a pod.
ENV_FIELD_PATH_PATTERN = (
    r"^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']{1,317}'\]"
    r"|spec\.(nodeName|serviceAccountName)|status\.(hostIPs?|podIPs?))$"
)
# What the API server requires of a toleration's key, a node or pod selector's key and a topologyKey.
QUALIFIED_NAME_MAX = 317


def qualified_name(description: str) -> Any:
    """A label key (a qualified name), as Kubernetes validates it in a pod."""
    return Field(min_length=1, max_length=QUALIFIED_NAME_MAX, pattern=QUALIFIED_NAME_PATTERN, description=description)


AnnotationValue = Annotated[str, Field(max_length=8192, description="An annotation value.")]
NamespaceName = Annotated[str, Field(pattern=DNS_LABEL, max_length=63, description="A namespace.")]
