"""FSDPTraining helpers of the end-to-end tests: the resource, its checkpoints, its trainer's log."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fsdp_localcluster.wait import wait_for
from fsdp_localcluster.whole_cluster import WholeCluster

TRAINER_IMAGE = "ghcr.io/fsdp-k8s/trainer:0.1.0"
# Rank 0's progress line, e.g. "step 12/30 | loss 7.6895 | lr 2.42e-04 | ..."
STEP_LINE = re.compile(r"^step (\d+)/(\d+) \| loss ([0-9.]+|nan|inf)", re.MULTILINE)
TERMINAL = ("Succeeded", "Failed")
# Rank 0's line when it resumes, and its line when SIGTERM stopped it after saving (fsdp_trainer.train.Stopped).
RESUMED = re.compile(r"resumed from \S+ at step (\d+)")
STOPPED = re.compile(r"stopped on SIGTERM after step (\d+); a checkpoint of it was saved")


def fsdptraining(
    name: str,
    namespace: str,
    *,
    max_steps: int,
    interval: int,
    nodes: int = 2,
    claim: str | None = "ckpt",
    instance_types: list[str] | None = None,
    suspend: bool = False,
    model: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    image: str = TRAINER_IMAGE,
) -> dict[str, Any]:
    """A tiny-model FSDPTraining for the GPU nodes: one process per pod (a fake GPU each), CPU/gloo.

    ``image``: the default runs as local processes; ``LOCAL_TRAINER_IMAGE``
    (`make images`) runs each pod from the trainer image, in a container.
    """
    resources: dict[str, Any] = {"nodes": nodes, "gpusPerNode": 1, "nodePool": "gpu"}
    if instance_types:
        resources["instanceTypes"] = instance_types
    checkpoint: dict[str, Any] = {"intervalSteps": interval}
    if claim:
        checkpoint["claimName"] = claim
    return {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": image,
            "model": model or {"preset": "tiny"},
            **({"data": data} if data else {}),
            "training": {
                "maxSteps": max_steps,
                "seqLen": 64,
                "microBatchSize": 2,
                "precision": "fp32",
                "logIntervalSteps": 1,
                "seed": 1234,
            },
            "resources": resources,
            "checkpoint": checkpoint,
            "suspend": suspend,
        },
    }


def create_claim(whole: WholeCluster, namespace: str, name: str = "ckpt") -> None:
    """A ReadWriteMany claim for the checkpoints (EFS/FSx on EKS; a local folder here)."""
    whole.cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        }
    )


def status(whole: WholeCluster, name: str, namespace: str) -> dict[str, Any]:
    return dict(((whole.get("fsdptraining", name, namespace) or {}).get("status")) or {})


def wait_phase(whole: WholeCluster, name: str, namespace: str, phases: tuple[str, ...], timeout: float) -> str:
    def check() -> str | None:
        phase = status(whole, name, namespace).get("phase")
        return phase if phase in phases else None

    try:
        return wait_for(check, timeout, f"FSDPTraining {namespace}/{name} to reach {' or '.join(phases)}")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{whole.describe(namespace)}\n{trainer_logs(whole, name, namespace)[-3000:]}") from e


def checkpoint_steps(whole: WholeCluster, namespace: str, claim: str = "ckpt") -> list[int]:
    """Steps of the complete checkpoints (``step-N/COMPLETE``) in the claim's folder."""
    root = whole.node_agent.claim_path(namespace, claim)
    return sorted(int(p.parent.name.removeprefix("step-")) for p in Path(root).glob("step-*/COMPLETE"))


def pod_prefixes(name: str) -> tuple[str, ...]:
    """How a job's trainer pods are named: <name>-worker-<i> (PyTorchJob), <name>-node-0-<i>-<random> (TrainJob)."""
    return (f"{name}-worker-", f"{name}-node-")


def trainer_logs(whole: WholeCluster, name: str, namespace: str) -> str:
    """Every run of every trainer pod of the job, concatenated per pod."""
    agent = whole.node_agent
    with agent._lock:
        pods = sorted({w.pod_name for w in agent.workers.values() if w.namespace == namespace})
    return "".join(agent.logs(namespace, p) for p in pods if p.startswith(pod_prefixes(name)))


def step_losses(whole: WholeCluster, name: str, namespace: str) -> dict[int, list[float]]:
    """Step -> every loss logged for it (a step recomputed after a resume appears twice)."""
    losses: dict[int, list[float]] = defaultdict(list)
    for m in STEP_LINE.finditer(trainer_logs(whole, name, namespace)):
        losses[int(m.group(1))].append(float(m.group(3)))
    return dict(losses)


def last_step(whole: WholeCluster, name: str, namespace: str) -> int:
    return max(step_losses(whole, name, namespace), default=0)


def pods_of(whole: WholeCluster, name: str, namespace: str) -> list[dict[str, Any]]:
    return [p for p in whole.list("pods", namespace) if p["metadata"]["name"].startswith(pod_prefixes(name))]


def conditions(obj_status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj_status.get("conditions", [])}


def steps_per_second(samples: list[tuple[float, float]]) -> float:
    """Training speed from (time, step) samples: from the first step seen to the highest one."""
    moving = [(t, s) for t, s in samples if s >= 1]
    if len(moving) < 2:
        return 0.0
    (t0, s0), (t1, s1) = moving[0], max(moving, key=lambda x: (x[1], -x[0]))
    return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


def poll_steps(
    whole: WholeCluster, name: str, namespace: str, stop: threading.Event, samples: list[tuple[float, int]]
) -> None:
    """Append (monotonic time, last logged step) every 0.5 s until ``stop`` is set."""
    while not stop.wait(0.5):
        samples.append((time.monotonic(), last_step(whole, name, namespace)))


@contextlib.contextmanager
def step_sampler(whole: WholeCluster, name: str, namespace: str) -> Iterator[list[tuple[float, int]]]:
    """(time, step) samples taken in the background while the block runs."""
    samples: list[tuple[float, int]] = []
    stop = threading.Event()
    t = threading.Thread(target=poll_steps, args=(whole, name, namespace, stop, samples), daemon=True)
    t.start()
    try:
        yield samples
    finally:
        stop.set()
        t.join(timeout=10)


def restart_operator(whole: WholeCluster) -> None:
    """Delete the operator's pod and wait for its replacement to be ready.

    The operator resolves the resources it watches when it starts: one started
    before Kueue or Trainer v2 was installed watches neither (docs/kueue.md, docs/backends.md).
    """
    old = whole.operator_pod()
    assert old is not None
    whole.kubectl("delete", "pod", "-n", old["metadata"]["namespace"], old["metadata"]["name"], "--wait=false")
    wait_for(
        lambda: (p := whole.operator_pod()) is not None and p["metadata"]["uid"] != old["metadata"]["uid"] and p,
        60,
        "a new operator pod",
    )
    whole.wait_operator_ready()


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)


def saved_on_sigterm(whole: WholeCluster, name: str, namespace: str, claim: str = "ckpt") -> int:
    """The step the trainer reported saving when SIGTERM stopped it, checked against the claim's checkpoints.

    What a resume must start from, as the trainer said it, not as the claim
    looked at some moment: the tests read it once the pods are gone.
    """
    logs = trainer_logs(whole, name, namespace)
    stopped = {int(m) for m in STOPPED.findall(logs)}
    assert len(stopped) == 1, f"expected one SIGTERM stop, the trainer reported {sorted(stopped)}:\n{logs[-3000:]}"
    (step,) = stopped
    assert step in checkpoint_steps(whole, namespace, claim), (step, checkpoint_steps(whole, namespace, claim))
    return step


def assert_resumed_exactly(losses: dict[int, list[float]], max_steps: int, interval: int, resumed_at: int) -> list[int]:
    """Every step trained; the recomputed ones (after ``resumed_at``) fit in one interval and repeat their loss."""
    assert sorted(losses) == list(range(1, max_steps + 1)), sorted(losses)
    recomputed = sorted(s for s, seen in losses.items() if len(seen) > 1)
    assert len(recomputed) <= interval, recomputed
    if recomputed:
        assert recomputed[0] == resumed_at + 1, (recomputed, resumed_at)
    # Same seed, same data order, state restored: the same step gives the same loss.
    mismatched = {s: losses[s] for s in recomputed if len(set(losses[s])) != 1}
    assert not mismatched, f"loss differs after resume at steps {mismatched}"
    return recomputed
