"""The forward and backward of one optimizer step's micro-batches: one strategy per way of running the model.

A strategy says what part of a batch this rank computes (``local``), the
layout its forward and backward run inside (``layout``) and the model's
attention inputs (``attention``); ``call`` is the one call of the model on a
micro-batch, and ``forward_backward`` runs the micro-batches on those, with
gradient sync on the last one only. The loss itself is the objective's
(``Objective``: a token loss, or a preference objective's pairs), made from the
strategy's call, so every strategy serves every objective and no objective
holds the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from ..data.attention import PackedAttention
from ..data.context_split import ContextBatch, split_rows
from ..data.packing import Batch
from ..loss import ModelCall
from ..parallel.context_parallel import ContextParallel
from ..parallel.parallelize import compute_context, set_gradient_sync

# The summed loss of a micro-batch from the model's call on it; and, for a preference objective, its pairs' sums.
Objective = Callable[[Batch, ModelCall], tuple[torch.Tensor, torch.Tensor | None]]


class ForwardBackward(Protocol):
    @property
    def computes_loss(self) -> bool: ...

    def local(self, batch: Batch) -> Batch: ...

    def layout(self, batch: Batch) -> contextlib.AbstractContextManager[None]: ...

    def attention(self, batch: Batch) -> dict[str, object]: ...

    def call(self, batch: Batch) -> ModelCall: ...

    def forward_backward(
        self, batches: Sequence[Batch], objective: Objective, divisor: float | torch.Tensor, pair_stats: int
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(self, batch: Batch, objective: Objective) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class PlainStep:
    """Every row whole, in this process (data parallelism, FSDP, tensor parallelism alike)."""

    def __init__(self, model: nn.Module, precision: str, device: torch.device, packed: PackedAttention | None) -> None:
        self.model, self.precision, self.device, self.packed = model, precision, device, packed

    @property
    def computes_loss(self) -> bool:
        """Whether this rank's forward returns a loss (every rank but a pipeline's earlier stages)."""
        return True

    def local(self, batch: Batch) -> Batch:
        return batch

    def layout(self, batch: Batch) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def attention(self, batch: Batch) -> dict[str, object]:
        # Packed rows of the supervised formats attend only within their row.
        return {} if self.packed is None else self.packed.kwargs(batch.position_ids)

    def call(self, batch: Batch) -> ModelCall:
        """The model on this micro-batch: its input ids and the attention inputs of this strategy."""
        return ModelCall(self.model, {"input_ids": batch.inputs, **self.attention(batch)})

    def forward(self, batch: Batch, objective: Objective) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One micro-batch's summed loss (no backward): validation's, and the step's before its backward."""
        with self.layout(batch), compute_context(self.model, self.precision, self.device):
            return objective(batch, self.call(batch))

    def forward_backward(
        self, batches: Sequence[Batch], objective: Objective, divisor: float | torch.Tensor, pair_stats: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batches' forward and backward, each loss divided by ``divisor``; (loss sum, pair sums)."""
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        pair_sums = torch.zeros(pair_stats, device=self.device, dtype=torch.float32)
        last = len(batches) - 1
        for micro, batch in enumerate(batches):
            # Gradients are reduced once, on the step's last micro-batch.
            set_gradient_sync(self.model, micro == last)
            with self.layout(batch):
                with compute_context(self.model, self.precision, self.device):
                    loss, pairs = objective(batch, self.call(batch))
                loss = loss / divisor
                loss.backward()
            loss_sum += loss.detach()
            if pairs is not None:
                pair_sums += pairs
        return loss_sum, pair_sums


class ContextParallelStep(PlainStep):
    """Each row split over the context-parallel peers: this rank's positions, attention over the whole rows."""

    def __init__(
        self,
        model: nn.Module,
        precision: str,
        device: torch.device,
        packed: PackedAttention | None,
        context: ContextParallel,
    ) -> None:
        super().__init__(model, precision, device, packed)
        self.context = context

    def local(self, batch: Batch) -> Batch:
        return split_rows(batch, self.context.positions)

    def layout(self, batch: Batch) -> contextlib.AbstractContextManager[None]:
        assert isinstance(batch, ContextBatch)
        return self.context.active(batch.row_documents, batch.inputs.device)

    def attention(self, batch: Batch) -> dict[str, object]:
        # The context-parallel attention's own mask keeps packed rows apart.
        assert isinstance(batch, ContextBatch)
        return batch.model_inputs()


def step_strategy(
    model: nn.Module,
    precision: str,
    device: torch.device,
    packed: PackedAttention | None,
    context: ContextParallel | None,
) -> ForwardBackward:
    """The strategy of the parallel plan: context-parallel where rows are split, else plain."""
    if context is not None:
        return ContextParallelStep(model, precision, device, packed, context)
    return PlainStep(model, precision, device, packed)
