"""What starts the ranks inside each pod (the ML policy), apart from the job kind that makes the pods.

A backend (``backends/``) says how a training's pods are made and found; a
launcher says what command each pod runs to start its ranks and join the
others, and how many times it restarts them in place before the container
fails. The renderer's pod command asks the launcher, the backend's job its
restart budget. Kubeflow Trainer splits its runtime plugins the same way (the
torch ML policy beside the JobSet job kind). Today there is one launcher,
torchrun; a new one is one module and one entry below.
"""

from __future__ import annotations

from fsdp_api import FSDPTrainingSpec

from .base import Launcher
from .torchrun import TorchrunLauncher

REGISTRY: dict[str, Launcher] = {launcher.name: launcher for launcher in (TorchrunLauncher(),)}
DEFAULT: Launcher = REGISTRY[TorchrunLauncher.name]


def of_spec(spec: FSDPTrainingSpec) -> Launcher:
    """The launcher of a training: torchrun, for the built-in trainer and for a script of your own alike."""
    del spec  # one launcher so far; a spec field would choose among several here
    return DEFAULT


__all__ = ["DEFAULT", "REGISTRY", "Launcher", "of_spec"]
