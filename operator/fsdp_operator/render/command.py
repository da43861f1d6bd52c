"""The trainer container's command: the launcher's (``launchers/``), joined at the backend's rendezvous host."""

from __future__ import annotations

from typing import Any

from fsdp_api import FSDPTrainingSpec, contract
from fsdp_api.launch import checked_launch, trainer_program

from .. import backends, launchers


def pod_command(spec: FSDPTrainingSpec, name: str) -> dict[str, Any]:
    """The trainer container's ``command`` and ``args``.

    The built-in trainer: its config check, which then starts the launcher. A
    script of your own (spec.command): the launcher directly, with the same
    rendezvous, running the command and its args on every rank (the image
    needs torchrun on its PATH, as any PyTorch image has).
    """
    backend = backends.named(spec.backend)
    own = spec.command is not None
    program = [*spec.command, *(spec.args or [])] if spec.command is not None else trainer_program(contract.CONFIG_PATH)
    launch = launchers.of_spec(spec).command(
        spec, endpoint=backends.rendezvous_endpoint(backend, name), run_id=name, program=program
    )
    if own:
        return {"command": launch[:1], "args": launch[1:]}
    # Node 0 hosts the rendezvous at its own address where its rendezvous name is not its
    # hostname: otherwise torchrun decides by looking that name up, and without the record
    # node 0 waits out the read timeout as a client of a store nobody hosts.
    node_zero = f"{backend.node_index_env}=0" if backend.node_index_env else None
    cmd = checked_launch(contract.CONFIG_PATH, launch, host_rendezvous_if=node_zero)
    return {"command": cmd[:1], "args": cmd[1:]}
