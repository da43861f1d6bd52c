"""A TrainJob, seen as the status code sees a PyTorchJob: one mapping at the boundary (backend: trainjob).

``controller/status/compute.py`` reads a job's conditions (Created, Running, Restarting,
Suspended, Succeeded, Failed), ``spec.runPolicy.suspend``, replica counts and
start/completion times in the Kubeflow v1 vocabulary. A TrainJob (Trainer v2.3.0,
pkg/apis/trainer/v1alpha1/trainjob_types.go) says less: conditions Suspended,
Complete and Failed, counts of JobSet's child Jobs (not pods) per replicated
job in ``jobsStatus``, which become the replicaStatuses (key ``node``), no times. This module
translates; what a TrainJob does not say is derived from what it does:

- Created: the TrainJob exists. Running: a child Job is active and the
  TrainJob neither finished nor is suspended. There is no Restarting (JobSet's restarts
  are not in the TrainJob's status).
- startTime: when it was last resumed (the Suspended condition turning False),
  else its creation; completionTime: when Complete or Failed turned True.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsdp_api.contract import TRAINJOB_KIND

Json = dict[str, Any]

# Trainer v2's condition types, renamed to the Kubeflow v1 ones status.py knows.
RENAMED = {"Complete": "Succeeded", "Failed": "Failed", "Suspended": "Suspended"}


def _replica_statuses(status: Mapping[str, Any]) -> Json:
    """jobsStatus, by replicated job: its counts are of child Jobs (JobSet's), not of pods."""
    return {
        str(job.get("name", "")): {k: int(job.get(k) or 0) for k in ("active", "succeeded", "failed")}
        for job in status.get("jobsStatus") or []
    }


def trainjob_status(job: Mapping[str, Any]) -> Json:
    """The ``status`` of a PyTorchJob that would say what this TrainJob's status says."""
    meta = job.get("metadata") or {}
    raw = job.get("status") or {}
    kind = TRAINJOB_KIND
    name = meta.get("name", "")
    conditions = [{**c, "type": RENAMED[c["type"]]} for c in raw.get("conditions") or [] if c.get("type") in RENAMED]
    by_type = {c["type"]: c for c in conditions}
    true = {t for t, c in by_type.items() if c.get("status") == "True"}
    created_at = meta.get("creationTimestamp")
    conditions.insert(
        0,
        {
            "type": "Created",
            "status": "True",
            "reason": "TrainJobCreated",
            "message": f"{kind} {name} created; waiting for its pods",
            "lastTransitionTime": created_at,
        },
    )
    replicas = _replica_statuses(raw)
    if any(r["active"] > 0 for r in replicas.values()) and not true & {"Succeeded", "Failed", "Suspended"}:
        conditions.append(
            {
                "type": "Running",
                "status": "True",
                "reason": "TrainJobRunning",
                "message": f"{kind} {name} is running",
            }
        )
    resumed = by_type.get("Suspended")
    started = resumed.get("lastTransitionTime") if resumed and resumed.get("status") == "False" else created_at
    out: Json = {"conditions": conditions, "replicaStatuses": replicas}
    if started:
        out["startTime"] = started
    finished = next((by_type[t] for t in ("Succeeded", "Failed") if t in true), None)
    if finished is not None and finished.get("lastTransitionTime"):
        out["completionTime"] = finished["lastTransitionTime"]
    return out


def trainjob_suspended(job: Mapping[str, Any]) -> bool:
    return bool((job.get("spec") or {}).get("suspend", False))
