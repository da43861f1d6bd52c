"""The FSDPTraining API (training.fsdp.dev/v1alpha1): models, presets, rules, the shared names.

The bottom layer of the project: the renderer, the operator, the CLI and the
trainer all import it, and it imports neither torch nor kopf nor any of them
(tests/test_layers.py keeps it so).
"""

from .contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from .presets import PRESETS, ModelDims, PresetName
from .rules import Rule, format_errors
from .spec import (
    CheckpointSpec,
    DataSpec,
    ElasticSpec,
    EnvVar,
    FSDPSpec,
    FSDPTraining,
    FSDPTrainingSpec,
    MetricsSpec,
    ModelOverrides,
    ModelSpec,
    ResourcesSpec,
    TrainingSpec,
    check_update,
)
from .status import Condition, FSDPTrainingStatus, Phase

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "PRESETS",
    "VERSION",
    "CheckpointSpec",
    "Condition",
    "DataSpec",
    "ElasticSpec",
    "EnvVar",
    "FSDPSpec",
    "FSDPTraining",
    "FSDPTrainingSpec",
    "FSDPTrainingStatus",
    "MetricsSpec",
    "ModelDims",
    "ModelOverrides",
    "ModelSpec",
    "Phase",
    "PresetName",
    "ResourcesSpec",
    "Rule",
    "TrainingSpec",
    "check_update",
    "format_errors",
]
