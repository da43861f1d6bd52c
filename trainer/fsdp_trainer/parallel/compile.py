"""torch.compile of the decoder layers, with a fallback to eager where inductor fails.

Per layer rather than the whole model: all layers share one compiled graph,
compile time stays flat in depth, and FSDP's hooks stay between layers.

Dynamo traces almost any model (what it cannot trace becomes a graph break,
not an error); what fails is inductor turning a graph into kernels: a
lowering it lacks, a C compiler that Triton or the CPU backend needs and the
machine lacks, a toolchain bug. Such a failure surfaces at the first forward,
in the middle of a step, where nothing can be retried cleanly. So the layers
compile through a backend that calls inductor and, if inductor raises, hands
dynamo the traced graph unchanged: that graph runs eager, with the same
operations and numerics as the model without compile. The backward graph is
compiled in the same call (not lazily at the first backward), so its failures
fall back too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from fsdp_api.trainer_config import TrainerConfig
from torch import nn

from ..model.architecture import decoder_units

log = logging.getLogger(__name__)

MODE_OFF, MODE_INDUCTOR, MODE_EAGER = "off", "inductor", "eager"


@dataclass
class CompileReport:
    """What compile did in this process: asked or not (and why), graphs compiled, graphs that fell back."""

    enabled: bool
    reason: str
    compiled: int = 0
    fallbacks: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        """off (not asked), eager (inductor failed and the layers run eager), inductor (compiled, or not yet run)."""
        if not self.enabled:
            return MODE_OFF
        return MODE_EAGER if self.fallbacks else MODE_INDUCTOR

    def record(self) -> dict[str, object]:
        return {"mode": self.mode, "reason": self.reason, "graphs": self.compiled, "fallbacks": len(self.fallbacks)}


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


@contextlib.contextmanager
def _backward_compiled_with_forward() -> Iterator[None]:
    config = torch._functorch.config
    if not hasattr(config, "force_non_lazy_backward_lowering"):  # older torch: the backward stays lazy
        yield
        return
    with config.patch(force_non_lazy_backward_lowering=True):
        yield


def inductor_or_eager(report: CompileReport) -> Callable[..., Callable[..., object]]:
    """A dynamo backend: inductor's compiled graph, or (if inductor raises) the traced graph run eager."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        from torch._inductor.compile_fx import compile_fx

        try:
            with _backward_compiled_with_forward():
                compiled = compile_fx(gm, example_inputs)
        except Exception as e:  # any inductor failure falls back; the reason is logged
            reason = _first_line(e)
            if not report.fallbacks:
                log.warning("training.compile: inductor failed (%s); the decoder layers run eager", reason)
            report.fallbacks.append(reason)
            return gm.forward
        assert callable(compiled)  # compile_fx returns file names or weights only when compiling ahead of time
        report.compiled += 1
        return compiled

    return backend


def compile_report(cfg: TrainerConfig, device: torch.device) -> CompileReport:
    return CompileReport(*cfg.training.compile_decision(device.type))


def apply_compile(model: nn.Module, report: CompileReport) -> None:
    """Compile each decoder layer in place (parameter names unchanged), if the report says compile."""
    if not report.enabled:
        return
    backend = inductor_or_eager(report)
    for unit in decoder_units(model):
        unit.module.compile(backend=backend)
    log.info("compile: the decoder layers through inductor (%s)", report.reason)
