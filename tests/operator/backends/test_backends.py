"""The backend registry (operator/fsdp_operator/backends): lookups, and what each backend says of its pods."""

from __future__ import annotations

from fsdp_api.contract import BACKENDS, PYTORCHJOB, TRAINJOB
from fsdp_operator import backends


def test_the_registry_holds_one_backend_per_spec_backend_value_and_kind() -> None:
    assert set(backends.REGISTRY) == set(BACKENDS)
    assert {b.ref.kind for b in backends.REGISTRY.values()} == set(backends.BY_KIND)
    assert len({b.watch_id for b in backends.REGISTRY.values()}) == len(backends.REGISTRY)


def test_lookups_fall_back_to_the_pytorchjob_for_an_unset_backend_or_kind() -> None:
    assert backends.named(None).ref is PYTORCHJOB
    assert backends.named("trainjob").ref is TRAINJOB
    assert backends.of_training({"spec": {}}).ref is PYTORCHJOB
    assert backends.of_training({"spec": {"backend": "trainjob"}}).ref is TRAINJOB
    assert backends.of_kind(None).ref is PYTORCHJOB
    assert backends.of_kind(TRAINJOB.kind).ref is TRAINJOB


def test_each_backend_names_node_0_as_the_rendezvous_host() -> None:
    assert backends.rendezvous_endpoint(backends.named("pytorchjob"), "t") == "t-worker-0:29400"
    assert backends.rendezvous_endpoint(backends.named("trainjob"), "t") == "t-node-0-0.t:29400"


def test_pod_creation_failures_point_at_whatever_creates_the_pods() -> None:
    assert backends.named("pytorchjob").pod_creation_failures("t", "u") == (
        "involvedObject.uid=u,reason=FailedCreatePod"
    )
    assert backends.named("trainjob").pod_creation_failures("t", "u") == (
        "involvedObject.kind=Job,involvedObject.name=t-node-0,reason=FailedCreate"
    )


def test_only_the_pytorchjobs_replica_statuses_count_pods() -> None:
    assert backends.named("pytorchjob").counts_pods
    assert not backends.named("trainjob").counts_pods
