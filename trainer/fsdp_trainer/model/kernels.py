"""``training.kernels``: fused kernels patched into the model by its type, one kernel set per entry.

A kernel set knows which model types it covers and patches a model (on the
meta device, before FSDP wraps it: the patches replace forwards, not
weights). Liger-Kernel's instance patching replaces the RMSNorm and MLP
modules' forwards (and, module-wide, the architecture's rotary function)
with its Triton kernels. Its fused linear cross-entropy is not used: the
loss is the trainer's own (``training.logits``), computed outside the model.

``auto`` applies the default set where it can run and keeps the model's own
modules otherwise; the reason is on the start-up line. An explicit set that
cannot apply is one ConfigError line. Triton kernels run on CUDA only, and
take local tensors (tensor parallelism's norms are DTensors).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Protocol

from transformers import PreTrainedModel

from ..errors import ConfigError

FIELD = "training.kernels"
AUTO, NONE = "auto", "none"


class KernelSet(Protocol):
    name: str
    library: str  # the module a run needs installed

    def covers(self, model_type: str) -> bool: ...

    def apply(self, model: PreTrainedModel) -> str:
        """Patch ``model``; what was patched, for the log."""
        ...


class LigerKernels:
    name, library = "liger", "liger_kernel"

    def covers(self, model_type: str) -> bool:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

        return model_type in MODEL_TYPE_TO_APPLY_LIGER_FN

    def apply(self, model: PreTrainedModel) -> str:
        from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(
            model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False
        )
        return f"Liger's RMSNorm, rotary and gated-MLP kernels for {model.config.model_type}"


KERNEL_SETS: dict[str, KernelSet] = {k.name: k for k in (LigerKernels(),)}
DEFAULT = "liger"  # what auto applies where it can


@dataclass(frozen=True)
class KernelReport:
    applied: str | None  # the kernel set patched in; None: the model's own modules
    reason: str

    def line(self) -> str:
        return f"{FIELD}: {self.applied or NONE} ({self.reason})"


def apply_kernels(choice: str, model: PreTrainedModel, device_type: str, tensor: int) -> KernelReport:
    """Patch ``model`` with the kernel set ``choice`` names (or auto's), or say why not."""
    if choice == NONE:
        return KernelReport(None, f"{FIELD} none")
    kernels = KERNEL_SETS[DEFAULT if choice == AUTO else choice]
    model_type = model.config.model_type
    blocker = None
    if device_type != "cuda":
        blocker = f"{device_type} ranks: its Triton kernels run on CUDA only"
    elif tensor > 1:
        blocker = "parallelism.tensor > 1: its kernels take local tensors, not DTensors"
    elif importlib.util.find_spec(kernels.library) is None:
        blocker = f"{kernels.library} is not installed in this image"
    elif not kernels.covers(model_type):
        blocker = f"it has no kernels for model type {model_type}"
    if blocker is not None:
        if choice != AUTO:
            raise ConfigError([f"{FIELD}: {kernels.name} cannot apply: {blocker}; use auto or none"])
        return KernelReport(None, f"auto: {kernels.name}: {blocker}")
    return KernelReport(kernels.name, kernels.apply(model))
