"""What an existing TrainJob keeps when its training is applied again (backends/trainjob_keep.py).

Trainer v2.3.0 refuses any change to spec.trainer, and to spec.runtimePatches unless the TrainJob is
suspended before or after the update; tests/e2e/test_trainjob.py shows its webhook doing so.
"""

from __future__ import annotations

import copy
from typing import Any

from fsdp_api.contract import TRAINJOB_PATCH_MANAGER
from fsdp_operator.backends.trainjob_keep import RUNTIME_PATCH, TRAINER, keep_immutable

KUEUES = {"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": {"template": {}}}


def trainjob(command: str = "torchrun", grace: int | None = 300, suspend: bool | None = False) -> dict[str, Any]:
    pod: dict[str, Any] = {"nodeSelector": {"pool": "gpu"}}
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace
    spec: dict[str, Any] = {
        "trainer": {"command": [command], "numNodes": 2},
        "runtimePatches": [{"manager": TRAINJOB_PATCH_MANAGER, "pod": pod}, KUEUES],
    }
    if suspend is not None:
        spec["suspend"] = suspend
    return {"kind": "TrainJob", "metadata": {"name": "llama"}, "spec": spec}


def test_the_same_job_keeps_nothing() -> None:
    job, kept = keep_immutable(trainjob(), trainjob())
    assert (job, kept) == (trainjob(), ())


def test_the_trainer_is_always_the_servers() -> None:
    existing = trainjob(command="python")
    for running in (True, False):
        existing["spec"]["suspend"] = not running
        job, kept = keep_immutable(trainjob(), existing)
        assert job["spec"]["trainer"] == {"command": ["python"], "numNodes": 2}
        assert TRAINER in kept


def test_our_patch_is_the_servers_while_the_job_runs_and_stays_running() -> None:
    # Kueue 0.17-0.19 wrote it back without the grace period.
    existing = trainjob(grace=None)
    job, kept = keep_immutable(trainjob(suspend=None), existing)  # a queued job: Kueue owns suspend
    assert kept == (RUNTIME_PATCH,)
    assert job["spec"]["runtimePatches"] == existing["spec"]["runtimePatches"]
    # Kueue's own entry is never ours to keep or change.
    assert job["spec"]["runtimePatches"][1] == KUEUES


def test_a_suspended_job_or_an_apply_that_suspends_it_takes_our_patch() -> None:
    rendered = trainjob()
    job, kept = keep_immutable(rendered, trainjob(grace=None, suspend=True))
    assert (job["spec"]["runtimePatches"], kept) == (rendered["spec"]["runtimePatches"], ())
    suspending = trainjob(suspend=True)
    job, kept = keep_immutable(suspending, trainjob(grace=None))
    assert (job["spec"]["runtimePatches"], kept) == (suspending["spec"]["runtimePatches"], ())


def test_the_rendered_job_is_not_modified() -> None:
    rendered = trainjob()
    before = copy.deepcopy(rendered)
    keep_immutable(rendered, trainjob(command="python", grace=None))
    assert rendered == before
