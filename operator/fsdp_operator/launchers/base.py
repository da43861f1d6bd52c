"""The protocol every launcher implements: what the pod command and the job's restart budget ask of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fsdp_api import FSDPTrainingSpec


class Launcher(Protocol):
    """Starts a pod's ranks, joined to every other pod's through a rendezvous at ``endpoint``."""

    name: str

    def command(self, spec: FSDPTrainingSpec, *, endpoint: str, run_id: str, program: Sequence[str]) -> list[str]:
        """The command line that runs ``program`` on each of this pod's ranks."""
        ...

    def restarts(self, spec: FSDPTrainingSpec) -> int:
        """How many times a pod restarts its ranks in place (no container restart) before it gives up."""
        ...
