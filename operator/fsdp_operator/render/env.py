"""The trainer container's environment: identity, writable paths, NCCL/EFA, then the user's.

Secrets never appear here as values: the API rejects literal credentials, and
``valueFrom.secretKeyRef`` is passed through untouched.
"""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec, contract
from fsdp_api.contract import (
    ENV_CHECKPOINT_DIR,
    ENV_CONFIG,
    ENV_JOB_NAME,
    ENV_JOB_NAMESPACE,
    ENV_METRICS_PORT,
    ENV_POD_IP,
    ENV_SEPARATE_RDZV_STORE,
    ENV_SHUTDOWN_TIMEOUT,
    ENV_TRAINING_IMAGE,
    ENV_TRAINING_UID,
    ENV_WANDB_API_KEY,
)
from fsdp_api.tuning_env import tuning_defaults

Env = list[dict[str, Any]]


def _literal(values: dict[str, str]) -> Env:
    return [{"name": k, "value": v} for k, v in values.items()]


# Seconds of the grace period kept for torchrun and the container's PID 1 to exit.
SHUTDOWN_MARGIN_SECONDS = 15


def shutdown_timeout(spec: FSDPTrainingSpec) -> int:
    return max(0, spec.pod.termination_grace_period_seconds - SHUTDOWN_MARGIN_SECONDS)


def container_env(spec: FSDPTrainingSpec, name: str, uid: str | None = None) -> Env:
    """Operator-set variables first, then ``spec.env``, which may reference ours with ``$(VAR)``.

    The API refuses a spec.env entry named like a variable derived from the
    spec (``contract.OPERATOR_ENV``); one of the tuning variables (NCCL, EFA,
    ``fsdp_api.tuning_env``) replaces ours of the same name, and ``validate``
    says so.
    """
    env: Env = [
        {"name": ENV_JOB_NAME, "value": name},
        {"name": ENV_JOB_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": ENV_CHECKPOINT_DIR, "value": spec.checkpoint.dir},
        # The root filesystem is read-only: everything that caches (HF hub,
        # torch/triton compile caches under ~/.cache) goes to the HOME emptyDir.
        {"name": "HOME", "value": contract.HOME_DIR},
        {"name": "HF_HOME", "value": contract.HF_HOME},
        # torchrun's agent on the rendezvous host shares its TCP store with
        # the workers; when another pod's container restarts alone, the fresh
        # agent then waits forever for rendezvous info the survivor never
        # rewrites for the new round (pytorch/pytorch#135712, reproduced by
        # tests/e2e/test_faults.py). A separate store per round avoids it.
        {"name": ENV_SEPARATE_RDZV_STORE, "value": "1"},
        # On SIGTERM torchrun waits this long for the ranks' checkpoint save
        # before it SIGKILLs them (default 30 s; torch/distributed/launcher/api.py,
        # LaunchConfig.shutdown_timeout, torch 2.15): most of the pod's grace
        # period, leaving torchrun and the check time to exit (docs/renderer.md).
        {"name": ENV_SHUTDOWN_TIMEOUT, "value": str(shutdown_timeout(spec))},
        # Node 0 of a TrainJob hosts the rendezvous at this address rather than under
        # a name only cluster DNS knows (render/command.py, fsdp_trainer/check.py).
        {"name": ENV_POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if not spec.runs_own_script:
        env.insert(2, {"name": ENV_CONFIG, "value": contract.CONFIG_PATH})
    if uid:  # the operator's render: the trackers' tags (contract.ENV_TRAINING_UID says why only there)
        env += [{"name": ENV_TRAINING_UID, "value": uid}, {"name": ENV_TRAINING_IMAGE, "value": spec.image}]
    if spec.metrics.enabled:
        env.append({"name": ENV_METRICS_PORT, "value": str(spec.metrics.port)})
    env += _tracker_credentials(spec)
    env += _literal(tuning_defaults(spec))
    user = [e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in spec.env]
    overridden = {e["name"] for e in user}
    return [e for e in env if e["name"] not in overridden] + user


def _tracker_credentials(spec: FSDPTrainingSpec) -> Env:
    """W&B's API key from its Secret, optional: a missing one is the pod check's one line, not a pod stuck
    in CreateContainerConfigError (fsdp_trainer/tracking/wandb.py, ``preflight``)."""
    wandb = spec.tracking.wandb
    if wandb is None or wandb.api_key_secret is None:
        return []
    ref = {"name": wandb.api_key_secret.name, "key": wandb.api_key_secret.key, "optional": True}
    return [{"name": ENV_WANDB_API_KEY, "valueFrom": {"secretKeyRef": ref}}]
