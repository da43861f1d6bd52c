"""The ``FSDPTraining`` spec: the single source of truth for the API, one module per concern.

The CRD schema (``fsdp_operator.crd``), the renderer, the trainer's config and
the docs' API reference are all derived from these models. Every field has a
description because it becomes ``kubectl explain`` output.

The trainer's sections (``model``, ``data``, ``training``, ``fsdp``, ``peft``,
``checkpoint``, ``metrics``, ``stall``), the re-modelled Kubernetes pod types
(``env``, ``placement``, ``volumes``, ``pod``), where the job runs
(``resources``, ``scheduling``), the rules across sections (``cross_field``),
the rules of each backend (``backend_rules``), the top-level object
(``fsdp_training``) and what may change on a live job (``updates``). Every
name is re-exported here.
"""

from .backend_rules import (
    BACKEND_RULES,
    TORCHRUN_RESERVED_ENV,
    TRAINJOB_FROZEN,
    TRAINJOB_FROZEN_RULE,
    TRAINJOB_MAX_NAME_LENGTH,
    TRAINJOB_NAME_LENGTH_MESSAGE,
    Backend,
)
from .checkpoint import CheckpointSpec
from .cross_field import (
    COMMAND_RULES,
    CONTEXT_CONFIG_RULES,
    DEFAULT_SEQ_LEN,
    PREFERENCE_RULES,
    SEQ_LEN_RULE,
    TENSOR_CONFIG_RULES,
    effective_seq_len,
)
from .data import DataSpec
from .env import SECRET_ENV_PATTERN, EnvVar, EnvVarSource, FieldSelector, KeySelector
from .expert_rules import EXPERT_CONFIG_RULES
from .fsdp import FSDPSpec
from .fsdp_training import (
    NAME_LENGTH_MESSAGE,
    NAME_PATTERN_MESSAGE,
    ROOT_RULES,
    FSDPTraining,
    FSDPTrainingSpec,
    ObjectMeta,
    ScriptWord,
)
from .health import HealthSpec
from .metrics import MetricsSpec, NetworkPolicySpec
from .model import ModelOverrides, ModelSpec
from .parallelism import MAX_EXPERT, MAX_PIPELINE, MAX_TENSOR, ParallelismSpec
from .peft import MODULE_NAME_PATTERN, ModuleName, PeftSpec
from .pipeline_rules import PIPELINE_CONFIG_RULES
from .placement import (
    Affinity,
    LabelSelector,
    LabelSelectorRequirement,
    NodeAffinity,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinity,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    Toleration,
    WeightedPodAffinityTerm,
)
from .pod import DEFAULT_GRACE_SECONDS, DO_NOT_DISRUPT, KARPENTER_SELECTOR_KEYS, RESERVED_KEY_PREFIXES, PodSettings
from .preference import PreferenceSpec
from .resources import GPU_INSTANCE_PATTERN, ElasticSpec, ResourcesSpec
from .samples import SamplesSpec
from .scheduling import RunPolicySpec, SchedulingSpec, TopologySpec
from .stall import StallSpec
from .tracking import MlflowSpec, TensorBoardSpec, TrackingSpec, WandbSpec
from .training import TrainingSpec
from .updates import IMMUTABLE_FIELDS, check_update, immutable_rule
from .values import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    IMAGE_PINNED_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_IMAGE_LENGTH,
    MAX_NAME_LENGTH,
    MAX_NODES,
    QUALIFIED_NAME_PATTERN,
    QUANTITY_PATTERN,
    AnnotationValue,
    LabelValue,
    NamespaceName,
    Quantity,
)
from .volumes import (
    NO_NESTING_MOUNTS,
    RESERVED_VOLUME_NAMES,
    ConfigMapSource,
    CSISource,
    EmptyDirSource,
    NFSSource,
    PersistentVolumeClaimSource,
    SecretSource,
    Volume,
    VolumeMount,
)

__all__ = [
    "BACKEND_RULES",
    "COMMAND_RULES",
    "CONTEXT_CONFIG_RULES",
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_SEQ_LEN",
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "DO_NOT_DISRUPT",
    "EXPERT_CONFIG_RULES",
    "GPU_INSTANCE_PATTERN",
    "IMAGE_PINNED_PATTERN",
    "IMMUTABLE_FIELDS",
    "KARPENTER_SELECTOR_KEYS",
    "LABEL_VALUE_PATTERN",
    "MAX_EXPERT",
    "MAX_IMAGE_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_NODES",
    "MAX_PIPELINE",
    "MAX_TENSOR",
    "MODULE_NAME_PATTERN",
    "NAME_LENGTH_MESSAGE",
    "NAME_PATTERN_MESSAGE",
    "NO_NESTING_MOUNTS",
    "PIPELINE_CONFIG_RULES",
    "PREFERENCE_RULES",
    "QUALIFIED_NAME_PATTERN",
    "QUANTITY_PATTERN",
    "RESERVED_KEY_PREFIXES",
    "RESERVED_VOLUME_NAMES",
    "ROOT_RULES",
    "SECRET_ENV_PATTERN",
    "SEQ_LEN_RULE",
    "TENSOR_CONFIG_RULES",
    "TORCHRUN_RESERVED_ENV",
    "TRAINJOB_FROZEN",
    "TRAINJOB_FROZEN_RULE",
    "TRAINJOB_MAX_NAME_LENGTH",
    "TRAINJOB_NAME_LENGTH_MESSAGE",
    "Affinity",
    "AnnotationValue",
    "Backend",
    "CSISource",
    "CheckpointSpec",
    "ConfigMapSource",
    "DataSpec",
    "ElasticSpec",
    "EmptyDirSource",
    "EnvVar",
    "EnvVarSource",
    "FSDPSpec",
    "FSDPTraining",
    "FSDPTrainingSpec",
    "FieldSelector",
    "HealthSpec",
    "KeySelector",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LabelValue",
    "MetricsSpec",
    "MlflowSpec",
    "ModelOverrides",
    "ModelSpec",
    "ModuleName",
    "NFSSource",
    "NamespaceName",
    "NetworkPolicySpec",
    "NodeAffinity",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "ObjectMeta",
    "ParallelismSpec",
    "PeftSpec",
    "PersistentVolumeClaimSource",
    "PodAffinity",
    "PodAffinityTerm",
    "PodSettings",
    "PreferenceSpec",
    "PreferredSchedulingTerm",
    "Quantity",
    "ResourcesSpec",
    "RunPolicySpec",
    "SamplesSpec",
    "SchedulingSpec",
    "ScriptWord",
    "SecretSource",
    "StallSpec",
    "TensorBoardSpec",
    "Toleration",
    "TopologySpec",
    "TrackingSpec",
    "TrainingSpec",
    "Volume",
    "VolumeMount",
    "WandbSpec",
    "WeightedPodAffinityTerm",
    "check_update",
    "effective_seq_len",
    "immutable_rule",
]
