"""The export Job (``fsdp-operator export``): what it reads, where it runs, what it may touch."""

from __future__ import annotations

import pytest
from fsdp_operator.render.export_job import ExportRefused, export_job, export_job_name, export_source

from tests.operator.render_fixtures import training

S3_ENV = [{"name": "AWS_ENDPOINT_URL_S3", "value": "http://minio.storage:9000"}]


def _job(**spec: object) -> dict:
    return export_job(training(**spec), "s3://models/llama", suffix="20261207071500", uid="u-1")


def test_a_claim_is_mounted_read_only_and_the_newest_or_a_given_step_is_read() -> None:
    job = _job(checkpoint={"claimName": "llama-ckpt", "dir": "/ckpt"}, env=S3_ENV, serviceAccountName="trainer")
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == [
        "fsdp-train", "export", "--checkpoint", "/ckpt", "--output", "s3://models/llama",
        "--dtype", "float32", "--format", "merged",
    ]  # fmt: skip
    [claim] = [v for v in pod["volumes"] if v["name"] == "checkpoints"]
    assert claim == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "llama-ckpt"}}
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "checkpoints"]
    assert mount == {"name": "checkpoints", "mountPath": "/ckpt", "readOnly": True}
    assert {v["name"] for v in pod["volumes"]} == {"checkpoints", "tmp", "home"}  # no config, no /dev/shm
    # The training's S3 endpoint and identity; none of its launch's variables.
    names = [e["name"] for e in container["env"]]
    assert "AWS_ENDPOINT_URL_S3" in names and "FSDP_POD_IP" not in names and "FSDP_METRICS_PORT" not in names
    assert pod["serviceAccountName"] == "trainer" and pod["restartPolicy"] == "Never"
    src = export_source(training(checkpoint={"claimName": "c", "dir": "/ckpt"}).spec, 300)
    assert src == "/ckpt/step-00000300"


def test_it_asks_for_no_gpu_and_carries_none_of_the_trainings_gpu_placement() -> None:
    job = _job(checkpoint={"claimName": "c"})
    pod = job["spec"]["template"]["spec"]
    # llama3.2-1b: 1.24e9 parameters x 4 bytes (built in fp32, whatever --dtype) + 3 GiB for the process.
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    assert "tolerations" not in pod and "nodeSelector" not in pod and "affinity" not in pod
    bf16 = export_job(training(checkpoint={"claimName": "c"}), "s3://m/x", suffix="1", dtype="bfloat16")
    assert bf16["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] == "8Gi"
    # An EFA training's pods add IPC_LOCK; its export Job adds nothing.
    efa = _job(checkpoint={"claimName": "c"}, resources={"nodes": 2, "gpusPerNode": 8, "efaPerNode": 32})
    assert efa["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert efa["spec"]["activeDeadlineSeconds"] == 12 * 3600


def test_a_remote_tier_is_read_when_there_is_no_claim_and_an_emptydir_is_refused() -> None:
    job = _job(checkpoint={"remote": "s3://ckpt/llama/"}, env=S3_ENV)
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][3] == "s3://ckpt/llama"
    assert export_source(training(checkpoint={"remote": "s3://ckpt/llama"}).spec, 7) == "s3://ckpt/llama/step-00000007"
    with pytest.raises(ExportRefused, match=r"in an emptyDir .* and went with its pods: nothing is left to export"):
        _job()
    with pytest.raises(ExportRefused, match=r"runs a script of its own \(spec.command\)"):
        _job(checkpoint={"claimName": "c"}, model=None, training=None, command=["python", "train.py"])


def test_the_job_is_owned_by_its_training_named_after_it_and_kept_a_day() -> None:
    job = _job(checkpoint={"claimName": "c"})
    assert job["metadata"]["name"] == "llama-export-20261207071500"
    assert job["metadata"]["namespace"] == "team-a"
    [owner] = job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("FSDPTraining", "llama", "u-1")
    assert (job["spec"]["backoffLimit"], job["spec"]["ttlSecondsAfterFinished"]) == (0, 86400)
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "export"
    long = export_job_name("x" * 70, "20261207071500")
    assert len(long) == 63 and long.endswith("-export-20261207071500")
