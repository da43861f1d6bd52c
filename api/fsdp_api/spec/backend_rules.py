"""What each backend adds to the spec's validation: the spec's only comparisons of the backend name.

pytorchjob, the default, adds nothing to the spec's own rules (its pod names,
<name>-worker-<index>, give the spec's name limit). trainjob refuses what a
TrainJob cannot express, freezes the fields rendered into its immutable
trainer, and shortens the name. A new backend adds its section here and joins
the tuples and functions at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from ..contract import BACKENDS, METRICS_PORT, TRAINJOB, TRAINJOB_RUNTIME
from ..rules import Rule, TransitionRule
from .pod import DEFAULT_GRACE_SECONDS
from .values import MAX_NODES

if TYPE_CHECKING:
    from .fsdp_training import FSDPTrainingSpec

Backend = Literal["pytorchjob", "trainjob"]
assert set(get_args(Backend)) == set(BACKENDS)


# --- pytorchjob ------------------------------------------------------------------

PYTORCHJOB_RULES: tuple[Rule, ...] = ()


# --- trainjob --------------------------------------------------------------------

_TRAINJOB = f"self.backend == '{TRAINJOB.name}'"
_TRAINJOB_WHY = (
    f"with backend: trainjob the pods come from the ClusterTrainingRuntime {TRAINJOB_RUNTIME}, and a TrainJob "
    "can change only some of their fields (docs/backends.md)"
)

# What Trainer v2.3.0's torch plugin injects and refuses in a TrainJob's env
# (pkg/constants/constants.go TorchRunReservedEnvNames).
TORCHRUN_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def _is_trainjob(backend: str) -> bool:
    return backend == TRAINJOB.name


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


# What a TrainJob (Kubeflow Trainer v2.3) cannot express; each is refused with
# that backend rather than dropped (docs/backends.md lists them).
TRAINJOB_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"!has(self.elastic) || !({_TRAINJOB})",
        message="elastic needs backend: pytorchjob: Kubeflow Trainer v2 has no elastic node range "
        "(a TrainJob runs a fixed numNodes)",
        field_path=".elastic",
        check=lambda s: s.elastic is None or not _is_trainjob(s.backend),
    ),
    Rule(
        cel=f"!has(self.runPolicy) || !has(self.runPolicy.ttlSecondsAfterFinished) || !({_TRAINJOB})",
        message="runPolicy.ttlSecondsAfterFinished needs backend: pytorchjob: a TrainJob has no TTL "
        "(delete the FSDPTraining, or its TrainJob, when done)",
        field_path=".runPolicy.ttlSecondsAfterFinished",
        check=lambda s: s.run_policy.ttl_seconds_after_finished is None or not _is_trainjob(s.backend),
    ),
    Rule(
        cel=f"!has(self.pod) || !has(self.pod.priorityClassName) || !({_TRAINJOB})",
        message="pod.priorityClassName needs backend: pytorchjob: a TrainJob's runtimePatches cannot set it "
        "(use scheduling.priorityClass with Kueue, or a runtime of your own)",
        field_path=".pod.priorityClassName",
        check=lambda s: s.pod.priority_class_name is None or not _is_trainjob(s.backend),
    ),
    Rule(
        cel=f"!has(self.metrics) || self.metrics.port == {METRICS_PORT} || !({_TRAINJOB})",
        message=f"metrics.port must be {METRICS_PORT} with backend: trainjob: {_TRAINJOB_WHY}",
        field_path=".metrics.port",
        check=lambda s: s.metrics.port == METRICS_PORT or not _is_trainjob(s.backend),
    ),
    Rule(
        cel=(
            f"!has(self.pod) || !has(self.pod.volumeMounts) || !({_TRAINJOB}) || "
            "self.pod.volumeMounts.all(m, self.pod.volumeMounts.filter(n, n.name == m.name).size() == 1)"
        ),
        message="pod.volumeMounts must mount each volume once with backend: trainjob: a TrainJob's runtimePatches "
        "key mounts by volume name (mount the volume's root and use paths below it instead of subPaths)",
        field_path=".pod.volumeMounts",
        check=lambda s: (
            not _is_trainjob(s.backend) or len({m.name for m in s.pod.volume_mounts}) == len(s.pod.volume_mounts)
        ),
    ),
    Rule(
        cel=f"!has(self.env) || !({_TRAINJOB}) || !self.env.exists(e, e.name in {_cel_list(TORCHRUN_RESERVED_ENV)})",
        message=f"env must not set {', '.join(TORCHRUN_RESERVED_ENV)} with backend: trainjob: Kubeflow Trainer "
        "sets them (and refuses a TrainJob that does)",
        field_path=".env",
        check=lambda s: not _is_trainjob(s.backend) or not any(e.name in TORCHRUN_RESERVED_ENV for e in s.env),
    ),
    Rule(
        cel=f"!has(self.imagePullPolicy) || self.imagePullPolicy == 'IfNotPresent' || !({_TRAINJOB})",
        message=f"imagePullPolicy must be IfNotPresent with backend: trainjob: {_TRAINJOB_WHY}",
        field_path=".imagePullPolicy",
        check=lambda s: s.image_pull_policy == "IfNotPresent" or not _is_trainjob(s.backend),
    ),
)


# Kueue 0.17-0.19 carry Trainer v2.2's types, whose runtime patch has no
# terminationGracePeriodSeconds (added in Trainer v2.3.0, kubeflow/trainer#3324).
# Kueue writes an admitted TrainJob back whole with those types, so a queued
# TrainJob's grace period is dropped at admission and the runtime's (the default)
# applies. kubernetes-sigs/kueue#14504 moved Kueue to Trainer v2.3.0 after 0.19.
_QUEUED_TRAINJOB_GRACE = Rule(
    cel=(
        f"!has(self.pod) || !has(self.pod.terminationGracePeriodSeconds) || "
        f"self.pod.terminationGracePeriodSeconds == {DEFAULT_GRACE_SECONDS} || "
        f"!has(self.scheduling) || !has(self.scheduling.queue) || !({_TRAINJOB})"
    ),
    message=(
        f"pod.terminationGracePeriodSeconds must be {DEFAULT_GRACE_SECONDS} (the runtime's) for a queued training "
        "with backend: trainjob: Kueue up to 0.19 drops it from the TrainJob when it admits it, so the pods would "
        f"get {DEFAULT_GRACE_SECONDS} s anyway (docs/kueue.md); use backend: pytorchjob for another grace period"
    ),
    field_path=".pod.terminationGracePeriodSeconds",
    check=lambda s: (
        s.pod.termination_grace_period_seconds == DEFAULT_GRACE_SECONDS
        or s.scheduling.queue is None
        or not _is_trainjob(s.backend)
    ),
)

# A TrainJob's spec.trainer and activeDeadlineSeconds are immutable (Trainer
# v2.3.0, "self == oldSelf" on both): with backend trainjob the spec fields
# rendered there (metrics: the FSDP_METRICS_PORT variable) cannot change either.
# One rule on spec, as it needs the backend.
TRAINJOB_FROZEN = ("image", "env", "serviceAccountName", "runPolicy", "metrics")


def _unchanged_cel(field: str) -> str:
    return f"(has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field}))"


TRAINJOB_FROZEN_RULE = TransitionRule(
    cel=f"!has(oldSelf.backend) || oldSelf.backend != '{TRAINJOB.name}' || ("
    + " && ".join(_unchanged_cel(f) for f in TRAINJOB_FROZEN)
    + ")",
    message=(
        f"with backend: trainjob, {', '.join(TRAINJOB_FROZEN)} cannot change on an existing job (a TrainJob's "
        "trainer and deadline are immutable): delete and recreate the FSDPTraining (checkpoints on the PVC are kept)"
    ),
)


def _trainjob_update_errors(old: FSDPTrainingSpec, new: FSDPTrainingSpec) -> list[str]:
    if not _is_trainjob(old.backend):
        return []
    by_alias = {(f.alias or k): k for k, f in type(old).model_fields.items()}
    if any(getattr(old, by_alias[f]) != getattr(new, by_alias[f]) for f in TRAINJOB_FROZEN):
        return [f"spec: {TRAINJOB_FROZEN_RULE.message}"]
    return []


# JobSet names a TrainJob's pods <name>-node-0-<index>-<5 random characters>, and
# its webhook refuses a JobSet whose longest pod name exceeds 63 characters.
TRAINJOB_MAX_NAME_LENGTH = 63 - len("-node-0-") - len(str(MAX_NODES - 1)) - len("-abcde")
TRAINJOB_NAME_LENGTH_MESSAGE = (
    f"name must be at most {TRAINJOB_MAX_NAME_LENGTH} characters with backend: trainjob, so that JobSet's pod "
    "names <name>-node-0-<index>-<random> stay valid DNS labels"
)
TRAINJOB_ROOT_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": (
            f"!has(self.metadata.name) || !has(self.spec.backend) || self.spec.backend != '{TRAINJOB.name}' "
            f"|| size(self.metadata.name) <= {TRAINJOB_MAX_NAME_LENGTH}"
        ),
        "message": TRAINJOB_NAME_LENGTH_MESSAGE,
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    },
)


def _trainjob_name_error(name: str, backend: str) -> str | None:
    if _is_trainjob(backend) and len(name) > TRAINJOB_MAX_NAME_LENGTH:
        return TRAINJOB_NAME_LENGTH_MESSAGE
    return None


# --- every backend ---------------------------------------------------------------

# Rules on spec that hold only under one backend (FSDPTrainingSpec's rules include them).
BACKEND_RULES: tuple[Rule, ...] = (*PYTORCHJOB_RULES, *TRAINJOB_RULES, _QUEUED_TRAINJOB_GRACE)
# Rules on the whole object (metadata.name against spec.backend), after the spec's own root rules.
BACKEND_ROOT_RULES: tuple[dict[str, str], ...] = TRAINJOB_ROOT_RULES


def backend_update_errors(old: FSDPTrainingSpec, new: FSDPTrainingSpec) -> list[str]:
    """check_update's part that depends on the old spec's backend: ``path: message`` per refused change."""
    return _trainjob_update_errors(old, new)


def backend_name_error(name: str, backend: str) -> str | None:
    """The message refusing metadata.name under ``backend``, when that backend's pod names would grow too long."""
    return _trainjob_name_error(name, backend)
