"""torchrun through a c10d rendezvous: the launcher of every training today.

Every rendezvous setting is an explicit flag rather than left to the PET_*
variables the Kubeflow training operator injects: for a Worker-only job
without elasticPolicy the operator sets only PET_NNODES and
PET_NPROC_PER_NODE (no endpoint, no backend), so torchrun would fall back to
its single-node defaults. With elasticPolicy the injected values equal these
flags (same port, same host), and flags take precedence over PET_* anyway.
docs/renderer.md has the evidence.
"""

from __future__ import annotations

from collections.abc import Sequence

from fsdp_api import FSDPTrainingSpec
from fsdp_api.launch import torchrun_rendezvous

# torchrun restarts for fixed-size jobs, the same default as elastic.maxRestarts.
DEFAULT_MAX_RESTARTS = 3
# Pods of one job start minutes apart (Karpenter launching nodes, multi-GB
# image pulls). A pod that starts before worker 0 waits read_timeout for its
# c10d store (torch's default 60 s would crash-loop it and burn backoffLimit),
# and the first rendezvous waits join_timeout for every node.
RDZV_CONF = "join_timeout=1800,read_timeout=600"


def nnodes(spec: FSDPTrainingSpec) -> str:
    """torchrun's --nnodes: a fixed count, or MIN:MAX for elastic jobs."""
    if spec.elastic is not None:
        return f"{spec.elastic.min_nodes}:{spec.elastic.max_nodes}"
    return str(spec.resources.nodes)


class TorchrunLauncher:
    name = "torchrun"

    def command(self, spec: FSDPTrainingSpec, *, endpoint: str, run_id: str, program: Sequence[str]) -> list[str]:
        return torchrun_rendezvous(
            nnodes=nnodes(spec),
            nproc_per_node=spec.procs_per_node(),
            endpoint=endpoint,
            run_id=run_id,
            rdzv_conf=RDZV_CONF,
            max_restarts=self.restarts(spec),
            program=program,
        )

    def restarts(self, spec: FSDPTrainingSpec) -> int:
        """torchrun's --max-restarts, for fixed-size jobs too.

        A worker failure is then handled inside the pods: every agent restarts
        its workers into a new rendezvous round, with no container restart. When
        an agent gives up instead it closes the rendezvous, and the other pods can
        only rejoin once worker 0's container (the store's host) has restarted.
        """
        return spec.elastic.max_restarts if spec.elastic is not None else DEFAULT_MAX_RESTARTS
