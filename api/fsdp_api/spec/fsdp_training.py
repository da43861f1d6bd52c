"""The top-level object: ``FSDPTrainingSpec`` (the sections together) and the ``FSDPTraining`` resource."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..base import ApiModel
from ..contract import API_VERSION, KIND, TRAINJOB_RUNTIME
from ..rules import Rule
from .backend_rules import BACKEND_ROOT_RULES, Backend, backend_name_error
from .checkpoint import CheckpointSpec
from .cross_field import SPEC_RULES, effective_seq_len
from .data import DataSpec
from .env import EnvVar
from .fsdp import FSDPSpec
from .health import HealthSpec
from .metrics import MetricsSpec, NetworkPolicySpec
from .model import ModelSpec
from .parallelism import ParallelismSpec
from .peft import PeftSpec
from .pod import PodSettings
from .resources import ElasticSpec, ResourcesSpec
from .scheduling import RunPolicySpec, SchedulingSpec
from .stall import StallSpec
from .tracking import TrackingSpec
from .training import TrainingSpec
from .values import DNS_LABEL, MAX_IMAGE_LENGTH, MAX_NAME_LENGTH

ScriptWord = Annotated[str, Field(min_length=1, max_length=4096, description="One word of the command line.")]


class FSDPTrainingSpec(ApiModel):
    """Desired state of an FSDP training job."""

    backend: Backend = Field(
        default="pytorchjob",
        description=(
            "What runs the pods: pytorchjob (a Kubeflow PyTorchJob, training operator v1) or trainjob "
            f"(a Kubeflow Trainer v2 TrainJob on the ClusterTrainingRuntime {TRAINJOB_RUNTIME}, which the bundle "
            "ships). Same trainer, status and checkpoints either way; trainjob refuses elastic, "
            "runPolicy.ttlSecondsAfterFinished, pod.priorityClassName, a non-default metrics.port and "
            "imagePullPolicy (docs/backends.md). Immutable."
        ),
    )

    image: str = Field(
        min_length=1,
        max_length=MAX_IMAGE_LENGTH,
        pattern=r"^[^\s]+$",
        description="Trainer container image, pinned by tag or digest (':latest' is rejected).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Image pull policy of the trainer container."
    )
    model: ModelSpec | None = Field(default=None, description="The model to train (required unless command is set).")
    data: DataSpec = Field(default_factory=DataSpec, description="Training data and tokenizer.")
    training: TrainingSpec | None = Field(
        default=None, description="Optimisation settings (required unless command is set)."
    )
    command: list[ScriptWord] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description=(
            "Your own training program instead of the built-in trainer: what torchrun runs on every rank, "
            "a script path (e.g. /workspace/train.py) or -m and a module, as torchrun takes it. The pods keep the "
            "same launch (c10d rendezvous), environment, /dev/shm, GPUs/EFA, volumes and placement "
            "(docs/your-own-script.md). model, training, peft, data and fsdp are then refused (immutable)."
        ),
    )
    args: list[ScriptWord] | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Arguments of command, after it on torchrun's command line (immutable).",
    )
    fsdp: FSDPSpec = Field(default_factory=FSDPSpec, description="FSDP2 sharding settings.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec,
        description="Tensor parallelism inside a node, beside FSDP's data parallelism (immutable).",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Nodes, GPUs, EFA and capacity.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing and resume.")
    elastic: ElasticSpec | None = Field(default=None, description="Elastic training bounds; unset: a fixed node count.")
    peft: PeftSpec | None = Field(
        default=None,
        description="LoRA fine-tuning: train adapters on the frozen base model; unset: train every weight.",
    )
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Prometheus metrics of the trainer.")
    stall: StallSpec = Field(
        default_factory=StallSpec, description="Stall watchdog: when no new step counts as stalled, and the action."
    )
    health: HealthSpec = Field(
        default_factory=HealthSpec,
        description="What happens when a node under the pods is a suspect: alert, or exclude it and restart.",
    )
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec, description="Experiment trackers rank 0 logs the training's series to."
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="Who may reach the job's pods (a NetworkPolicy)."
    )
    # maxItems bounds the per-item CEL rules' cost, or the API server rejects the CRD.
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Extra environment variables of the trainer container."
    )
    service_account_name: str | None = Field(
        default=None, pattern=DNS_LABEL, description="ServiceAccount of the training pods (e.g. for IRSA access to S3)."
    )
    suspend: bool = Field(
        default=False, description="Suspend the job: its pods are deleted; unsuspending resumes from checkpoint."
    )
    pod: PodSettings = Field(
        default_factory=PodSettings,
        description=(
            "Settings of the training pods: labels, annotations, priority class, extra volumes, node selection, "
            "tolerations, affinity and the termination grace period (immutable)."
        ),
    )
    run_policy: RunPolicySpec = Field(
        default_factory=RunPolicySpec, description="Deadlines of the job: active deadline and TTL after it finishes."
    )
    scheduling: SchedulingSpec = Field(
        default_factory=SchedulingSpec,
        description="Queueing with Kueue: the LocalQueue and the WorkloadPriorityClass (immutable).",
    )

    rules: ClassVar[tuple[Rule, ...]] = SPEC_RULES

    def seq_len(self) -> int:
        return effective_seq_len(self.builtin_training, self.builtin_model)

    @property
    def runs_own_script(self) -> bool:
        """Whether the pods run the user's command instead of the built-in trainer."""
        return self.command is not None

    # model and training are Optional only because command can replace the built-in trainer
    # (COMMAND_RULES require both unless command is set, and refuse them with it).
    @property
    def builtin_model(self) -> ModelSpec:
        """``model`` of a job of the built-in trainer."""
        assert self.model is not None, "a job of the built-in trainer"
        return self.model

    @property
    def builtin_training(self) -> TrainingSpec:
        """``training`` of a job of the built-in trainer."""
        assert self.training is not None, "a job of the built-in trainer"
        return self.training

    def procs_per_node(self) -> int:
        return max(1, self.resources.gpus_per_node)

    def world_size(self) -> int:
        return self.resources.nodes * self.procs_per_node()


class ObjectMeta(BaseModel):
    """The subset of metav1.ObjectMeta the API checks; the rest passes through."""

    model_config = ConfigDict(extra="allow")
    name: str | None = None
    generate_name: str | None = Field(default=None, alias="generateName")
    namespace: str | None = None
    uid: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is None:
            return v
        # PydanticCustomError, not ValueError: no "Value error, " prefix, so the
        # message is exactly the one the API server's root CEL rule gives.
        if not re.match(DNS_LABEL, v):
            raise PydanticCustomError("fsdp_rule", NAME_PATTERN_MESSAGE)
        if len(v) > MAX_NAME_LENGTH:
            raise PydanticCustomError("fsdp_rule", NAME_LENGTH_MESSAGE)
        return v


NAME_PATTERN_MESSAGE = (
    "name must be a DNS label (lowercase letters, digits and '-', starting with a letter) "
    "because pods and services are named after it"
)
NAME_LENGTH_MESSAGE = (
    f"name must be at most {MAX_NAME_LENGTH} characters so that <name>-worker-<index> stays a valid DNS label"
)
ROOT_RULES: tuple[dict[str, str], ...] = (
    {
        "rule": f"!has(self.metadata.name) || self.metadata.name.matches('{DNS_LABEL}')",
        "message": NAME_PATTERN_MESSAGE,
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": f"!has(self.metadata.name) || size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        "message": NAME_LENGTH_MESSAGE,
        "fieldPath": ".metadata.name",
        "reason": "FieldValueInvalid",
    },
    *BACKEND_ROOT_RULES,
)


class FSDPTraining(BaseModel):
    """An FSDPTraining resource as read from YAML or from the API server."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    api_version: Literal["training.fsdp.dev/v1alpha1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["FSDPTraining"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: FSDPTrainingSpec

    @model_validator(mode="after")
    def _backend_name(self) -> FSDPTraining:
        name = self.metadata.name
        message = backend_name_error(name, self.spec.backend) if name else None
        if message is not None:
            raise PydanticCustomError("fsdp_rule", message, {"field_path": ".metadata.name"})
        return self

    @property
    def name(self) -> str:
        assert self.metadata.name, "metadata.name is required"
        return self.metadata.name
