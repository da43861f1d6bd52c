"""The torchrun command line of the trainer container.

Every rendezvous setting is an explicit flag rather than left to the PET_*
variables the Kubeflow training operator injects: for a Worker-only job
without elasticPolicy the operator sets only PET_NNODES and
PET_NPROC_PER_NODE (no endpoint, no backend), so torchrun would fall back to
its single-node defaults. With elasticPolicy the injected values equal these
flags (same port, same host), and flags take precedence over PET_* anyway.
docs/renderer.md has the evidence.
"""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec, contract
from fsdp_api.launch import checked_launch, torchrun_rendezvous, trainer_program

from .. import backends


def nnodes(spec: FSDPTrainingSpec) -> str:
    """torchrun's --nnodes: a fixed count, or MIN:MAX for elastic jobs."""
    if spec.elastic is not None:
        return f"{spec.elastic.min_nodes}:{spec.elastic.max_nodes}"
    return str(spec.resources.nodes)


# torchrun restarts for fixed-size jobs, the same default as elastic.maxRestarts.
DEFAULT_MAX_RESTARTS = 3
# Pods of one job start minutes apart (Karpenter launching nodes, multi-GB
# image pulls). A pod that starts before worker 0 waits read_timeout for its
# c10d store (torch's default 60 s would crash-loop it and burn backoffLimit),
# and the first rendezvous waits join_timeout for every node.
RDZV_CONF = "join_timeout=1800,read_timeout=600"


def max_restarts(spec: FSDPTrainingSpec) -> int:
    """torchrun's --max-restarts, for fixed-size jobs too.

    A worker failure is then handled inside the pods: every agent restarts
    its workers into a new rendezvous round, with no container restart. When
    an agent gives up instead it closes the rendezvous, and the other pods can
    only rejoin once worker 0's container (the store's host) has restarted.
    """
    return spec.elastic.max_restarts if spec.elastic is not None else DEFAULT_MAX_RESTARTS


def pod_command(spec: FSDPTrainingSpec, name: str) -> dict[str, Any]:
    """The trainer container's ``command`` and ``args``.

    The built-in trainer: its config check, which then starts torchrun. A
    script of your own (spec.command): torchrun directly, with the same
    rendezvous, running the command and its args on every rank (the image
    needs torchrun on its PATH, as any PyTorch image has).
    """
    own = spec.command is not None
    backend = backends.named(spec.backend)
    program = [*spec.command, *(spec.args or [])] if spec.command is not None else None
    torchrun = torchrun_rendezvous(
        nnodes=nnodes(spec),
        nproc_per_node=spec.procs_per_node(),
        endpoint=backends.rendezvous_endpoint(backend, name),
        run_id=name,
        rdzv_conf=RDZV_CONF,
        max_restarts=max_restarts(spec),
        program=program if program is not None else trainer_program(contract.CONFIG_PATH),
    )
    # Node 0 hosts the rendezvous at its own address where its rendezvous name is not its
    # hostname: otherwise torchrun decides by looking that name up, and without the record
    # node 0 waits out the read timeout as a client of a store nobody hosts.
    node_zero = f"{backend.node_index_env}=0" if backend.node_index_env else None
    cmd = torchrun if own else checked_launch(contract.CONFIG_PATH, torchrun, host_rendezvous_if=node_zero)
    return {"command": cmd[:1], "args": cmd[1:]}
