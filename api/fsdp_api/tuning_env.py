"""The NCCL and EFA variables the operator sets by default, which ``spec.env`` may replace.

Unlike the variables derived from the spec (``contract.OPERATOR_ENV``, which
``spec.env`` may not name), these are tuning defaults a user may have a
reason to change (``NCCL_DEBUG=INFO`` to debug a hang, another
``NCCL_SOCKET_IFNAME`` on a custom CNI). Replacing one is allowed but never
silent: ``env_notes`` gives the line ``validate`` prints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .contract import ENV_TRAINER_FAULT
from .faults import parse_fault

if TYPE_CHECKING:
    from .spec import FSDPTrainingSpec

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


def tuning_defaults(spec: FSDPTrainingSpec) -> dict[str, str]:
    """The defaults this spec's pods get: GPU_ENV on GPU jobs, EFA_ENV with EFA interfaces."""
    defaults: dict[str, str] = {}
    if spec.resources.gpus_per_node > 0:
        defaults |= GPU_ENV
    if spec.resources.efa_per_node > 0:
        defaults |= EFA_ENV
    return defaults


def env_notes(spec: FSDPTrainingSpec) -> list[str]:
    """One line per ``spec.env`` entry that changes what the operator would set, or arms the fault hook."""
    defaults = tuning_defaults(spec)
    notes = []
    for i, entry in enumerate(spec.env):
        where = f"spec.env[{i}]"
        if entry.name in defaults:
            value = repr(entry.value) if entry.value is not None else "a value from valueFrom"
            notes.append(f"{where}: {entry.name}={value} replaces the operator's default {defaults[entry.name]!r}")
        elif entry.name == ENV_TRAINER_FAULT and entry.value:
            notes.append(f"{where}: {ENV_TRAINER_FAULT} (a test hook) is set: {parse_fault(entry.value).describe()}")
    return notes
