"""Applying a queued training against a fake API: what the operator writes when Kueue does not manage
the job, when the apply fails, and when Kueue has admitted a TrainJob.

The whole-cluster tests (tests/e2e/test_trainjob.py) show the same against the real Kueue and Trainer.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf
import pytest
from fsdp_api.contract import KUEUE_HOLD_ANNOTATION, NOT_MANAGED_BY_KUEUE
from fsdp_operator.controller import sync
from fsdp_operator.controller.applies import apply_training, rendered_objects
from fsdp_operator.controller.kube import ApiError, ApplyResult
from fsdp_operator.controller.metrics import OperatorMetrics
from fsdp_operator.controller.state import Runtime

from tests.operator.status_fixtures import training

Json = dict[str, Any]
QUEUED = {"scheduling": {"queue": "team-a"}, "resources": {"nodes": 2}}
REFUSED = '{"message": "RuntimePatches can only be modified when the TrainJob is suspended", "reason": "Forbidden"}'


class FakeApi:
    """Records the operator's writes; ``existing`` answers GETs, ``refuse`` fails the job's apply."""

    def __init__(self, existing: dict[str, Json] | None = None, refuse: bool = False) -> None:
        self.existing = existing or {}
        self.refuse = refuse
        self.applied: list[str] = []
        self.bodies: dict[str, Json] = {}
        self.merge_patches: list[tuple[str, str, Json]] = []

    async def get(self, api_version: str, kind: str, ns: str | None, name: str) -> Json | None:
        return copy.deepcopy(self.existing.get(kind))

    async def apply(self, obj: Json) -> ApplyResult:
        kind = obj["kind"]
        if kind in ("PyTorchJob", "TrainJob") and self.refuse:
            raise ApiError(403, "PATCH", f"/{kind}", REFUSED)
        self.applied.append(kind)
        self.bodies[kind] = copy.deepcopy(obj)
        body = copy.deepcopy(obj)
        body["metadata"]["uid"] = f"uid-{kind}"
        return ApplyResult(body=body, created=kind not in self.existing)

    async def merge_patch(self, api_version: str, kind: str, ns: str | None, name: str, patch: Json) -> Json:
        self.merge_patches.append((kind, name, copy.deepcopy(patch)))
        obj = copy.deepcopy(self.existing.get(kind) or {"kind": kind, "metadata": {"name": name, "namespace": ns}})
        for key, value in patch.items():
            obj.setdefault(key, {}).update(value) if isinstance(value, dict) else obj.__setitem__(key, value)
        return obj

    async def patch_status(self, api_version: str, kind: str, ns: str, name: str, patch: Json) -> Json:
        return {"metadata": {"resourceVersion": "2"}, "status": patch}

    async def list(self, *args: Any, **kwargs: Any) -> list[Json]:
        return []


@pytest.fixture(autouse=True)
def events(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The Events the sync would post through kopf (which needs a running operator's context)."""
    posted: list[Any] = []
    monkeypatch.setattr(sync, "post_events", lambda body, to_post: posted.extend(to_post))
    return posted


def run_apply(api: FakeApi, body: Json, workload: Json | None = None) -> Runtime:
    rt = Runtime(client=api, metrics=OperatorMetrics())  # type: ignore[arg-type]
    rt.remember(body)
    if workload is not None:
        rt.workloads["u-1"] = workload

    async def go() -> None:
        await apply_training(rt, body)

    asyncio.run(go())
    return rt


def render_training(body: Json) -> list[Json]:
    return rendered_objects(body)


def owned(obj: Json) -> Json:
    obj["metadata"]["ownerReferences"] = [{"uid": "u-1", "controller": True, "kind": "FSDPTraining"}]
    return obj


def test_a_queued_job_created_unsuspended_is_suspended_and_marked(events: list[Any]) -> None:
    api = FakeApi()
    run_apply(api, training(**QUEUED))
    ((kind, name, patch),) = [p for p in api.merge_patches if p[0] == "PyTorchJob"]
    assert (kind, name) == ("PyTorchJob", "llama")
    assert patch["spec"] == {"runPolicy": {"suspend": True}}
    assert KUEUE_HOLD_ANNOTATION in patch["metadata"]["annotations"]
    (warning,) = [e for e in events if e.reason == NOT_MANAGED_BY_KUEUE]
    assert warning.type == "Warning" and "Add kubeflow.org/pytorchjob to integrations.frameworks" in warning.message


def test_a_job_kueue_suspended_at_creation_is_left_to_kueue() -> None:
    class SuspendingWebhook(FakeApi):
        async def apply(self, obj: Json) -> ApplyResult:
            result = await super().apply(obj)
            if obj["kind"] == "PyTorchJob":
                result.body["spec"]["runPolicy"]["suspend"] = True
            return result

    api = SuspendingWebhook()
    run_apply(api, training(**QUEUED))
    assert not [p for p in api.merge_patches if p[0] == "PyTorchJob"]


def test_suspend_reaches_the_workload_when_the_jobs_apply_fails() -> None:
    job = owned({"kind": "TrainJob", "metadata": {"name": "llama", "namespace": "ml"}, "spec": {"suspend": True}})
    api = FakeApi(existing={"TrainJob": job}, refuse=True)
    workload = {"metadata": {"name": "trainjob-llama-1", "namespace": "ml"}, "spec": {"active": True}}
    body = training(backend="trainjob", suspend=True, **QUEUED)
    with pytest.raises(kopf.TemporaryError, match="RuntimePatches"):
        run_apply(api, body, workload)
    assert ("Workload", "trainjob-llama-1", {"spec": {"active": False}}) in api.merge_patches


def test_a_running_trainjob_is_applied_with_what_trainer_refuses_to_change_kept() -> None:
    """An admitted queued TrainJob as Kueue wrote it back (our patch without the grace period),
    created by an operator that rendered its trainer differently."""
    (rendered,) = [o for o in render_training(training(backend="trainjob", **QUEUED)) if o["kind"] == "TrainJob"]
    running = owned(copy.deepcopy(rendered))
    running["spec"]["trainer"]["env"] = running["spec"]["trainer"]["env"][:-1]  # an older operator's
    ((patch,),) = [running["spec"]["runtimePatches"]]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    del pod["spec"]["terminationGracePeriodSeconds"]  # Kueue 0.17-0.19 drop it on admission
    running["spec"]["suspend"] = False
    running["metadata"]["annotations"]["training.fsdp.dev/generation"] = "1"
    api = FakeApi(existing={"TrainJob": running})
    run_apply(api, training(backend="trainjob", **QUEUED))
    applied = api.bodies["TrainJob"]
    assert applied["spec"]["trainer"] == running["spec"]["trainer"]
    assert applied["spec"]["runtimePatches"] == running["spec"]["runtimePatches"]
    # Suspended (queued again, or preempted), it takes the patch as rendered; the trainer never changes.
    api = FakeApi(existing={"TrainJob": {**running, "spec": {**running["spec"], "suspend": True}}})
    run_apply(api, training(backend="trainjob", **QUEUED))
    applied = api.bodies["TrainJob"]
    assert applied["spec"]["runtimePatches"] == rendered["spec"]["runtimePatches"]
    assert applied["spec"]["trainer"] == running["spec"]["trainer"]


@pytest.mark.parametrize("prune", [False, True])
def test_one_apply_validates_the_spec_once(monkeypatch: pytest.MonkeyPatch, prune: bool) -> None:
    """The model that renders the objects also plans the memory and names what a prune looks for."""
    from fsdp_api import FSDPTraining, FSDPTrainingSpec

    validated: list[str] = []
    for model in (FSDPTraining, FSDPTrainingSpec):
        original = model.model_validate

        def counting(data: Any, *args: Any, _original: Any = original, _name: str = model.__name__, **kw: Any) -> Any:
            validated.append(_name)
            return _original(data, *args, **kw)

        monkeypatch.setattr(model, "model_validate", counting)
    body = training(metrics={"enabled": False}, networkPolicy={"enabled": False})
    rt = Runtime(client=FakeApi(), metrics=OperatorMetrics())  # type: ignore[arg-type]
    rt.remember(body)
    asyncio.run(apply_training(rt, body, prune=prune))
    assert validated == ["FSDPTraining"]
    status = rt.previous_status(body) or {}
    fits = [c for c in status.get("conditions", []) if c["type"] == "FitsMemory"]
    assert fits and fits[0]["reason"], "the memory plan still reaches the status"
