"""What may change on a live job: the immutable fields and ``check_update``, the transition rules in Python."""

from __future__ import annotations

from pydantic import BaseModel

from ..rules import TransitionRule, immutable
from .backend_rules import backend_update_errors
from .checkpoint import CheckpointSpec
from .fsdp_training import FSDPTrainingSpec
from .training import TrainingSpec

# Changing these on a live job would silently invalidate its checkpoints, its
# data position or its pods' placement, so the API server refuses the update
# (a `self == oldSelf` rule on the field) and check_update() mirrors it.
IMMUTABLE_FIELDS: dict[type[BaseModel], tuple[str, tuple[str, ...]]] = {
    FSDPTrainingSpec: (
        "spec",
        (
            "backend",
            "model",
            "data",
            "fsdp",
            "parallelism",
            "resources",
            "peft",
            "pod",
            "command",
            "args",
            "scheduling",
        ),
    ),
    TrainingSpec: ("spec.training", ("seqLen", "microBatchSize", "gradAccumSteps", "precision", "seed")),
    CheckpointSpec: ("spec.checkpoint", ("dir", "claimName")),
}


def immutable_rule(owner: type[BaseModel], field: str) -> TransitionRule | None:
    prefix, fields = IMMUTABLE_FIELDS.get(owner, ("", ()))
    return immutable(f"{prefix}.{field}") if field in fields else None


def check_update(old: FSDPTrainingSpec, new: FSDPTrainingSpec) -> list[str]:
    """The API server's transition rules, in Python: ``path: message`` per change."""
    errors = []
    for owner, (prefix, fields) in IMMUTABLE_FIELDS.items():
        sub = prefix.removeprefix("spec").lstrip(".")
        o = getattr(old, sub) if sub else old
        n = getattr(new, sub) if sub else new
        for field in fields:
            attr = next(k for k, f in owner.model_fields.items() if (f.alias or k) == field)
            if getattr(o, attr) != getattr(n, attr):
                rule = immutable(f"{prefix}.{field}")
                errors.append(f"{prefix}.{field}: {rule.message}")
    return errors + backend_update_errors(old, new)
