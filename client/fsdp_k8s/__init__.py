"""fsdp_k8s: FSDPTraining from Python (a notebook, a pipeline): check, plan, submit, wait, read back.

    import fsdp_k8s
    c = fsdp_k8s.Client()                    # the kubeconfig's current context
    c.plan("fsdptraining.yaml").summary()    # before a GPU is bought
    c.submit("fsdptraining.yaml")
    c.wait("llama-sft", progress=True).phase
    c.metrics("llama-sft").loss
    c.export("llama-sft", "s3://models/llama-sft").output   # a Job writes the Hugging Face model

The top layer, beside the CLI: it imports the API package and the
operator's renderer, never torch, kopf or the controller (tests/test_layers.py).
"""

from fsdp_api import FSDPTraining, FSDPTrainingStatus

from .client import Client, Event, MemoryWarning, load_training
from .errors import ApiError, ClientError, InvalidTraining, WaitTimeout
from .export import ExportResult
from .metrics import TrainerMetrics
from .training import TERMINAL_PHASES, Training

__all__ = [
    "TERMINAL_PHASES",
    "ApiError",
    "Client",
    "ClientError",
    "Event",
    "ExportResult",
    "FSDPTraining",
    "FSDPTrainingStatus",
    "InvalidTraining",
    "MemoryWarning",
    "TrainerMetrics",
    "Training",
    "WaitTimeout",
    "load_training",
]
