"""FSDPTraining end to end: the operator (installed from kustomize/default, running as a pod), the real
training operator and scheduler, and the trainer running for real (CPU, gloo) on two Karpenter GPU nodes."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsdp_api.contract import LOSS, TENSORBOARD_SUBDIR
from fsdp_localcluster.images import LOCAL_TRAINER_IMAGE, require_images
from fsdp_localcluster.wait import wait_for
from fsdp_localcluster.whole_cluster import WholeCluster
from fsdp_trainer.tracking import series_tag

from tests.e2e.namespaces import own_namespace
from tests.e2e.timings import record
from tests.e2e.training import (
    TERMINAL,
    checkpoint_steps,
    conditions,
    create_claim,
    dump,
    fsdptraining,
    last_step,
    pods_of,
    status,
    step_losses,
    step_sampler,
    steps_per_second,
    trainer_logs,
    wait_phase,
)
from tests.trainer.tracking.board import read_scalars
from tests.trainer.tracking.mlflow_server import MlflowServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def ns(operator: WholeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from own_namespace(operator, "ft-", request)


def test_happy_path_succeeds_with_checkpoints_status_and_prometheus(
    operator: WholeCluster, ns: str, mlflow_server: MlflowServer
) -> None:
    whole, name, max_steps = operator, "happy", 30
    create_claim(whole, ns)
    t0 = time.monotonic()
    require_images()  # the trainer pods run from the image built from the Dockerfile
    training = fsdptraining(name, ns, max_steps=max_steps, interval=10, image=LOCAL_TRAINER_IMAGE)
    training["spec"]["tracking"] = {
        "tensorboard": {"flushSeconds": 1},
        # The pods reach the server on the host's loopback, as they would a Service on EKS.
        "mlflow": {"uri": mlflow_server.uri, "experiment": ns, "flushSeconds": 1},
    }
    whole.cluster.apply(training)
    pod_monitor = wait_for(lambda: whole.get("podmonitor", name, ns), 60, "the operator's PodMonitor")

    with whole.prometheus_for(pod_monitor, scrape_interval="1s") as prom:
        wait_for(lambda: last_step(whole, name, ns) >= 1, 240, "the first training step")
        record("job_start_to_first_step_s", time.monotonic() - t0)
        # The trainer runs in containers from the image built from the Dockerfile (image mode).
        ids = [p["status"]["containerStatuses"][0].get("containerID", "") for p in pods_of(whole, name, ns)]
        assert len(ids) == 2 and all(i.startswith("podman://") for i in ids), ids
        with step_sampler(whole, name, ns) as samples:
            # The operator's own progress figures appear while it runs.
            running = wait_for(lambda: (st := status(whole, name, ns)).get("step") and st, 120, "status.step")
            assert running["phase"] in ("Running", "Succeeded"), dump(running)
            if running["phase"] == "Running":
                # How far it is and the time left, from the same scrape as the step.
                assert running["progressPercentage"] == running["step"] * 100 // max_steps, dump(running)
                assert running["estimatedRemainingSeconds"] >= 0 and running["remaining"], dump(running)
            assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded"
        record("job_total_s", time.monotonic() - t0)
        record("trainer_steps_per_s", steps_per_second([(t, float(s)) for t, s in samples]))

        # Scraped by a real Prometheus while it ran: every trainer pod was up, the step moved.
        pods = f'namespace="{ns}",pod=~"{name}-worker-.*"'
        up = prom.query(f"max_over_time(up{{{pods}}}[10m])")
        assert sorted(r["metric"]["pod"] for r in up) == [f"{name}-worker-0", f"{name}-worker-1"], up
        assert all(float(r["value"][1]) == 1 for r in up), up
        end = time.time()
        series = prom.query_range(f"max(fsdp_train_step{{{pods}}})", end - 600, end, "1s")
        seen = sorted({int(float(v)) for _, v in series[0]["values"]}) if series else []
        assert len(seen) >= 3 and seen[-1] >= max_steps // 2, seen
        loss = prom.query(f"max_over_time(fsdp_train_loss{{{pods}}}[10m])")
        assert loss and all(math.isfinite(float(r["value"][1])) for r in loss), loss

    final = status(whole, name, ns)
    job = whole.get("pytorchjob", name, ns)
    assert job is not None
    # The FSDPTraining mirrors the PyTorchJob's conditions.
    mirrored = conditions(final)
    for cond in job["status"]["conditions"]:
        assert cond["type"] in mirrored, dump(final)
        assert mirrored[cond["type"]]["status"] == cond["status"], dump(final)
    assert mirrored["Succeeded"]["status"] == "True"
    assert final["jobName"] == name and final["nodes"] == 2
    assert final["step"] == max_steps and math.isfinite(final["loss"]), dump(final)
    assert (final["progressPercentage"], final["remaining"]) == (100, "0s"), dump(final)
    # Checkpoints every 10 steps plus the last, all complete, on the claim's volume.
    assert checkpoint_steps(whole, ns) == [10, 20, 30]
    record("checkpoint_steps_seen", json.dumps(checkpoint_steps(whole, ns)))
    # spec.tracking.tensorboard, from the trainer image, as its user, on the claim next to the checkpoints.
    board = Path(whole.node_agent.claim_path(ns, "ckpt")) / TENSORBOARD_SUBDIR
    logged = read_scalars(board, series_tag(LOSS))
    assert [s for s, _ in logged] == list(range(1, max_steps + 1)), logged
    assert all(math.isfinite(v) for _, v in logged), logged
    assert {(p.stat().st_uid, p.stat().st_gid) for p in board.iterdir()} == {(1000, 1000)}

    # spec.tracking.mlflow, from the trainer image's client: one run, every step once, tagged with the
    # FSDPTraining the operator rendered it from; its page is in the status.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    experiment = client.get_experiment_by_name(ns)
    [run] = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, series_tag(LOSS))
    assert sorted(m.step for m in history) == list(range(1, max_steps + 1))
    uid = whole.get("fsdptraining", name, ns)["metadata"]["uid"]
    assert (run.data.tags["fsdp.uid"], run.data.tags["fsdp.image"]) == (uid, LOCAL_TRAINER_IMAGE)
    assert run.info.status == "FINISHED" and run.info.run_name == name
    page = f"{mlflow_server.uri}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
    assert final["trackerRuns"] == {"mlflow": page}, dump(final)


def _qwen2_on_the_claim(operator: WholeCluster, ns: str, name: str, **spec: object) -> tuple[Path, str, str]:
    """A tiny Qwen2 checkpoint, its tokenizer and documents on the claim; trains ``name`` on them for 5 steps.

    The model and data sit on the claim the pods mount at /checkpoints (on
    EKS: FSx for Lustre or EFS); pods see only their volumes, not the host.
    Returns the claim's volume, the final phase and rank 0's log.
    """
    from tests.trainer.harness import build_word_tokenizer, write_ragged_jsonl
    from tests.trainer.model.architectures import build_checkpoint

    create_claim(operator, ns)
    volume = wait_for(lambda: _bound_claim(operator, ns), 60, "the claim's volume")
    build_checkpoint("qwen2", volume / "models" / "qwen2", build_word_tokenizer(volume / "tokenizer"))
    (volume / "data").mkdir()
    write_ragged_jsonl(volume / "data" / "docs.jsonl", 200)
    training = fsdptraining(
        name,
        ns,
        max_steps=5,
        interval=5,
        model={"pretrained": "/checkpoints/models/qwen2"},
        data={"path": "/checkpoints/data/docs.jsonl"},
    )
    training["spec"]["training"]["seqLen"] = 32
    training["spec"].update(spec)
    operator.cluster.apply(training)
    phase = wait_phase(operator, name, ns, TERMINAL, 300)
    return volume, phase, trainer_logs(operator, name, ns)


def test_a_pretrained_qwen2_directory_fine_tunes_on_the_cluster(operator: WholeCluster, ns: str) -> None:
    """Not a Llama: a tiny Qwen2 checkpoint with its tokenizer, read by both worker pods from the shared volume."""
    volume, phase, logs = _qwen2_on_the_claim(operator, ns, "qwen")
    assert phase == "Succeeded", logs[-4000:]
    # Rank 0's log has every step (the operator's scraped status may miss a job this short).
    losses = step_losses(operator, "qwen", ns)
    assert sorted(losses) == [1, 2, 3, 4, 5], logs[-3000:]
    assert all(math.isfinite(v) for vs in losses.values() for v in vs), losses
    assert checkpoint_steps(operator, ns) == [5]
    saved = json.loads((volume / "step-00000005" / "model_config" / "config.json").read_text())
    assert saved["model_type"] == "qwen2"


def test_lora_fine_tunes_a_pretrained_directory_and_saves_only_the_adapters(operator: WholeCluster, ns: str) -> None:
    """spec.peft on the cluster: the same tiny Qwen2 directory, LoRA adapters trained over two pods."""
    import torch.distributed.checkpoint as dcp

    peft = {"rank": 4, "targetModules": ["q_proj", "v_proj"]}
    volume, phase, logs = _qwen2_on_the_claim(operator, ns, "lora", peft=peft)
    assert phase == "Succeeded", logs[-4000:]
    assert "LoRA on 4 modules" in logs, logs[-3000:]
    assert sorted(step_losses(operator, "lora", ns)) == [1, 2, 3, 4, 5], logs[-3000:]
    assert checkpoint_steps(operator, ns) == [5]
    metadata = dcp.FileSystemReader(str(volume / "step-00000005")).read_metadata().state_dict_metadata
    model_keys = sorted(k for k in metadata if k.startswith("model."))
    # q_proj and v_proj of 2 layers, A and B each: nothing of the frozen base.
    assert len(model_keys) == 8 and all(".lora_" in k for k in model_keys), model_keys


def test_a_config_the_trainer_rejects_is_its_status_not_a_traceback(operator: WholeCluster, ns: str) -> None:
    """Admission cannot see the pod's files: the trainer's check in the pod does, and the status says what."""
    whole, name = operator, "nodata"
    missing = "/checkpoints/data/*.jsonl"  # the volume is there, the data is not
    training = fsdptraining(name, ns, max_steps=5, interval=5, nodes=1, claim=None, data={"path": missing})
    t0 = time.monotonic()
    whole.cluster.apply(training)

    def rejected() -> dict | None:
        conds = {c["type"]: c for c in status(whole, name, ns).get("conditions") or []}
        return conds.get("ConfigValid")

    cond = wait_for(rejected, 180, "the ConfigValid condition from the trainer's check")
    record("config_rejection_reported_s", time.monotonic() - t0)
    # The node agent maps the pod's mount paths to host folders, so the path is the host's here.
    expected = re.compile(
        rf"the trainer rejected its configuration in pod {name}-worker-0: "
        rf"data\.path: no \.json, \.jsonl, \.parquet, \.txt files in /\S*{re.escape(missing)}"
    )
    assert (cond["status"], cond["reason"]) == ("False", "TrainerRejectedConfig")
    assert expected.fullmatch(cond["message"]), cond["message"]
    # The container restarts in place until the backoff limit fails the job; the reason stays the check's line.
    assert wait_phase(whole, name, ns, TERMINAL, 240) == "Failed"
    final = status(whole, name, ns)
    assert final["message"] == cond["message"], dump(final)
    logs = trainer_logs(whole, name, ns)
    assert "fsdp-train: invalid trainer configuration:" in logs
    # torchrun never started: no rank ran, nothing was wrapped in an elastic-agent traceback.
    assert "Traceback" not in logs and "ChildFailedError" not in logs, logs[-3000:]
    events = json.loads(whole.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    reasons = [e["reason"] for e in events if e["involvedObject"]["name"] == name]
    assert reasons.count("TrainerRejectedConfig") == 1, reasons


def _condition(whole: WholeCluster, name: str, ns: str, cond_type: str) -> dict | None:
    return {c["type"]: c for c in status(whole, name, ns).get("conditions") or []}.get(cond_type)


def test_a_missing_secret_says_so_and_the_job_starts_once_it_exists(operator: WholeCluster, ns: str) -> None:
    whole, name = operator, "nosecret"
    training = fsdptraining(name, ns, max_steps=3, interval=3, nodes=1, claim=None)
    training["spec"]["env"] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    ]
    t0 = time.monotonic()
    whole.cluster.apply(training)

    def stuck() -> dict | None:
        c = _condition(whole, name, ns, "PodsStarted")
        return c if c and c["status"] == "False" else None

    cond = wait_for(stuck, 120, "PodsStarted=False for the missing Secret")
    record("container_config_error_reported_s", time.monotonic() - t0)
    message = f'the pod cannot start: {name}-worker-0: container pytorch: secret "hf-token" not found'
    assert (cond["reason"], cond["message"]) == ("CreateContainerConfigError", message)
    assert status(whole, name, ns)["message"] == message
    # The user creates the Secret: the kubelet retries, the job starts and finishes.
    whole.cluster.apply(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token", "namespace": ns},
         "stringData": {"token": "hf_test"}}
    )  # fmt: skip
    assert wait_phase(whole, name, ns, TERMINAL, 240) == "Succeeded", dump(status(whole, name, ns))
    # The container ran for well over the loop's 2 s interval: the loop saw it started.
    final = _condition(whole, name, ns, "PodsStarted")
    assert final is not None and (final["status"], final["reason"]) == ("True", "Started"), final


def test_a_pod_the_api_server_refuses_says_why(operator: WholeCluster, ns: str) -> None:
    whole, name = operator, "noquota"
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods", "namespace": ns},
        "spec": {"hard": {"pods": "0"}},
    }
    whole.cluster.apply(quota)
    t0 = time.monotonic()
    whole.cluster.apply(fsdptraining(name, ns, max_steps=3, interval=3, nodes=1, claim=None))

    def refused() -> dict | None:
        c = _condition(whole, name, ns, "PodsStarted")
        return c if c and c["reason"] == "FailedCreatePod" else None

    cond = wait_for(refused, 120, "PodsStarted=False from the training operator's FailedCreatePod Event")
    record("pod_create_failure_reported_s", time.monotonic() - t0)
    assert cond["status"] == "False"
    assert cond["message"].startswith("the training operator cannot create the pods: Error creating: "), cond
    assert "exceeded quota: no-pods" in cond["message"], cond
    assert status(whole, name, ns)["message"] == cond["message"]
    whole.kubectl("delete", "resourcequota", "no-pods", "-n", ns)
    assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded", dump(status(whole, name, ns))


def _bound_claim(whole: WholeCluster, ns: str) -> Path | None:
    try:
        return Path(whole.node_agent.claim_path(ns, "ckpt"))
    except Exception:  # NotReady until the node agent provisions and binds it
        return None


def test_unschedulable_job_says_why_in_its_status(operator: WholeCluster, ns: str) -> None:
    whole, name = operator, "nofit"
    # No node of this instance type exists (nor can Karpenter make one here).
    whole.cluster.apply(fsdptraining(name, ns, max_steps=5, interval=5, claim=None, instance_types=["p4d.24xlarge"]))
    t0 = time.monotonic()

    def explained() -> dict | None:
        st = status(whole, name, ns)
        text = json.dumps(st)
        return st if ("Unschedulable" in text or "didn't match Pod's node affinity/selector" in text) else None

    st = wait_for(explained, 90, "the FSDPTraining status to say why its pods cannot be scheduled")
    record("unschedulable_reported_s", time.monotonic() - t0)
    assert st["phase"] not in ("Running", "Succeeded"), dump(st)
    assert "node affinity/selector" in json.dumps(st), dump(st)
