"""The trainer's configuration: the spec's training sections plus job identity.

The operator renders this into the job's ConfigMap (``train.yaml``) and the
trainer parses it with the same models, so both sides validate identically and
a field added to the spec reaches the trainer without a second definition.
"""

from __future__ import annotations

from typing import Any, ClassVar

import yaml
from pydantic import Field

from . import kubeyaml
from .base import ApiModel
from .rules import Rule
from .spec import (
    CONTEXT_CONFIG_RULES,
    EXPERT_CONFIG_RULES,
    PIPELINE_CONFIG_RULES,
    PREFERENCE_RULES,
    SEQ_LEN_RULE,
    TENSOR_CONFIG_RULES,
    CheckpointSpec,
    DataSpec,
    FSDPSpec,
    FSDPTrainingSpec,
    MetricsSpec,
    ModelSpec,
    ParallelismSpec,
    PeftSpec,
    StallSpec,
    TrackingSpec,
    TrainingSpec,
    effective_seq_len,
)

_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class JobInfo(ApiModel):
    """Identity of the job, used in metric labels and log lines."""

    name: str = Field(default="local", min_length=1, description="FSDPTraining name.")
    namespace: str = Field(default="default", min_length=1, description="Namespace of the FSDPTraining.")


# The spec's sections that the built-in trainer reads, in train.yaml's order (after job).
SECTIONS = ("model", "data", "training", "fsdp", "parallelism", "peft", "checkpoint", "metrics", "stall", "tracking")
# Optional in the spec only because spec.command can replace the built-in trainer.
REQUIRED_SECTIONS = ("model", "training")


def _section(name: str) -> Any:
    """The spec's field ``name`` with its default and description, so neither is written twice."""
    field = FSDPTrainingSpec.model_fields[name]
    if name in REQUIRED_SECTIONS:
        return Field(description=field.description)
    if field.default_factory is not None:
        return Field(default_factory=field.default_factory, description=field.description)
    return Field(default=field.default, description=field.description)


class TrainerConfig(ApiModel):
    """Everything ``python -m fsdp_trainer --config train.yaml`` reads."""

    job: JobInfo = Field(default_factory=JobInfo, description="Job identity.")
    model: ModelSpec = _section("model")
    data: DataSpec = _section("data")
    training: TrainingSpec = _section("training")
    fsdp: FSDPSpec = _section("fsdp")
    parallelism: ParallelismSpec = _section("parallelism")
    peft: PeftSpec | None = _section("peft")
    checkpoint: CheckpointSpec = _section("checkpoint")
    metrics: MetricsSpec = _section("metrics")
    stall: StallSpec = _section("stall")
    tracking: TrackingSpec = _section("tracking")

    # The spec's own rule: a CLI override is checked like kubectl apply.
    rules: ClassVar[tuple[Rule, ...]] = (
        SEQ_LEN_RULE,
        *PREFERENCE_RULES,
        *TENSOR_CONFIG_RULES,
        *CONTEXT_CONFIG_RULES,
        *EXPERT_CONFIG_RULES,
        *PIPELINE_CONFIG_RULES,
    )

    @classmethod
    def from_spec(cls, spec: FSDPTrainingSpec, name: str, namespace: str) -> TrainerConfig:
        if spec.runs_own_script:
            raise ValueError(f"{name}: spec.command runs your own script, which has no built-in trainer config")
        return cls(job=JobInfo(name=name, namespace=namespace), **{s: getattr(spec, s) for s in SECTIONS})

    def seq_len(self, max_positions: int | None = None) -> int:
        """Tokens per sequence; ``max_positions``: the model's maximum when known only from its config.json."""
        return effective_seq_len(self.training, self.model, max_positions)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def to_yaml(self) -> str:
        # libyaml's dumper gives identical output about 4x faster: rendering
        # sits on the operator's reconcile path.
        return yaml.dump(self.to_dict(), Dumper=_DUMPER, sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> TrainerConfig:
        return cls.model_validate(kubeyaml.load(text) or {})
