"""The renderer: FSDPTraining -> ConfigMap + PyTorchJob + PodMonitor + NetworkPolicy, object by object."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml
from fsdp_api import FSDPTraining
from fsdp_api.contract import ENV_TRAINING_IMAGE, ENV_TRAINING_UID
from fsdp_api.spec import SECRET_ENV_PATTERN
from fsdp_api.trainer_config import TrainerConfig
from fsdp_operator.render import render

from tests.operator.render_fixtures import BASE, Obj, deep_merge, job_of, objects, training


def worker(job: Obj) -> Obj:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]


def pod_spec(job: Obj) -> Obj:
    return worker(job)["template"]["spec"]


def container(job: Obj) -> Obj:
    (c,) = pod_spec(job)["containers"]
    return c


def env_of(job: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container(job)["env"]}


def env_values(job: Obj) -> dict[str, str | None]:
    return {name: e.get("value") for name, e in env_of(job).items()}


def mounts(job: Obj) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container(job)["volumeMounts"]}


def volumes(job: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in pod_spec(job)["volumes"]}


def arg(job: Obj, flag: str) -> str:
    values = [a.split("=", 1)[1] for a in container(job)["args"] if a.startswith(f"{flag}=")]
    assert len(values) == 1, f"{flag} appears {len(values)} times in {container(job)['args']}"
    return values[0]


# --- the object set ---------------------------------------------------------------


def test_objects_in_apply_order_with_common_labels() -> None:
    rendered = render(training())
    assert [(o["apiVersion"], o["kind"]) for o in rendered] == [
        ("v1", "ConfigMap"),
        ("kubeflow.org/v1", "PyTorchJob"),
        ("monitoring.coreos.com/v1", "PodMonitor"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
    ]
    for obj in rendered:
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a"
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "fsdptraining"
        assert labels["app.kubernetes.io/instance"] == "llama"
        assert labels["app.kubernetes.io/managed-by"] == "fsdp-operator"
        assert labels["training.fsdp.dev/job"] == "llama"
        assert labels["app.kubernetes.io/component"]
        assert "ownerReferences" not in meta
    assert {o["kind"]: o["metadata"]["name"] for o in rendered} == {
        "ConfigMap": "llama-trainer",
        "PyTorchJob": "llama",
        "PodMonitor": "llama",
        "NetworkPolicy": "llama",
    }


def test_no_podmonitor_and_no_metrics_port_when_metrics_are_disabled() -> None:
    rendered = objects(metrics={"enabled": False}, networkPolicy={"enabled": False})
    assert set(rendered) == {"ConfigMap", "PyTorchJob"}
    job = rendered["PyTorchJob"]
    assert [p["name"] for p in container(job)["ports"]] == ["pytorchjob-port"]
    assert "FSDP_METRICS_PORT" not in env_of(job)


def test_never_renders_the_checkpoint_pvc() -> None:
    kinds = {o["kind"] for o in render(training(checkpoint={"claimName": "ckpt"}), set_owner=True)}
    assert "PersistentVolumeClaim" not in kinds


def test_namespace_defaults_to_default() -> None:
    t = FSDPTraining.model_validate(deep_merge(BASE, {"metadata": {"namespace": None}}))
    rendered = render(t)
    assert {o["metadata"]["namespace"] for o in rendered} == {"default"}
    config = TrainerConfig.from_yaml(rendered[0]["data"]["train.yaml"])
    assert config.job.namespace == "default"


# --- owner references ---------------------------------------------------------------


def test_set_owner_puts_a_controller_reference_on_every_object() -> None:
    for obj in render(training(), set_owner=True):
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "training.fsdp.dev/v1alpha1",
                "kind": "FSDPTraining",
                "name": "llama",
                "uid": "0b6c5a8e-2f0e-4c52-9d0b-6f1f3c1d9a11",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_the_operators_render_tells_the_trackers_the_uid_and_image_and_an_offline_render_does_not() -> None:
    t = training()

    def job(rendered: list[Obj]) -> Obj:
        return next(o for o in rendered if o["kind"] == "PyTorchJob")

    applied = env_of(job(render(t, set_owner=True)))
    assert applied[ENV_TRAINING_UID] == {"name": ENV_TRAINING_UID, "value": "0b6c5a8e-2f0e-4c52-9d0b-6f1f3c1d9a11"}
    assert applied[ENV_TRAINING_IMAGE]["value"] == t.spec.image
    # No uid offline, and the overlay's `images:` knob may rewrite the image after the render.
    assert not {ENV_TRAINING_UID, ENV_TRAINING_IMAGE} & set(env_of(job(render(t))))


def test_the_wandb_key_comes_from_its_secret_optional_so_the_pods_check_reports_a_missing_one() -> None:
    key = {"name": "wandb", "key": "api-key"}
    env = env_of(job_of(tracking={"wandb": {"project": "llama", "apiKeySecret": key}}))
    assert env["WANDB_API_KEY"] == {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {**key, "optional": True}}}
    assert "WANDB_API_KEY" not in env_of(job_of(tracking={"wandb": {"project": "llama", "mode": "offline"}}))


def test_set_owner_needs_a_uid() -> None:
    t = FSDPTraining.model_validate(deep_merge(BASE, {"metadata": {"uid": None}}))
    with pytest.raises(ValueError, match=r"metadata\.uid"):
        render(t, set_owner=True)


# --- replicas, processes, rendezvous --------------------------------------------------


@pytest.mark.parametrize(("nodes", "gpus"), [(1, 0), (1, 1), (2, 8), (7, 4), (16, 8)])
def test_replicas_sum_to_nodes_and_nproc_is_the_integer_process_count(nodes: int, gpus: int) -> None:
    job = job_of(resources={"nodes": nodes, "gpusPerNode": gpus})
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert sum(s["replicas"] for s in specs.values()) == nodes
    expected = str(max(1, gpus))
    assert job["spec"]["nprocPerNode"] == expected
    assert re.fullmatch(r"[1-9][0-9]*", job["spec"]["nprocPerNode"])
    assert arg(job, "--nproc-per-node") == expected
    assert arg(job, "--nnodes") == str(nodes)


def test_worker_only_layout_with_c10d_rendezvous_on_worker_0() -> None:
    job = job_of()
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert worker(job)["restartPolicy"] == "OnFailure"
    c = container(job)
    assert c["name"] == "pytorch"
    # The trainer's config check runs first and execs torchrun: a bad config
    # ends there with its lines as the termination message, not a rank traceback.
    assert c["command"] == ["python"]
    launch = c["args"].index("--")
    # The check reads the node and process counts from torchrun's flags: written once.
    assert c["args"][:launch] == ["-m", "fsdp_trainer", "check", "--config", "/etc/fsdp/train.yaml"]
    assert c["args"][launch + 1 : launch + 3] == ["torchrun", "--nnodes=2"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert arg(job, "--rdzv-backend") == "c10d"
    # The training operator names worker 0's pod and headless Service <job>-worker-0
    # and reads the port from the container port named pytorchjob-port.
    assert arg(job, "--rdzv-endpoint") == "llama-worker-0:29400"
    assert {"name": "pytorchjob-port", "containerPort": 29400, "protocol": "TCP"} in c["ports"]
    assert arg(job, "--rdzv-id") == "llama"
    # Pods that start before worker 0 wait for it instead of crash-looping.
    assert arg(job, "--rdzv-conf") == "join_timeout=1800,read_timeout=600"
    assert arg(job, "--max-restarts") == "3"
    assert c["args"][-4:] == ["-m", "fsdp_trainer", "--config", "/etc/fsdp/train.yaml"]
    assert "elasticPolicy" not in job["spec"]


@pytest.mark.parametrize("gpus", [0, 8])
def test_a_restarted_pod_gets_its_own_rendezvous_store(gpus: int) -> None:
    # Without it a worker whose container restarts alone never rejoins
    # (pytorch/pytorch#135712; tests/e2e/test_faults.py kills one to prove it).
    job = job_of(resources={"nodes": 2, "gpusPerNode": gpus})
    assert env_values(job)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_elastic_policy() -> None:
    job = job_of(resources={"nodes": 3, "gpusPerNode": 8}, elastic={"minNodes": 2, "maxNodes": 4, "maxRestarts": 5})
    assert job["spec"]["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "rdzvId": "llama",
        "minReplicas": 2,
        "maxReplicas": 4,
        "maxRestarts": 5,
    }
    assert worker(job)["replicas"] == 3
    assert arg(job, "--nnodes") == "2:4"
    assert arg(job, "--max-restarts") == "5"
    # Each failure restarts every pod's container: the budget scales with the pods.
    assert job["spec"]["runPolicy"]["backoffLimit"] == 5 * 3


def test_run_policy_and_suspend() -> None:
    running = job_of()
    assert running["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 3 * 2, "suspend": False}
    assert job_of(suspend=True)["spec"]["runPolicy"]["suspend"] is True


def test_rendered_jobs_pass_the_kubeflow_webhook(kubeflow_webhook_errors: Any) -> None:
    for spec in (
        {},
        {"resources": {"nodes": 1, "gpusPerNode": 0}},
        {"resources": {"nodes": 4, "gpusPerNode": 8}, "elastic": {"minNodes": 2, "maxNodes": 8}},
    ):
        job = job_of(**spec)
        assert kubeflow_webhook_errors(job) == []
        assert worker(job)["replicas"] >= 1


def test_webhook_helper_reports_what_the_webhook_rejects(kubeflow_webhook_errors: Any) -> None:
    job = job_of(elastic={"minNodes": 1, "maxNodes": 2})
    bad = copy.deepcopy(job)
    container(bad)["name"] = "trainer"
    assert kubeflow_webhook_errors(bad) == [
        "spec.pytorchReplicaSpecs[Worker].template.spec.containers: must have at least one container with name pytorch"
    ]
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"] = {"Master": {**worker(job), "replicas": 2}}
    assert kubeflow_webhook_errors(bad) == [
        "spec.pytorchReplicaSpecs[Worker]: must be configured if elastic policy is used",
        "spec.pytorchReplicaSpecs[Master].replicas: must be 1",
    ]
    bad = copy.deepcopy(job)
    bad["spec"]["elasticPolicy"]["nProcPerNode"] = 8
    assert kubeflow_webhook_errors(bad) == ["spec.elasticPolicy.nProcPerNode: must not be used with spec.nprocPerNode"]


# --- resources and placement -------------------------------------------------------


def test_gpu_and_efa_requests_limits_env_and_capability() -> None:
    job = job_of(resources={"nodes": 2, "gpusPerNode": 8, "efaPerNode": 32, "cpu": 90, "memory": "1800Gi"})
    res = container(job)["resources"]
    assert res["limits"] == {"memory": "1800Gi", "nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}
    assert res["requests"] == {"cpu": "90", "memory": "1800Gi", "nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}
    env = env_values(job)
    assert env["FI_PROVIDER"] == "efa"
    # libfabric picks device RDMA by itself where the NIC has RDMA read, and aborts
    # when it is forced on a NIC without it (g5/g6/g6e): never set.
    assert "FI_EFA_USE_DEVICE_RDMA" not in env
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert container(job)["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    # EFA traffic stays in its subnet: every pod in the first pod's zone.
    (term,) = pod_spec(job)["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "topology.kubernetes.io/zone"
    assert term["labelSelector"]["matchLabels"]["training.fsdp.dev/job"] == "llama"


def test_without_efa_no_efa_resource_env_or_capability() -> None:
    job = job_of()
    res = container(job)["resources"]
    assert res == {"requests": {"nvidia.com/gpu": 8}, "limits": {"nvidia.com/gpu": 8}}
    assert not [name for name in env_of(job) if name.startswith("FI_")]
    assert container(job)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "podAffinity" not in pod_spec(job)["affinity"]


def test_cpu_job_has_no_gpu_resource_toleration_or_nccl_env() -> None:
    job = job_of(resources={"nodes": 1, "gpusPerNode": 0, "nodePool": "cpu"})
    assert "nvidia.com/gpu" not in json.dumps(container(job)["resources"])
    assert "tolerations" not in pod_spec(job)
    assert not [name for name in env_of(job) if "NCCL" in name]
    assert pod_spec(job)["nodeSelector"]["karpenter.sh/nodepool"] == "cpu"


def test_karpenter_selection() -> None:
    job = job_of(resources={"instanceTypes": ["p5.48xlarge", "p5e.48xlarge"], "capacityType": "spot"})
    pod = pod_spec(job)
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "gpu", "karpenter.sh/capacity-type": "spot"}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge", "p5e.48xlarge"]}
            ]
        }
    ]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert worker(job)["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    # One pod per node.
    (anti,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert "nodeAffinity" not in pod_spec(job_of())["affinity"]


def test_cpu_and_memory() -> None:
    res = container(job_of(resources={"cpu": "500m", "memory": 64 * 2**30, "gpusPerNode": 0}))["resources"]
    # No CPU limit (throttling), memory limit == request.
    assert res == {"requests": {"cpu": "500m", "memory": str(64 * 2**30)}, "limits": {"memory": str(64 * 2**30)}}


# --- volumes and security ---------------------------------------------------------------


def test_volumes_with_a_checkpoint_pvc() -> None:
    rendered = objects(checkpoint={"claimName": "llama-ckpt", "dir": "/ckpt"}, resources={"sharedMemory": "64Gi"})
    job = rendered["PyTorchJob"]
    vols, at = volumes(job), mounts(job)
    assert vols[at["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert vols[at["/ckpt"]]["persistentVolumeClaim"] == {"claimName": "llama-ckpt"}
    assert vols[at["/etc/fsdp"]]["configMap"]["name"] == rendered["ConfigMap"]["metadata"]["name"]
    assert container(job)["args"][-1] == "/etc/fsdp/" + next(iter(rendered["ConfigMap"]["data"]))
    assert job["metadata"]["annotations"] == {"training.fsdp.dev/checkpoints": "pvc/llama-ckpt"}


def test_checkpoints_without_a_pvc_are_marked_ephemeral() -> None:
    rendered = objects()
    job = rendered["PyTorchJob"]
    assert volumes(job)[mounts(job)["/checkpoints"]] == {"name": "checkpoints", "emptyDir": {}}
    assert volumes(job)[mounts(job)["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}
    for obj in (job, rendered["ConfigMap"], worker(job)["template"]):
        annotations = obj["metadata"]["annotations"]
        assert annotations["training.fsdp.dev/checkpoints"] == "ephemeral"
        assert "lost when a pod is deleted" in annotations["training.fsdp.dev/checkpoints-warning"]


def test_checkpoints_in_an_emptydir_with_a_remote_tier_carry_no_warning() -> None:
    rendered = objects(checkpoint={"remote": "s3://ckpt/llama"})
    job = rendered["PyTorchJob"]
    assert volumes(job)[mounts(job)["/checkpoints"]] == {"name": "checkpoints", "emptyDir": {}}
    assert job["metadata"]["annotations"] == {"training.fsdp.dev/checkpoints": "emptyDir+s3://ckpt/llama"}
    # The trainer reads the tier from its config.
    config = yaml.safe_load(next(iter(rendered["ConfigMap"]["data"].values())))
    assert config["checkpoint"]["remote"] == "s3://ckpt/llama" and config["checkpoint"]["remoteKeepLast"] == 3


def test_every_path_the_trainer_writes_is_a_mounted_volume() -> None:
    """The root filesystem is read-only, so HOME, HF_HOME, /tmp and the checkpoints must be mounts."""
    job = job_of()
    assert container(job)["securityContext"]["readOnlyRootFilesystem"] is True
    env = env_values(job)
    writable = [p for p, name in mounts(job).items() if name != "config"]
    for path in (env["HOME"], env["HF_HOME"], "/tmp", "/checkpoints", "/dev/shm"):
        assert any(path == m or path.startswith(m + "/") for m in writable), path
    assert next(m for m in container(job)["volumeMounts"] if m["name"] == "config")["readOnly"] is True


def test_security_context() -> None:
    job = job_of()
    pod = pod_spec(job)
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container(job)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod
    assert pod_spec(job_of(serviceAccountName="s3-reader"))["serviceAccountName"] == "s3-reader"


# --- environment -----------------------------------------------------------------------


def test_env_passes_secret_refs_through_and_lets_the_user_override() -> None:
    job = job_of(
        env=[
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "NCCL_DEBUG", "value": "INFO"},
        ]
    )
    env = env_of(job)
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert env["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "INFO"}
    names = [e["name"] for e in container(job)["env"]]
    assert len(names) == len(set(names)), "duplicate env names"
    # User variables come last so they can reference ours with $(VAR).
    assert names[-2:] == ["HF_TOKEN", "NCCL_DEBUG"]
    assert env["FSDP_JOB_NAME"]["value"] == "llama"
    assert env["FSDP_JOB_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["FSDP_METRICS_PORT"]["value"] == "9402"
    for e in container(job)["env"]:
        if re.match(SECRET_ENV_PATTERN, e["name"]):
            assert "value" not in e, f"{e['name']} is a literal credential"


# --- metrics ---------------------------------------------------------------------------------


def test_podmonitor_selects_the_trainer_pods_on_the_metrics_port() -> None:
    rendered = objects(metrics={"port": 9500})
    job, monitor = rendered["PyTorchJob"], rendered["PodMonitor"]
    assert {"name": "metrics", "containerPort": 9500, "protocol": "TCP"} in container(job)["ports"]
    pod_labels = worker(job)["template"]["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert selector["training.fsdp.dev/job"] == "llama"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert {k: endpoint[k] for k in ("port", "path", "interval")} == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "15s",
    }
    # A pod's own DCGM_* series (forged XID evidence about any node) never reach Prometheus.
    assert endpoint["metricRelabelings"] == [{"sourceLabels": ["__name__"], "regex": "DCGM_.*", "action": "drop"}]


# --- network policy ----------------------------------------------------------------------


def test_network_policy_admits_the_jobs_own_pods_and_the_metrics_port_from_listed_namespaces() -> None:
    rendered = objects(metrics={"port": 9500}, networkPolicy={"metricsFromNamespaces": ["ops", "prom"]})
    job, policy = rendered["PyTorchJob"], rendered["NetworkPolicy"]
    pod_labels = worker(job)["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items() and selector["training.fsdp.dev/job"] == "llama"
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: hub, S3, DNS
    same_job, metrics = policy["spec"]["ingress"]
    # Every port between the job's pods: rendezvous, and the ephemeral ports of gloo/NCCL.
    assert same_job == {"from": [{"podSelector": {"matchLabels": selector}}]}
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9500}]
    assert metrics["from"] == [
        {
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ops", "prom"]}
                ]
            }
        }
    ]


def test_network_policy_without_metrics_admits_only_the_job() -> None:
    policy = objects(metrics={"enabled": False})["NetworkPolicy"]
    assert len(policy["spec"]["ingress"]) == 1 and "ports" not in policy["spec"]["ingress"][0]


# --- the ConfigMap -----------------------------------------------------------------------


def test_configmap_train_yaml_parses_back_to_the_spec_values() -> None:
    t = training(training={"maxSteps": 777, "seqLen": 512, "precision": "fp32"}, fsdp={"shardingStrategy": "hybrid"})
    cm = render(t)[0]
    assert list(cm["data"]) == ["train.yaml"]
    parsed = TrainerConfig.from_yaml(cm["data"]["train.yaml"])
    assert parsed == TrainerConfig.from_spec(t.spec, name="llama", namespace="team-a")
    assert parsed.job.name == "llama"
    assert parsed.job.namespace == "team-a"
    assert parsed.training.max_steps == 777
    assert parsed.seq_len() == 512
    assert parsed.training.precision == "fp32"
    assert parsed.fsdp.sharding_strategy == "hybrid"
    assert parsed.model.preset == "llama3.2-1b"
    assert parsed.metrics.port == 9402


def test_examples_render_their_own_config(valid_example: Any, training_from: Any) -> None:
    t = training_from(valid_example)
    if t.spec.runs_own_script:
        assert render(t)[0]["kind"] == "PyTorchJob"  # no trainer config to render
        return
    cm = render(t)[0]
    assert (
        TrainerConfig.from_yaml(cm["data"]["train.yaml"]).model_dump()
        == TrainerConfig.from_spec(t.spec, name=t.name, namespace=t.metadata.namespace or "default").model_dump()
    )


# --- purity -------------------------------------------------------------------------------


def test_deterministic_and_does_not_mutate_its_input() -> None:
    t = training(elastic={"minNodes": 1, "maxNodes": 2}, resources={"efaPerNode": 4, "instanceTypes": ["p5.48xlarge"]})
    before = t.model_dump()
    first = json.dumps(render(t, set_owner=True), sort_keys=False)
    again = json.dumps(render(t, set_owner=True), sort_keys=False)
    other = json.dumps(render(FSDPTraining.model_validate(t.model_dump(by_alias=True)), set_owner=True))
    assert first == again == other
    assert t.model_dump() == before
    # Mutating one rendered object never leaks into the next render.
    rendered = render(t)
    container(rendered[1])["env"].clear()
    assert env_of(render(t)[1])


# --- a training script of your own (spec.command) ------------------------------------------

SCRIPT = {"model": None, "training": None, "command": ["/workspace/train.py"], "args": ["--epochs", "3"]}


def test_a_script_of_your_own_runs_under_the_same_torchrun_launch() -> None:
    built_in, own = job_of(), job_of(**SCRIPT)
    ours, theirs = container(built_in), container(own)
    # torchrun directly (no config check: there is no trainer config), the same rendezvous flags.
    assert theirs["command"] == ["torchrun"]
    flags = [a for a in theirs["args"] if a.startswith("--") and "=" in a]
    assert flags == [a for a in ours["args"] if a.startswith("--") and "=" in a and a != "--config"]
    assert theirs["args"][len(flags) :] == ["/workspace/train.py", "--epochs", "3"]
    # No trainer ConfigMap, volume, mount or FSDP_CONFIG; the checkpoint dir is in the environment instead.
    assert "ConfigMap" not in objects(**SCRIPT)
    assert "config" not in {v["name"] for v in pod_spec(own)["volumes"]}
    assert "/etc/fsdp" not in {m["mountPath"] for m in theirs["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in theirs["env"]}
    assert "FSDP_CONFIG" not in env and env["FSDP_CHECKPOINT_DIR"] == "/checkpoints"
    assert env["FSDP_METRICS_PORT"] == "9402" and env["FSDP_JOB_NAME"] == "llama"
    # Everything else about the pods is the same: resources, security, /dev/shm, placement.
    for key in ("resources", "securityContext", "ports"):
        assert theirs[key] == ours[key], key
    for key in ("affinity", "nodeSelector", "tolerations", "securityContext", "terminationGracePeriodSeconds"):
        assert pod_spec(own).get(key) == pod_spec(built_in).get(key), key


def test_a_module_runs_with_torchruns_module_flag() -> None:
    args = container(job_of(**{**SCRIPT, "command": ["-m", "mypkg.train"], "args": None}))["args"]
    assert args[-2:] == ["-m", "mypkg.train"]
    assert args[-3].startswith("--max-restarts=")
