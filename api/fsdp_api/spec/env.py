"""Extra environment variables of the trainer container, with credentials kept out of literals."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field

from ..base import ApiModel
from ..contract import ENV_TRAINER_FAULT, OPERATOR_ENV
from ..faults import GRAMMAR as FAULT_GRAMMAR
from ..faults import PATTERN as FAULT_PATTERN
from ..rules import Rule
from .values import ENV_FIELD_PATH_PATTERN

# Env var names that look like credentials must come from a Secret, never
# inline: any name with one of these words between underscores (WANDB_KEY,
# DB_PASS, GH_PAT, AWS_SESSION_TOKEN, HF_TOKEN ...). A heuristic on the name
# only: a credential under an innocent name is not caught (docs/renderer.md).
SECRET_ENV_PATTERN = r"(?i)(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|KEY|PAT|CREDENTIALS?|PRIVATE)(_|$)"

_OPERATOR_ENV_CEL = "[" + ", ".join(f"'{name}'" for name in OPERATOR_ENV) + "]"
_OPERATOR_ENV_WHY = ", ".join(f"{name} ({source})" for name, source in OPERATOR_ENV.items())


class KeySelector(ApiModel):
    """A key of a Secret or ConfigMap."""

    name: str = Field(min_length=1, description="Name of the Secret or ConfigMap.")
    key: str = Field(min_length=1, description="Key to read.")
    optional: bool | None = Field(default=None, description="Whether the reference may be missing.")


class FieldSelector(ApiModel):
    """A field of the pod (downward API)."""

    field_path: str = Field(
        min_length=1,
        max_length=330,
        pattern=ENV_FIELD_PATH_PATTERN,
        description=(
            "Path of the field: metadata.name, .namespace, .uid, .labels['KEY'], .annotations['KEY'], "
            "spec.nodeName, spec.serviceAccountName, status.hostIP(s), status.podIP(s)."
        ),
    )


class EnvVarSource(ApiModel):
    """Where the value of an environment variable comes from."""

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret (use this for tokens).")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldSelector | None = Field(default=None, description="A field of the pod.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)].filter(x, x).size() == 1",
            message="exactly one of secretKeyRef, configMapKeyRef or fieldRef must be set",
            check=lambda s: sum(x is not None for x in (s.secret_key_ref, s.config_map_key_ref, s.field_ref)) == 1,
        ),
    )


class EnvVar(ApiModel):
    """An extra environment variable for the trainer container."""

    # maxLength bounds the cost of the credential-name regex (CEL cost budget).
    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=128, description="Variable name.")
    # maxLength bounds the CEL cost of the fault-hook rule's regex (an unbounded string is
    # costed at the request's size limit); 8 KiB is far beyond any literal a training needs.
    value: str | None = Field(
        default=None, max_length=8192, description="Literal value (not allowed for credentials: use valueFrom)."
    )
    value_from: EnvVarSource | None = Field(default=None, description="Source of the value, e.g. a Secret key.")

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="set either value or valueFrom, not both",
            field_path=".valueFrom",
            check=lambda e: not (e.value is not None and e.value_from is not None),
        ),
        Rule(
            cel=f"!(has(self.value) && self.name.matches('{SECRET_ENV_PATTERN}'))",
            message="looks like a credential: take it from a Secret with valueFrom.secretKeyRef, not a literal value",
            field_path=".value",
            check=lambda e: not (e.value is not None and re.search(SECRET_ENV_PATTERN, e.name)),
        ),
        Rule(
            cel=f"!(self.name in {_OPERATOR_ENV_CEL})",
            message=f"names a variable the operator sets from the spec, which this entry would silently replace: "
            f"{_OPERATOR_ENV_WHY}",
            field_path=".name",
            check=lambda e: e.name not in OPERATOR_ENV,
        ),
        Rule(
            cel=f"self.name != '{ENV_TRAINER_FAULT}' || (has(self.value) && self.value.matches('{FAULT_PATTERN}'))",
            message=f"{ENV_TRAINER_FAULT} is the trainer's fault-injection hook for tests; its value must be a "
            f"literal {FAULT_GRAMMAR} (docs/trainer.md)",
            field_path=".value",
            check=lambda e: e.name != ENV_TRAINER_FAULT or bool(e.value and re.match(FAULT_PATTERN, e.value)),
        ),
    )
