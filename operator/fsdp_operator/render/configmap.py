"""The trainer's ConfigMap: ``train.yaml``, the TrainerConfig the pods read at /etc/fsdp."""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec, contract
from fsdp_api.trainer_config import TrainerConfig

from .. import naming


def trainer_config(spec: FSDPTrainingSpec, name: str, namespace: str) -> TrainerConfig:
    return TrainerConfig.from_spec(spec, name=name, namespace=namespace)


def config_map(spec: FSDPTrainingSpec, name: str, namespace: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": naming.config_map_name(name),
            "namespace": namespace,
            "labels": naming.labels(name, naming.TRAINER_CONFIG),
            "annotations": dict(annotations),
        },
        "data": {contract.CONFIG_KEY: trainer_config(spec, name, namespace).to_yaml()},
    }
