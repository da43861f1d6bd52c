"""What an existing TrainJob keeps when its training is applied again: the parts Trainer refuses to change.

Trainer v2.3.0 refuses any change to ``spec.trainer`` ("self == oldSelf",
pkg/apis/trainer/v1alpha1/trainjob_types.go) and any change to
``spec.runtimePatches`` while the TrainJob stays unsuspended (the JobSet
plugin's checkRuntimePatchesImmutability). Re-applying a training (an operator
restart, an upgrade that renders differently, a spec edit) would then fail for
as long as the TrainJob lives. Two writers make that certain, not rare: Kueue
0.17-0.19 write an admitted TrainJob back with Trainer v2.2's types, which drop
our patch's terminationGracePeriodSeconds, and an operator upgrade may render
the trainer's command or environment differently. So the apply carries those
parts over from the TrainJob on the server whenever the server would refuse
ours; the rest (labels, suspend, the deadline) is applied as rendered.
"""

from __future__ import annotations

import copy
from typing import Any

from fsdp_api.contract import TRAINJOB_PATCH_MANAGER

from .trainjob_view import trainjob_suspended

Obj = dict[str, Any]

TRAINER = "spec.trainer"
RUNTIME_PATCH = "spec.runtimePatches"


def _our_patch(job: Obj) -> tuple[int, Obj] | None:
    for i, patch in enumerate((job.get("spec") or {}).get("runtimePatches") or []):
        if patch.get("manager") == TRAINJOB_PATCH_MANAGER:
            return i, patch
    return None


def keep_immutable(rendered: Obj, existing: Obj) -> tuple[Obj, tuple[str, ...]]:
    """``rendered`` with the fields the server would refuse to change taken from ``existing``, and which."""
    job = copy.deepcopy(rendered)
    spec = job["spec"]
    kept: list[str] = []
    old_trainer = (existing.get("spec") or {}).get("trainer")
    if old_trainer is not None and spec.get("trainer") != old_trainer:
        spec["trainer"] = copy.deepcopy(old_trainer)
        kept.append(TRAINER)
    # "Suspended before or after the update": an apply that suspends it may change the patch.
    stays_running = not trainjob_suspended(existing) and not spec.get("suspend", False)
    old, new = _our_patch(existing), _our_patch(job)
    if stays_running and old is not None and new is not None and new[1] != old[1]:
        spec["runtimePatches"][new[0]] = copy.deepcopy(old[1])
        kept.append(RUNTIME_PATCH)
    return job, tuple(kept)
