"""Faults and lifecycle, end to end: a worker killed mid-training, the operators killed mid-reconcile,
suspend/resume, and deletion. Every recovery goes through the real controllers."""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fsdp_k8s import Client
from fsdp_localcluster.control_plane import TRAINING_OPERATOR
from fsdp_localcluster.images import LOCAL_TRAINER_IMAGE, require_images
from fsdp_localcluster.node_agent import container_pids
from fsdp_localcluster.operator_install import OPERATOR_NAMESPACE
from fsdp_localcluster.wait import wait_for
from fsdp_localcluster.whole_cluster import WholeCluster
from fsdp_operator.cli import main

from tests.e2e.namespaces import own_namespace
from tests.e2e.timings import record
from tests.e2e.training import (
    RESUMED,
    STEP_LINE,
    STOPPED,
    TERMINAL,
    assert_resumed_exactly,
    checkpoint_steps,
    conditions,
    create_claim,
    dump,
    fsdptraining,
    last_step,
    pods_of,
    saved_on_sigterm,
    status,
    step_losses,
    trainer_logs,
    wait_phase,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def ns(operator: WholeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from own_namespace(operator, "fault-", request)


def running_markers(whole: WholeCluster, name: str, ns: str) -> list[str]:
    """The process markers of the job's running containers (to prove they are gone later)."""
    markers = []
    for pod in pods_of(whole, name, ns):
        worker = whole.node_agent.find_worker(ns, pod["metadata"]["name"])
        if worker is not None and worker.container().running:
            markers.append(worker.container().marker)
    return markers


def test_killed_worker_restarts_and_resumes_from_the_last_checkpoint(operator: WholeCluster, ns: str) -> None:
    whole, name, max_steps, interval = operator, "crash", 40, 10
    create_claim(whole, ns)
    require_images()  # the trainer pods run from the image built from the Dockerfile
    whole.cluster.apply(fsdptraining(name, ns, max_steps=max_steps, interval=interval, image=LOCAL_TRAINER_IMAGE))
    # Mid-interval, after a complete checkpoint.
    wait_for(
        lambda: 10 in checkpoint_steps(whole, ns) and last_step(whole, name, ns) >= 13,
        300,
        "checkpoint 10 and step 13",
    )
    killed_at = last_step(whole, name, ns)
    saved = max(checkpoint_steps(whole, ns))
    t_kill = time.monotonic()
    victim = f"{name}-worker-1"
    # The whole container (torchrun and its worker), as an OOM kill or a lost node would.
    assert whole.node_agent.kill(ns, victim, sig=signal.SIGKILL) >= 2

    def restarted() -> dict[str, Any] | None:
        pod = whole.get("pod", victim, ns) or {}
        cs = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0]
        return cs if cs.get("restartCount", 0) >= 1 and "running" in cs.get("state", {}) else None

    cs = wait_for(restarted, 60, f"{victim} to be restarted")
    assert cs["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL
    # Both runs were containers from the trainer image (the node agent's image mode), each a new one.
    assert cs["containerID"].startswith("podman://") and cs["lastState"]["terminated"]["containerID"].startswith(
        "podman://"
    )
    assert cs["containerID"] != cs["lastState"]["terminated"]["containerID"]
    try:
        wait_for(lambda: last_step(whole, name, ns) > killed_at, 150, f"training to get past step {killed_at} again")
    except AssertionError as e:
        env = {e["name"] for e in whole.get("pod", victim, ns)["spec"]["containers"][0].get("env", [])}
        hint = (
            "\nHint: the trainer runs without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; a restarted torchrun then "
            "waits forever for the store info of a round the surviving agents joined (pytorch/pytorch#135712)."
            if "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env
            else ""
        )
        raise AssertionError(f"{e}{hint}\n{whole.describe(ns)}\n{trainer_logs(whole, name, ns)[-3000:]}") from e
    record("recovery_after_kill_s", time.monotonic() - t_kill)
    record("steps_recomputed_after_kill", killed_at - saved)

    assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded"
    losses = step_losses(whole, name, ns)
    resumed = [int(m) for m in RESUMED.findall(trainer_logs(whole, name, ns))]
    assert saved in resumed, resumed
    recomputed = assert_resumed_exactly(losses, max_steps, interval, saved)
    assert recomputed, "the kill came after a checkpoint and mid-interval: some steps must be recomputed"
    assert checkpoint_steps(whole, ns) == [20, 30, 40]  # keepLast 3 of every 10 steps, the last one included
    assert status(whole, name, ns)["replicaStatuses"]["Worker"]["succeeded"] == 2


def operator_restarts(whole: WholeCluster, pod_name: str) -> int:
    pod = whole.get("pod", pod_name, OPERATOR_NAMESPACE) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount", 0))


def test_operators_killed_mid_reconcile_converge_without_duplicates(operator: WholeCluster, ns: str) -> None:
    whole, name, max_steps = operator, "chaos", 12
    agent, cp = whole.node_agent, whole.control_plane
    create_claim(whole, ns)
    seen: dict[str, int] = {"pytorchjobs": 0, "pods": 0, "configmaps": 0}
    stop = threading.Event()

    def watch_counts() -> None:
        while not stop.wait(0.3):
            try:
                seen["pytorchjobs"] = max(seen["pytorchjobs"], len(whole.list("pytorchjobs", ns)))
                live = [p for p in pods_of(whole, name, ns) if not p["metadata"].get("deletionTimestamp")]
                seen["pods"] = max(seen["pods"], len(live))
                cms = whole.list("configmaps", ns, f"training.fsdp.dev/job={name}")
                seen["configmaps"] = max(seen["configmaps"], len(cms))
            except Exception:
                continue

    counter = threading.Thread(target=watch_counts, daemon=True)
    counter.start()
    operator_pod = whole.wait_operator_ready()["metadata"]["name"]
    try:
        whole.cluster.apply(fsdptraining(name, ns, max_steps=max_steps, interval=6))
        # The operator dies while handling the new object; the kubelet (agent) restarts it.
        agent.kill(OPERATOR_NAMESPACE, operator_pod)
        wait_for(lambda: whole.get("pytorchjob", name, ns), 120, "the PyTorchJob")
        # The training operator dies while creating pods and services; it is restarted by hand.
        cp.kill(TRAINING_OPERATOR)
        # The second kill must hit a running operator (restarted after the first), or it
        # lands on a process that is still starting and the injection silently does nothing.
        wait_for(lambda: operator_restarts(whole, operator_pod) >= 1, 60, "the operator's first restart")
        whole.wait_operator_ready()
        agent.kill(OPERATOR_NAMESPACE, operator_pod)  # and the operator again, mid status update
        time.sleep(3)
        t = time.monotonic()
        cp.start_component(TRAINING_OPERATOR)
        record("training_operator_restart_s", time.monotonic() - t)
        assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded"
    finally:
        stop.set()
        counter.join(timeout=5)

    assert seen == {"pytorchjobs": 1, "pods": 2, "configmaps": 1}, seen
    assert len(whole.list("podmonitors", ns)) == 1
    assert len(whole.list("services", ns)) == 2
    final = whole.get("fsdptraining", name, ns)
    assert final is not None
    st = final["status"]
    assert st["observedGeneration"] == final["metadata"]["generation"], dump(st)
    assert st["jobName"] == name and conditions(st)["Succeeded"]["status"] == "True", dump(st)
    assert operator_restarts(whole, operator_pod) >= 2


def test_suspend_removes_the_pods_and_resume_continues_from_the_checkpoint(
    operator: WholeCluster, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the Python client, as a notebook drives it: submit, metrics, logs (followed), suspend, resume, wait."""
    whole, name, max_steps, interval = operator, "pause", 30, 10
    create_claim(whole, ns)
    client = Client(ns, kubeconfig=whole.cluster.kubeconfig)
    assert client.submit(fsdptraining(name, ns, max_steps=max_steps, interval=interval)).phase == "Pending"
    wait_for(
        lambda: 10 in checkpoint_steps(whole, ns) and last_step(whole, name, ns) >= 12,
        300,
        "checkpoint 10 and step 12",
    )
    # Rank 0's own series, read from its pod (the API server does not proxy to the local pods' loopback).
    figures = client.metrics(name)
    assert figures.step is not None and figures.step >= 12 and figures.max_steps == max_steps, figures.as_dict()
    assert figures.loss is not None and math.isfinite(figures.loss), figures.as_dict()
    rank0_steps = [int(step) for step, _, _ in STEP_LINE.findall(client.logs(name, rank=0))]
    assert rank0_steps and max(rank0_steps) >= 12, rank0_steps[-3:]
    # The CLI's view of the same training: the summary line, then the conditions' table.
    assert main(["status", name, "-n", ns, "--kubeconfig", str(whole.cluster.kubeconfig)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"{ns}/{name}: Running | step ") and "CONDITION" in shown, shown
    followed: list[str] = []
    follower = threading.Thread(target=lambda: followed.extend(client.logs(name, rank=0, follow=True)), daemon=True)
    follower.start()

    markers = running_markers(whole, name, ns)
    assert len(markers) == 2
    t = time.monotonic()
    assert client.suspend(name).body["spec"]["suspend"] is True
    wait_for(lambda: not pods_of(whole, name, ns), 120, "the pods to go away")
    record("suspend_to_pods_gone_s", time.monotonic() - t)
    assert not [m for m in markers if container_pids(m)], "processes of suspended pods still run"
    assert client.wait(name, ("Suspended",), timeout=60, poll_seconds=0.5).phase == "Suspended"
    job = whole.get("pytorchjob", name, ns)
    assert job is not None and job["spec"]["runPolicy"]["suspend"] is True
    saved = saved_on_sigterm(whole, name, ns)
    suspended_at = last_step(whole, name, ns)
    # The followed log ended with the container, on the trainer's own last words.
    follower.join(timeout=30)
    assert not follower.is_alive(), "following the log did not end with the container"
    assert any(STOPPED.search(line) for line in followed), followed[-5:]

    t = time.monotonic()
    client.resume(name)
    wait_for(lambda: last_step(whole, name, ns) > suspended_at, 240, "training to continue after resume")
    record("resume_to_progress_s", time.monotonic() - t)
    done = client.wait(name, timeout=300, poll_seconds=1)
    assert (done.phase, done.status.step) == ("Succeeded", max_steps), done.summary()
    resumed = [int(m) for m in RESUMED.findall(trainer_logs(whole, name, ns))]
    assert resumed == [saved], resumed
    assert_resumed_exactly(step_losses(whole, name, ns), max_steps, interval, saved)


def test_an_emptydir_training_with_a_remote_tier_resumes_from_s3_when_its_pods_are_gone(
    operator: WholeCluster, ns: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """checkpoint.remote and no claim: suspend deletes the pods and their emptyDirs; the new pods resume from S3."""
    from fsdp_localcluster.s3 import S3Server

    whole, name, max_steps, interval = operator, "remote", 30, 10
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    try:
        server.create_bucket("ckpt")
        keys = server.env()
        access, secret = keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"]
        literals = [f"--from-literal=access={access}", f"--from-literal=secret={secret}"]
        whole.kubectl("create", "secret", "generic", "s3", f"--namespace={ns}", *literals)
        body = fsdptraining(name, ns, max_steps=max_steps, interval=interval, claim=None)
        body["spec"]["checkpoint"]["remote"] = f"s3://ckpt/{ns}/{name}"
        body["spec"]["env"] = [
            {"name": "AWS_ENDPOINT_URL_S3", "value": server.endpoint},
            {"name": "AWS_DEFAULT_REGION", "value": keys["AWS_DEFAULT_REGION"]},
            {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "access"}}},
            {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret"}}},
        ]
        whole.cluster.apply(body)

        def committed() -> list[int]:
            return sorted(
                int(k.split("/")[-2].removeprefix("step-"))
                for k in server.keys("ckpt", f"{ns}/")
                if k.endswith("/MANIFEST.json")
            )

        wait_for(lambda: 10 in committed() and last_step(whole, name, ns) >= 12, 300, "step 10 in S3 and step 12")
        cond = conditions(status(whole, name, ns))["CheckpointsPersistent"]
        assert (cond["status"], cond["reason"]) == ("True", "RemoteTier"), cond
        whole.kubectl(
            "patch", "fsdptraining", name, f"--namespace={ns}", "--type=merge", "-p", '{"spec":{"suspend":true}}'
        )
        wait_for(lambda: not pods_of(whole, name, ns), 120, "the pods and their emptyDirs to go away")
        logs = trainer_logs(whole, name, ns)
        (stopped,) = {int(m) for m in STOPPED.findall(logs)}
        # Saved in the emptyDir on SIGTERM, and uploaded within the grace period before the pod went.
        assert stopped in committed(), (stopped, committed(), logs[-3000:])

        t = time.monotonic()
        whole.kubectl(
            "patch", "fsdptraining", name, f"--namespace={ns}", "--type=merge", "-p", '{"spec":{"suspend":false}}'
        )
        phase = wait_phase(whole, name, ns, TERMINAL, 300)
        assert phase == "Succeeded", f"{dump(status(whole, name, ns))}\n{trainer_logs(whole, name, ns)[-8000:]}"
        record("remote_resume_to_succeeded_s", time.monotonic() - t)
        logs = trainer_logs(whole, name, ns)
        assert f"downloaded step {stopped} from s3://ckpt/{ns}/{name}" in logs, logs[-3000:]
        assert [int(m) for m in RESUMED.findall(logs)] == [stopped]
        assert_resumed_exactly(step_losses(whole, name, ns), max_steps, interval, stopped)
        # Succeeded: the last step is in S3 although both emptyDirs are gone with their pods.
        assert max(committed()) == max_steps
        final = status(whole, name, ns)
        assert final["checkpoint"]["remote"] == f"s3://ckpt/{ns}/{name}" and final["checkpoint"]["ephemeral"] is False

        # The export on the cluster (the pods and their emptyDirs are gone): a Job on the system node
        # reads the remote tier with the training's S3 settings and writes the model under a new prefix.
        t = time.monotonic()
        to = f"s3://ckpt/exports/{ns}"
        assert main(["export", name, "-n", ns, "--kubeconfig", str(whole.cluster.kubeconfig), "--to", to]) == 0
        record("export_job_s", time.monotonic() - t)
        [job] = whole.list("jobs", ns)
        assert job["spec"]["template"]["spec"]["containers"][0]["command"][3] == f"s3://ckpt/{ns}/{name}"
        assert_exported_model_is_the_remote_steps(server, f"{ns}/{name}", f"exports/{ns}", tmp_path_factory)
    finally:
        server.stop()


def assert_exported_model_is_the_remote_steps(
    server: Any, remote: str, exported: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """What the Job wrote loads in transformers with the weights the trainer's own export gives here."""
    import torch
    from fsdp_trainer.export import main as export_main
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    here = tmp_path_factory.mktemp("exported")
    client = server.client()
    for key in server.keys("ckpt", exported + "/"):
        target = here / "job" / key.removeprefix(exported + "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file("ckpt", key, str(target))
    model = AutoModelForCausalLM.from_pretrained(here / "job", dtype=torch.float32)
    assert model.num_parameters() > 0
    with pytest.MonkeyPatch.context() as env:
        for key, value in server.env().items():
            env.setenv(key, value)
        assert export_main(["--checkpoint", f"s3://ckpt/{remote}", "--output", str(here / "local")]) == 0
    ours, theirs = load_file(here / "job" / "model.safetensors"), load_file(here / "local" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_deleting_the_training_collects_job_and_pods_but_keeps_checkpoints(operator: WholeCluster, ns: str) -> None:
    whole, name = operator, "gone"
    create_claim(whole, ns)
    whole.cluster.apply(fsdptraining(name, ns, max_steps=10_000, interval=5))
    wait_for(lambda: checkpoint_steps(whole, ns), 300, "a first checkpoint")
    markers = running_markers(whole, name, ns)
    assert len(markers) == 2
    t = time.monotonic()
    Client(ns, kubeconfig=whole.cluster.kubeconfig).delete(name)

    def collected() -> bool:
        left: dict[str, Any] = {
            "pytorchjobs": whole.list("pytorchjobs", ns),
            "pods": pods_of(whole, name, ns),
            "services": whole.list("services", ns),
            "configmaps": whole.list("configmaps", ns, f"training.fsdp.dev/job={name}"),
            "podmonitors": whole.list("podmonitors", ns),
        }
        return not any(left.values())

    wait_for(collected, 120, "the garbage collector to remove the job's objects")
    record("delete_to_collected_s", time.monotonic() - t)
    assert not [m for m in markers if container_pids(m)], "processes of deleted pods still run"
    # The checkpoints belong to the claim, not to the training.
    pvc = whole.get("pvc", "ckpt", ns)
    assert pvc is not None and pvc["status"]["phase"] == "Bound"
    # (The trainer may also have saved one when its pods got SIGTERM.)
    assert 5 in checkpoint_steps(whole, ns), json.dumps(checkpoint_steps(whole, ns))
