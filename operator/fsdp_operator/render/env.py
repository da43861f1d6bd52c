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
    ENV_SEPARATE_RDZV_STORE,
    ENV_SHUTDOWN_TIMEOUT,
)

Env = list[dict[str, Any]]

# Set on every GPU job. Without async error handling a rank that dies leaves
# the others blocked in a collective until the NCCL timeout; with it they
# abort, torchrun exits non-zero and the pod restarts from the last checkpoint.
# (PyTorch >= 2.2 reads the TORCH_-prefixed name; NCCL_ASYNC_ERROR_HANDLING is
# the deprecated spelling.) NCCL's socket transport (bootstrap, and all
# traffic without EFA) must use the pod's eth0, never loopback or a bridge.
GPU_ENV: dict[str, str] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "NCCL_SOCKET_IFNAME": "^lo,docker",
    "NCCL_DEBUG": "WARN",
}

# Set when EFA interfaces are requested; see docs/renderer.md for the sources.
# FI_PROVIDER pins libfabric (used by NCCL via the aws-ofi-nccl plugin) to EFA
# instead of silently falling back to TCP. FI_EFA_USE_DEVICE_RDMA is left
# unset on purpose: libfabric's EFA provider already uses device RDMA where the
# NIC has RDMA read (p4d, p5 and later), and when the variable is set to 1 on a
# NIC without it (g5, g6, g6e) it prints "FI_EFA_USE_DEVICE_RDMA=1 was set by
# user, but EFA device has no rdma-read capability" and calls abort()
# (prov/efa/src/rdm, efa_rdm_get_use_device_rdma). FI_EFA_FORK_SAFE keeps
# registered memory valid in forked DataLoader workers. FI_EFA_USE_HUGE_PAGE=0:
# the pod requests no hugepages-* resource, so libfabric must not try to back
# its buffers with them.
EFA_ENV: dict[str, str] = {
    "FI_PROVIDER": "efa",
    "FI_EFA_FORK_SAFE": "1",
    "FI_EFA_USE_HUGE_PAGE": "0",
}


def _literal(values: dict[str, str]) -> Env:
    return [{"name": k, "value": v} for k, v in values.items()]


# Seconds of the grace period kept for torchrun and the container's PID 1 to exit.
SHUTDOWN_MARGIN_SECONDS = 15


def shutdown_timeout(spec: FSDPTrainingSpec) -> int:
    return max(0, spec.pod.termination_grace_period_seconds - SHUTDOWN_MARGIN_SECONDS)


def container_env(spec: FSDPTrainingSpec, name: str) -> Env:
    """Operator-set variables first, then ``spec.env``, which may reference ours with ``$(VAR)``.

    The API refuses a spec.env entry named like a variable derived from the
    spec (``contract.OPERATOR_ENV``); one of the tuning variables (NCCL, EFA)
    replaces ours of the same name.
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
    ]
    if not spec.runs_own_script:
        env.insert(2, {"name": ENV_CONFIG, "value": contract.CONFIG_PATH})
    if spec.metrics.enabled:
        env.append({"name": ENV_METRICS_PORT, "value": str(spec.metrics.port)})
    if spec.resources.gpus_per_node > 0:
        env += _literal(GPU_ENV)
    if spec.resources.efa_per_node > 0:
        env += _literal(EFA_ENV)
    user = [e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in spec.env]
    overridden = {e["name"] for e in user}
    return [e for e in env if e["name"] not in overridden] + user
