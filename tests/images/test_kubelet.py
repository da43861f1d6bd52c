"""The rendered trainer pod, from the trainer image, on a real kubelet with containerd (fsdp_localcluster.kubelet_node).

The node agent's image mode emulates what a kubelet does with a pod spec; here
the real kubelet does it: the pod sandbox and network namespace, the
ConfigMap volume, the memory-backed /dev/shm, fsGroup, the securityContext
with the RuntimeDefault seccomp profile, and graceful termination.
docs/images.md, "On a real kubelet".
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsdp_localcluster.apiserver import TestCluster
from fsdp_localcluster.binaries import tool_path
from fsdp_localcluster.images import LOCAL_TRAINER_IMAGE, require_images
from fsdp_localcluster.kubelet_node import KubeletNode, missing_requirements
from fsdp_localcluster.wait import WaitTimeout, wait_for

from tests.images.rendered import render_tiny, worker_template

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

NAMESPACE = "default"
STEP = re.compile(r"^step (\d+)/\d+ \| loss", re.MULTILINE)
# The labels the rendered pod's nodeSelector asks for (the tiny example's NodePool "default").
LABELS = {"karpenter.sh/nodepool": "default", "karpenter.sh/capacity-type": "on-demand"}


@pytest.fixture(scope="module")
def node() -> Iterator[KubeletNode]:
    require_images()
    missing = missing_requirements()
    if missing:
        pytest.fail("a real kubelet node needs " + "; ".join(missing), pytrace=False)
    with TestCluster() as cluster, KubeletNode(cluster, labels=LABELS) as kubelet:
        seconds = kubelet.load_image(LOCAL_TRAINER_IMAGE)
        print(json.dumps({"load_trainer_image_s": round(seconds, 1)}))
        cluster.kubectl("create", "serviceaccount", "default", "-n", NAMESPACE, check=False)
        yield kubelet


def rendered(max_steps: int, interval: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tiny example's ConfigMap and its worker pod, as `fsdp-operator render` gives them, from the local image."""
    objects = render_tiny(max_steps, interval, image=LOCAL_TRAINER_IMAGE)
    config, template = objects["ConfigMap"], worker_template(objects)
    # What the training operator adds to its pods: the name the rendezvous endpoint names
    # (<job>-worker-0); the node (the scheduler's choice) is set by run_on.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": f"{objects['PyTorchJob']['metadata']['name']}-worker-0"},
        "spec": {**template["spec"], "restartPolicy": "Never"},
    }
    pod["metadata"]["namespace"] = config["metadata"]["namespace"] = NAMESPACE
    return config, pod


def get_pod(node: KubeletNode, name: str) -> dict[str, Any] | None:
    out = node.cluster.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def with_claim(pod: dict[str, Any], claim: Path) -> None:
    """Checkpoints on a folder of this machine instead of the emptyDir, as on a claim: they outlive the pod."""
    claim.mkdir()
    claim.chmod(0o777)  # as a local-path provisioner makes it
    for volume in pod["spec"]["volumes"]:
        if volume["name"] == "checkpoints":
            volume.pop("emptyDir")
            volume["hostPath"] = {"path": str(claim), "type": "Directory"}


def run_on(node: KubeletNode, config: dict[str, Any], pod: dict[str, Any]) -> str:
    """Create the pod on the node; its uid."""
    pod["spec"]["nodeName"] = node.name
    node.cluster.apply(config)
    node.cluster.apply(pod)
    created = get_pod(node, pod["metadata"]["name"])
    assert created is not None
    return created["metadata"]["uid"]


def delete(node: KubeletNode, name: str) -> None:
    node.cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--timeout=100s", check=False)


def terminated(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if "terminated" in cs.get("state", {}):
            return cs["state"]["terminated"]
    return None


def saved_steps(claim: Path) -> list[int]:
    return sorted(int(p.parent.name.removeprefix("step-")) for p in claim.glob("step-*/COMPLETE"))


class StatusWatch:
    """Every pod status the API server sees (kubectl get --watch), to read the last one after the pod is gone."""

    def __init__(self, node: KubeletNode, name: str) -> None:
        kubectl = str(tool_path("kubectl", build=False))
        self.proc = subprocess.Popen(
            [
                kubectl,
                f"--kubeconfig={node.cluster.kubeconfig}",
                "get",
                "pod",
                name,
                "-n",
                NAMESPACE,
                "-w",
                "--output-watch-events",
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=lambda: self.events.extend(_json_stream(self.proc.stdout)), daemon=True)
        self.reader.start()

    def summary(self) -> list[tuple[str, Any]]:
        """Each event's type and the container states it carried: a failure message short enough to read."""
        return [
            (
                e.get("type", "?"),
                [cs.get("state") for cs in (e.get("object") or {}).get("status", {}).get("containerStatuses") or []],
            )
            for e in self.events
        ]

    def last_termination(self) -> dict[str, Any] | None:
        """The last terminated state the watch saw, read once the watch has seen the pod deleted.

        Stopping the watch as soon as `kubectl delete` returned lost the final status updates
        still on their way to it on a busy machine (a CI flake: no terminated state seen at all).
        """
        # Never raises: it runs in a `finally`, where an exception would hide the test's own failure.
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda: any(e.get("type") == "DELETED" for e in self.events), 60, "the watch to see the deletion")
        self.proc.terminate()
        self.reader.join(10)
        pods = [e.get("object") for e in self.events]
        return next((t for pod in reversed(pods) if (t := terminated(pod))), None)


def test_the_rendered_trainer_pod_trains_and_checkpoints_on_a_real_kubelet(node: KubeletNode, tmp_path: Path) -> None:
    config, pod = rendered(max_steps=20, interval=10)
    claim = tmp_path / "claim"
    with_claim(pod, claim)
    name = pod["metadata"]["name"]
    uid = run_on(node, config, pod)
    try:
        done = wait_for(
            lambda: (p := get_pod(node, name)) and p["status"].get("phase") in ("Succeeded", "Failed") and p,
            600,
            f"{name} to finish",
        )
        log = node.container_log(NAMESPACE, name, uid, "pytorch")
        assert done["status"]["phase"] == "Succeeded", log[-4000:]
        assert terminated(done)["exitCode"] == 0
        assert [int(s) for s in STEP.findall(log)][-1] == 20
        assert done["status"]["podIP"].startswith("10.244.77.")  # its own network namespace on the CNI bridge
        # Written as the image's user and group (runAsUser/runAsGroup 1000).
        assert saved_steps(claim) == [10, 20]
        owners = {(p.stat().st_uid, p.stat().st_gid) for p in claim.rglob("*")}
        assert owners == {(1000, 1000)}, owners
        # A finished pod's emptyDirs are removed at once, before the pod is deleted: why the renderer's
        # ephemeral-checkpoint warning says that a finished training leaves nothing to export.
        empty_dirs = node.pod_dir(uid) / "volumes/kubernetes.io~empty-dir"
        wait_for(lambda: not any(empty_dirs.glob("*")), 60, "the kubelet to remove the finished pod's emptyDirs")
    finally:
        delete(node, name)


def test_deleting_the_pod_sigterms_the_trainer_which_checkpoints_and_exits_143(
    node: KubeletNode, tmp_path: Path
) -> None:
    config, pod = rendered(max_steps=5000, interval=5000)
    claim = tmp_path / "claim"
    with_claim(pod, claim)
    name = pod["metadata"]["name"]
    uid = run_on(node, config, pod)
    watch = StatusWatch(node, name)
    try:
        steps = wait_for(
            lambda: (
                (s := [int(x) for x in STEP.findall(node.container_log(NAMESPACE, name, uid, "pytorch"))])
                and len(s) >= 2
                and s
            ),
            300,
            "training steps",
        )
        delete(node, name)  # the kubelet's graceful termination: SIGTERM, then the grace period
    finally:
        last = watch.last_termination()
    assert last is not None and last["exitCode"] == 128 + signal.SIGTERM, watch.summary()
    # Saved at the step it was in when the signal came: none of the logged steps is lost.
    saved = saved_steps(claim)
    assert len(saved) == 1 and steps[-1] <= saved[0] < 5000, (saved, steps)


def delete_as_it_starts_and_see_it_end_at_once(node: KubeletNode, config: dict[str, Any], pod: dict[str, Any]) -> None:
    """Create the pod, delete it once its container runs: gone within the deletion's 100 s, by SIGTERM (143)."""
    name = pod["metadata"]["name"]
    run_on(node, config, pod)
    watch = StatusWatch(node, name)
    try:
        wait_for(
            lambda: any(
                "running" in cs["state"]
                for cs in (get_pod(node, name) or {}).get("status", {}).get("containerStatuses", [])
            ),
            120,
            "the container to start",
        )
        delete(node, name)
        gone = get_pod(node, name) is None
    finally:
        last = watch.last_termination()
    assert gone, "still there 100 s after its deletion (grace period 300 s)"
    assert last is not None and last["exitCode"] == 128 + signal.SIGTERM, watch.summary()


def test_deleting_the_pod_while_it_starts_ends_it_at_once_not_at_the_grace_period(node: KubeletNode) -> None:
    """A SIGTERM while the config check runs (PID 1) stopped nothing before the check handled it.

    The pod then trained on until its 300 s grace period ended in SIGKILL (137).
    """
    config, pod = rendered(max_steps=5000, interval=5000)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 300
    delete_as_it_starts_and_see_it_end_at_once(node, config, pod)


def test_deleting_the_pod_before_python_has_started_ends_it_at_once(node: KubeletNode, tmp_path: Path) -> None:
    """A SIGTERM before the command can install any handler: the kernel drops it for a PID 1.

    A sitecustomize that sleeps holds the interpreter before any of our code, so the
    deletion always lands there. As the container's PID 1 the command ignored it and the
    pod lived until its 300 s grace period ended; the rendered pods share their process
    namespace (the pause container is PID 1), and it dies at once.
    """
    config, pod = rendered(max_steps=5000, interval=5000)
    assert pod["spec"]["shareProcessNamespace"] is True
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import time\n\ntime.sleep(30)\n")
    shim.chmod(0o755)
    pod["spec"]["volumes"].append({"name": "shim", "hostPath": {"path": str(shim), "type": "Directory"}})
    (container,) = pod["spec"]["containers"]
    container["volumeMounts"].append({"name": "shim", "mountPath": "/shim", "readOnly": True})
    container["env"].append({"name": "PYTHONPATH", "value": "/shim"})
    delete_as_it_starts_and_see_it_end_at_once(node, config, pod)


def _json_stream(stream: Any) -> Iterator[dict[str, Any]]:
    """The objects of a stream of concatenated JSON documents (kubectl's --watch -o json)."""
    decoder, buffer = json.JSONDecoder(), ""
    for line in stream:
        buffer += line
        while buffer.strip():
            try:
                obj, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                break
            yield obj
            buffer = buffer.lstrip()[end:]
