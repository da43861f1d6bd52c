"""spec.command end to end: examples/your-own-script (a T5 fine-tuning script of the user's, FSDP2) as shipped,
built with the real kustomize, applied to the whole local cluster, trained to Succeeded over two pods."""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fsdp_localcluster.binaries import tool_path
from fsdp_localcluster.wait import wait_for
from fsdp_localcluster.whole_cluster import WholeCluster

from tests.e2e.namespaces import own_namespace
from tests.e2e.training import TERMINAL, dump, status, trainer_logs, wait_phase

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "your-own-script"
# The script's own progress line on rank 0: "step 12 | loss 2.3871".
SCRIPT_STEP = re.compile(r"^step (\d+) \| loss ([0-9.]+)$", re.MULTILINE)


@pytest.fixture
def ns(operator: WholeCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from own_namespace(operator, "own-", request)


def example_objects(namespace: str, steps: int, every: int) -> list[dict]:
    """``kubectl kustomize examples/your-own-script``, moved to ``namespace`` and onto the test's GPU nodes."""
    out = subprocess.run(
        [str(tool_path("kubectl")), "kustomize", str(EXAMPLE)], capture_output=True, text=True, check=True
    ).stdout
    objs = [o for o in yaml.safe_load_all(out) if o]
    for o in objs:
        o["metadata"]["namespace"] = namespace
        if o["kind"] == "FSDPTraining":
            spec = o["spec"]
            # The test cluster's two worker nodes are its "GPU" nodes (a fake GPU each, CPU/gloo).
            spec["resources"] = {"nodes": 2, "gpusPerNode": 1, "nodePool": "gpu"}
            spec["args"] = ["--steps", str(steps), "--checkpoint-every", str(every)]
            # The script keeps serving its final figures a little (ScriptMetrics.close), so the status gets them.
            spec["env"] = [{"name": "FSDP_METRICS_LINGER_SECONDS", "value": "6"}]
    return objs


def test_the_example_script_trains_to_succeeded_with_its_step_and_loss_in_the_status(
    operator: WholeCluster, ns: str
) -> None:
    whole, steps, every = operator, 30, 10
    objs = example_objects(ns, steps, every)
    name = next(o["metadata"]["name"] for o in objs if o["kind"] == "FSDPTraining")
    for o in objs:
        whole.cluster.apply(o)

    # While it runs, the operator reads the script's own metrics into the status.
    running = wait_for(lambda: (st := status(whole, name, ns)).get("step") and st, 240, "status.step")
    assert running["phase"] in ("Running", "Succeeded"), dump(running)
    assert wait_phase(whole, name, ns, TERMINAL, 300) == "Succeeded"

    final = status(whole, name, ns)
    assert final["step"] == steps and math.isfinite(final["loss"]), dump(final)
    assert final["checkpoint"]["lastStep"] == steps, dump(final)
    logs = trainer_logs(whole, name, ns)
    losses = {int(m.group(1)): float(m.group(2)) for m in SCRIPT_STEP.finditer(logs)}
    assert sorted(losses) == list(range(1, steps + 1)), logs[-3000:]
    first, last = sum(losses[s] for s in range(1, 6)) / 5, sum(losses[s] for s in range(steps - 4, steps + 1)) / 5
    assert last < first * 0.8, losses
    # The script saved where $FSDP_CHECKPOINT_DIR pointed: the claim's volume (it keeps the last two).
    root = whole.node_agent.claim_path(ns, "t5-finetune-checkpoints")
    assert sorted(p.parent.name for p in Path(root).glob("step-*/COMPLETE")) == ["step-00000020", "step-00000030"]
    # No built-in trainer config: no ConfigMap of ours, and the script's own ConfigMap is mounted instead.
    assert whole.get("configmap", f"{name}-trainer", ns) is None
    job = whole.get("pytorchjob", name, ns)
    assert job is not None
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["torchrun"], container["command"]
    assert container["args"][-5:] == ["/workspace/t5_finetune.py", "--steps", str(steps), "--checkpoint-every", "10"]
