"""spec.backend: trainjob end to end: the operator emits a Kubeflow Trainer v2 TrainJob on the bundle's
ClusterTrainingRuntime, and the real Trainer v2.3.0 and JobSet v0.12.0 controllers (built from their Go
modules) run it down to trainer pods on the node agent; the status is the same as with a PyTorchJob."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fsdp_api.contract import JOB_COMPLETION_INDEX_LABEL, JOBSET_NAME_LABEL, TRAINJOB_RUNTIME
from fsdp_localcluster.binaries import REPO_ROOT
from fsdp_localcluster.kueue import TRAINJOB_FRAMEWORK, Kueue
from fsdp_localcluster.trainer_v2 import TrainerV2
from fsdp_localcluster.wait import wait_for
from fsdp_localcluster.whole_cluster import WholeCluster

from tests.e2e.namespaces import own_namespace
from tests.e2e.queues import EKS_TOPOLOGY, INSUFFICIENT, queue_objects
from tests.e2e.timings import record
from tests.e2e.training import (
    RESUMED,
    TERMINAL,
    assert_resumed_exactly,
    checkpoint_steps,
    conditions,
    create_claim,
    dump,
    fsdptraining,
    last_step,
    pods_of,
    restart_operator,
    saved_on_sigterm,
    status,
    step_losses,
    trainer_logs,
    wait_phase,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# What the operator logs when it re-applies a running TrainJob with Kueue's rewrite of our patch kept.
KEPT_OUR_PATCH = "keeps spec.runtimePatches as it is on the server"
RUNTIME_FILE = REPO_ROOT / "kustomize" / "components" / "trainjob" / "clustertrainingruntime.yaml"


@pytest.fixture(scope="module")
def trainer_v2(operator: WholeCluster) -> Iterator[TrainerV2]:
    """Trainer v2 + JobSet next to the session's control plane, and the bundle's runtime.

    The test cluster has Trainer v2's CRDs from the start, so the operator
    already watches TrainJobs (on a real cluster: docs/backends.md).
    """
    tv2 = TrainerV2(operator.control_plane).start()
    operator.cluster.apply(RUNTIME_FILE)
    try:
        yield tv2
    finally:
        operator.cluster.kubectl("delete", "clustertrainingruntime", TRAINJOB_RUNTIME, "--ignore-not-found")
        tv2.stop()


@pytest.fixture(scope="module")
def kueue(trainer_v2: TrainerV2, operator: WholeCluster) -> Iterator[Kueue]:
    """Kueue (with its trainer.kubeflow.org/trainjob integration); the operator restarted to watch Workloads."""
    k = Kueue(operator.control_plane).start()
    restart_operator(operator)
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture
def ns(trainer_v2: TrainerV2, operator: WholeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from own_namespace(operator, "tj-", request)


def trainjob_training(name: str, ns: str, **kw: Any) -> dict[str, Any]:
    body = fsdptraining(name, ns, **kw)
    body["spec"]["backend"] = "trainjob"
    return body


def node_pods(whole: WholeCluster, name: str, ns: str) -> dict[int, dict[str, Any]]:
    """The live trainer pods of a TrainJob by node index (JobSet names them <name>-node-0-<index>-<random>)."""
    pods = whole.list("pods", ns, selector=f"{JOBSET_NAME_LABEL}={name}")
    return {
        int(p["metadata"]["labels"][JOB_COMPLETION_INDEX_LABEL]): p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


def test_a_trainjob_training_succeeds_with_the_same_status_pods_and_checkpoints(
    operator: WholeCluster, ns: str
) -> None:
    whole, name, max_steps = operator, "tj", 30
    create_claim(whole, ns)
    t0 = time.monotonic()
    whole.cluster.apply(trainjob_training(name, ns, max_steps=max_steps, interval=10))
    wait_for(lambda: last_step(whole, name, ns) >= 1, 240, "the first training step")
    record("trainjob_apply_to_first_step_s", time.monotonic() - t0)
    running = wait_for(lambda: (st := status(whole, name, ns)).get("step") and st, 120, "status.step from the scraper")
    assert running["phase"] in ("Running", "Succeeded"), dump(running)
    assert running["loss"] > 0, dump(running)

    # The pods are the renderer's: our labels, security, volumes, the runtime's ports.
    pods = node_pods(whole, name, ns)
    assert sorted(pods) == [0, 1], sorted(pods)
    pod = pods[0]
    assert pod["metadata"]["labels"]["training.fsdp.dev/job"] == name
    assert pod["spec"]["hostname"] == f"{name}-node-0-0" and pod["spec"]["subdomain"] == name
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    assert pod["spec"]["automountServiceAccountToken"] is False
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "node"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/etc/fsdp", "/dev/shm", "/checkpoints", "/tmp"}
    assert {p["name"]: p["containerPort"] for p in container["ports"] if "name" in p} == {
        "c10d": 29400,
        "metrics": 9402,
    }
    assert f"--rdzv-endpoint={name}-node-0-0.{name}:29400" in container["args"]

    assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded"
    record("trainjob_total_s", time.monotonic() - t0)
    final = status(whole, name, ns)
    assert final["step"] == max_steps and final["checkpoint"]["lastStep"] == max_steps, dump(final)
    assert final["jobName"] == name
    # A TrainJob counts JobSet's child Jobs, not pods: one Job of two pods.
    assert final["replicaStatuses"] == {"node": {"active": 0, "succeeded": 1, "failed": 0}}, dump(final)
    assert final["startTime"] <= final["completionTime"], dump(final)
    mirrored = conditions(final)
    assert mirrored["Succeeded"]["status"] == "True" and mirrored["Created"]["status"] == "True", dump(final)
    job = whole.get("trainjob", name, ns)
    assert job is not None
    assert conditions(job["status"])["Complete"]["status"] == "True"
    assert checkpoint_steps(whole, ns) == [10, 20, 30]
    assert sorted(step_losses(whole, name, ns)) == list(range(1, max_steps + 1))


def test_a_killed_trainjob_worker_restarts_and_resumes_from_the_last_checkpoint(
    operator: WholeCluster, ns: str
) -> None:
    whole, name, max_steps, interval = operator, "tj-crash", 40, 10
    create_claim(whole, ns)
    whole.cluster.apply(trainjob_training(name, ns, max_steps=max_steps, interval=interval))
    wait_for(
        lambda: 10 in checkpoint_steps(whole, ns) and last_step(whole, name, ns) >= 13,
        300,
        "checkpoint 10 and step 13",
    )
    killed_at = last_step(whole, name, ns)
    saved = max(checkpoint_steps(whole, ns))
    t_kill = time.monotonic()
    victim = node_pods(whole, name, ns)[1]["metadata"]["name"]
    # The whole container (torchrun and its worker), as an OOM kill or a lost node would.
    assert whole.node_agent.kill(ns, victim, sig=signal.SIGKILL) >= 2

    def restarted() -> dict[str, Any] | None:
        pod = whole.get("pod", victim, ns) or {}
        cs = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0]
        return cs if cs.get("restartCount", 0) >= 1 and "running" in cs.get("state", {}) else None

    cs = wait_for(restarted, 60, f"{victim} to be restarted in place (restartPolicy OnFailure)")
    assert cs["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL
    wait_for(lambda: last_step(whole, name, ns) > killed_at, 150, f"training to get past step {killed_at} again")
    record("trainjob_recovery_after_kill_s", time.monotonic() - t_kill)

    assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded"
    resumed = [int(m) for m in RESUMED.findall(trainer_logs(whole, name, ns))]
    assert saved in resumed, resumed
    recomputed = assert_resumed_exactly(step_losses(whole, name, ns), max_steps, interval, saved)
    assert recomputed, "the kill came after a checkpoint and mid-interval: some steps must be recomputed"
    assert status(whole, name, ns)["step"] == max_steps


def test_suspending_a_trainjob_training_removes_its_pods_and_resume_continues_from_the_checkpoint(
    operator: WholeCluster, ns: str
) -> None:
    whole, name, max_steps, interval = operator, "tj-pause", 30, 10
    create_claim(whole, ns)
    whole.cluster.apply(trainjob_training(name, ns, max_steps=max_steps, interval=interval))
    wait_for(
        lambda: 10 in checkpoint_steps(whole, ns) and last_step(whole, name, ns) >= 12,
        300,
        "checkpoint 10 and step 12",
    )
    whole.kubectl("patch", "fsdptraining", name, f"--namespace={ns}", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    try:
        # Gone, not only deleted: a pod being deleted still runs its trainer, which saves its step on the way out.
        wait_for(lambda: not pods_of(whole, name, ns), 120, "the pods to go away")
    except AssertionError as e:
        jobset = whole.get("jobset.jobset.x-k8s.io", name, ns)
        raise AssertionError(
            f"{e}\n{dump(whole.get('trainjob', name, ns))}\n{dump(jobset)}\n"
            f"{dump([j.get('spec', {}).get('suspend') for j in whole.list('jobs', ns)])}\n{whole.describe(ns)}"
        ) from e
    st = wait_for(lambda: (s := status(whole, name, ns)).get("phase") == "Suspended" and s, 60, "phase Suspended")
    assert conditions(st)["Suspended"]["status"] == "True", dump(st)
    assert whole.get("trainjob", name, ns)["spec"]["suspend"] is True
    saved = saved_on_sigterm(whole, name, ns)
    suspended_at = last_step(whole, name, ns)

    whole.kubectl(
        "patch", "fsdptraining", name, f"--namespace={ns}", "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    wait_for(lambda: last_step(whole, name, ns) > suspended_at, 240, "training to continue after resume")
    assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded"
    resumed = [int(m) for m in RESUMED.findall(trainer_logs(whole, name, ns))]
    assert resumed == [saved], resumed
    assert_resumed_exactly(step_losses(whole, name, ns), max_steps, interval, saved)
    final = status(whole, name, ns)
    # startTime is the resume (the Suspended condition turning False), not the creation.
    resumed_at = conditions(whole.get("trainjob", name, ns)["status"])["Suspended"]
    assert resumed_at["status"] == "False" and final["startTime"] == resumed_at["lastTransitionTime"], dump(final)


def test_queued_trainjobs_wait_for_kueue_and_run_one_after_the_other(
    kueue: Kueue, operator: WholeCluster, ns: str
) -> None:
    """Two TrainJob trainings that each need the whole GPU quota: Kueue admits one, queues the other."""
    whole = operator
    for obj in queue_objects(ns):
        whole.cluster.apply(obj)
    create_claim(whole, ns, "ckpt-a")
    create_claim(whole, ns, "ckpt-b")

    def queued(name: str, claim: str, max_steps: int) -> dict[str, Any]:
        body = trainjob_training(name, ns, max_steps=max_steps, interval=10, claim=claim)
        body["spec"]["scheduling"] = {"queue": "team"}
        return body

    t0 = time.monotonic()
    whole.cluster.apply(queued("first", "ckpt-a", 80))
    wait_for(lambda: last_step(whole, "first", ns) >= 1, 240, "the first training's first step")
    record("trainjob_queued_apply_to_first_step_s", time.monotonic() - t0)
    first = status(whole, "first", ns)
    assert conditions(first)["Admitted"]["status"] == "True", dump(first)
    (workload,) = [w for w in whole.list("workloads.kueue.x-k8s.io", ns) if "first" in w["metadata"]["name"]]
    assert workload["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    # An operator restart re-applies running trainings. Kueue rewrote the admitted TrainJob (its
    # Trainer v2.2 types drop terminationGracePeriodSeconds from our runtime patch), and Trainer's
    # webhook refuses runtime patch changes to a TrainJob that is not suspended: the operator
    # applies the patch as it is on the server rather than fail that apply for as long as it runs.
    restart_operator(whole)
    log = wait_for(
        lambda: (text := whole.operator_logs()) and (KEPT_OUR_PATCH in text or "RuntimePatches" in text) and text,
        60,
        "the new operator to re-apply 'first'",
    )
    assert "RuntimePatches" not in log, log[-3000:]
    reconciled = conditions(status(whole, "first", ns))["Reconciled"]
    assert reconciled["status"] == "True", dump(reconciled)

    whole.cluster.apply(queued("second", "ckpt-b", 10))
    st = wait_for(
        lambda: (s := status(whole, "second", ns)).get("phase") == "Queued" and INSUFFICIENT.search(s["message"]) and s,
        60,
        "the second training to be Queued with Kueue's reason",
    )
    assert conditions(st)["Admitted"]["status"] == "False", dump(st)
    assert not node_pods(whole, "second", ns)
    # Kueue, not the operator, holds the queued TrainJob suspended.
    assert whole.get("trainjob", "second", ns)["spec"]["suspend"] is True

    assert wait_phase(whole, "first", ns, TERMINAL, 300) == "Succeeded"
    t_freed = time.monotonic()
    wait_for(
        lambda: conditions(status(whole, "second", ns)).get("Admitted", {}).get("status") == "True",
        120,
        "Kueue to admit the second training",
    )
    record("trainjob_queue_wait_to_admission_s", time.monotonic() - t_freed)
    assert wait_phase(whole, "second", ns, TERMINAL, 300) == "Succeeded"
    assert sorted(step_losses(whole, "second", ns)) == list(range(1, 11))


def test_a_queued_pytorchjob_that_kueue_does_not_manage_is_held_with_the_fix_in_its_status(
    kueue: Kueue, operator: WholeCluster, ns: str
) -> None:
    """Kueue 0.19's default install leaves kubeflow.org/pytorchjob out: a queued training on the
    PyTorchJob backend would run at once, outside its queue. It is held suspended instead, the
    status says why and what to change, and once Kueue manages PyTorchJobs it queues and runs."""
    whole = operator
    for obj in queue_objects(ns):
        whole.cluster.apply(obj)
    create_claim(whole, ns, "ckpt")
    body = fsdptraining("unmanaged", ns, max_steps=10, interval=10, claim="ckpt")
    body["spec"]["scheduling"] = {"queue": "team"}
    t0 = time.monotonic()
    kueue.stop()
    kueue.start(frameworks=(TRAINJOB_FRAMEWORK,))
    try:
        whole.cluster.apply(body)
        st = wait_for(
            lambda: (
                conditions(s := status(whole, "unmanaged", ns)).get("Admitted", {}).get("reason") == "NotManagedByKueue"
                and s
            ),
            60,
            "the status to say that Kueue does not manage the PyTorchJob",
        )
        message = conditions(st)["Admitted"]["message"]
        assert "kubeflow.org/pytorchjob" in message and "backend: trainjob" in message, message
        assert whole.get("pytorchjob", "unmanaged", ns)["spec"]["runPolicy"]["suspend"] is True
        wait_for(lambda: not pods_of(whole, "unmanaged", ns), 60, "no pod of the held job")
        assert last_step(whole, "unmanaged", ns) == 0
    finally:
        kueue.stop()
        kueue.start()
    record("kueue_restart_with_fewer_integrations_s", time.monotonic() - t0)
    # The fix the message names: Kueue now manages PyTorchJobs, finds the held one and admits it.
    wait_for(
        lambda: conditions(status(whole, "unmanaged", ns)).get("Admitted", {}).get("status") == "True",
        120,
        "Kueue to admit the held training",
    )
    assert wait_phase(whole, "unmanaged", ns, TERMINAL, 300) == "Succeeded"
    assert sorted(step_losses(whole, "unmanaged", ns)) == list(range(1, 11))


def test_kueue_places_a_training_inside_one_network_domain_and_holds_one_that_fits_in_none(
    kueue: Kueue, operator: WholeCluster, ns: str
) -> None:
    """spec.scheduling.topology with Kueue's topology-aware scheduling on both backends. The GPU nodes
    share a layer-2 domain of EKS's network and have a layer-3 domain each (whole_cluster.NETWORK_LAYERS):
    a two-node TrainJob that must fit in one layer-3 domain waits with Kueue's reason; a two-node
    PyTorchJob training in one layer-2 domain is admitted there, and its status names the domain."""
    whole = operator
    for obj in queue_objects(ns, flavor="gpu-tas"):
        whole.cluster.apply(obj)
    create_claim(whole, ns, "ckpt")

    def placed(name: str, level: str, **kw: Any) -> dict[str, Any]:
        body = fsdptraining(name, ns, max_steps=10, interval=10, instance_types=["p5.48xlarge"], **kw)
        body["spec"]["scheduling"] = {"queue": "team", "topology": {"level": level}}
        return body

    narrow = placed("narrow", "network-layer-3", claim=None)
    narrow["spec"]["backend"] = "trainjob"
    whole.cluster.apply(narrow)

    def waits_for_topology() -> dict[str, Any]:
        s = status(whole, "narrow", ns)
        assert s.get("phase") == "Queued" and "topology" in s.get("message", ""), dump(s)
        return s

    st = wait_for(waits_for_topology, 120, "the layer-3 training to wait with Kueue's topology reason")
    assert EKS_TOPOLOGY in st["message"] and "topology" not in st, dump(st)
    assert not node_pods(whole, "narrow", ns)

    t0 = time.monotonic()
    whole.cluster.apply(placed("wide", "network-layer-2"))
    st = wait_for(lambda: (s := status(whole, "wide", ns)).get("topology") and s, 120, "the layer-2 training's domain")
    assert st["topology"] == {"level": "topology.k8s.aws/network-node-layer-2", "domains": ["nn-mid"]}, dump(st)
    wait_for(lambda: last_step(whole, "wide", ns) >= 1, 240, "the layer-2 training's first step")
    record("topology_apply_to_first_step_s", time.monotonic() - t0)
    # Kueue let the pods through its scheduling gate onto one node each, in its domain.
    pods = pods_of(whole, "wide", ns)
    assert sorted(p["spec"]["nodeName"] for p in pods) == ["gpu-0", "gpu-1"], dump(pods)
    assert all(not p["spec"].get("schedulingGates") for p in pods)
    assert wait_phase(whole, "wide", ns, TERMINAL, 300) == "Succeeded"
    # Nothing changed for the one that fits nowhere.
    assert status(whole, "narrow", ns)["phase"] == "Queued"
    whole.cluster.kubectl("delete", "fsdptraining", "narrow", "-n", ns, "--wait=false")


def test_node_0_hosts_the_rendezvous_while_cluster_dns_has_no_record_of_it(
    trainer_v2: TrainerV2, operator: WholeCluster, ns: str
) -> None:
    """Node 0's rendezvous name, <name>-node-0-0.<name>, is not its hostname: torchrun finds out
    whether it hosts the store by looking that name up. Without the record (as after a JobSet
    restart, until the headless Service's endpoints catch up) node 0 would wait for a store that
    nobody hosts, for the whole read timeout (600 s). Node 0 now hosts it at its own address."""
    whole = operator
    name = "nodns"
    whole.node_agent.network.withhold(ns, f"{name}-node-0-0.{name}")
    try:
        t0 = time.monotonic()
        whole.cluster.apply(trainjob_training(name, ns, nodes=1, max_steps=5, interval=5, claim=None))
        assert wait_phase(whole, name, ns, TERMINAL, 180) == "Succeeded", trainer_logs(whole, name, ns)
        record("trainjob_without_dns_record_apply_to_succeeded_s", time.monotonic() - t0)
    finally:
        whole.node_agent.network.withhold(ns, f"{name}-node-0-0.{name}", withheld=False)
    assert "hosts the rendezvous at its own address" in trainer_logs(whole, name, ns)
