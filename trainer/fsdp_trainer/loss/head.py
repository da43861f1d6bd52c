"""The loss of a micro-batch, through the model's own forward.

Two ways, chosen once at start (``training.logits``):

- ``FullLogits``: the model returns its logits, ``token_loss_sum`` takes
  their cross-entropy in fp32 (every token's logits exist at once);
- ``ChunkedHead``: the model's output head is patched so that, while
  labels are set, it returns an empty tensor and computes the loss itself,
  a chunk of tokens at a time (``chunked.py``). Parameter names, FSDP's
  grouping and the checkpoint are unchanged: only the head's ``forward``
  is replaced, and without labels it is the original one (export, probes,
  generation).

``output_loss`` installs the chunked head only after a check on a probe
input shows that the model's logits are its head's output under the
transform this package knows for the architecture; otherwise the run keeps
full logits and logs why, in one line.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fsdp_api.loss_chunks import loss_chunk_tokens
from torch import nn
from transformers import PreTrainedModel

from ..data.packing import IGNORE_INDEX
from .chunked import LogitTransform, linear_cross_entropy_sum
from .model_call import ModelCall
from .transform import logit_transform

log = logging.getLogger(__name__)

PROBE_TOKENS = 16


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy, computed in fp32 whatever the compute dtype.

    Labels equal to IGNORE_INDEX (prompts, padding) add nothing.
    """
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=IGNORE_INDEX)


class OutputLoss(Protocol):
    mode: str
    reason: str

    def loss_sum(self, call: ModelCall, labels: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of the model's output on ``call`` against ``labels`` (a differentiable scalar)."""
        ...


@dataclass
class FullLogits:
    mode: str = "full"
    reason: str = ""

    def loss_sum(self, call: ModelCall, labels: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(call().logits, labels)


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


@dataclass
class ChunkedHead:
    head: nn.Linear
    transform: LogitTransform
    chunk_tokens: int
    mode: str = "chunked"
    reason: str = ""
    _labels: torch.Tensor | None = field(default=None, repr=False)
    _losses: list[torch.Tensor] = field(default_factory=list, repr=False)

    def install(self) -> None:
        original = self.head.forward

        def forward(hidden: torch.Tensor) -> torch.Tensor:
            if self._labels is None:
                return original(hidden)
            self._losses.append(self._loss(hidden, self._labels))
            # The model's code after the head (scaling, soft-capping, float())
            # runs on an empty tensor; the loss was computed here.
            return hidden.new_empty((*hidden.shape[:-1], 0))

        # One instance's forward replaced, which is the point (parameters and FSDP's grouping stay as they are).
        self.head.forward = forward  # type: ignore[method-assign,assignment]

    def _loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        weight, bias = self.head.weight, self.head.bias
        dtype = _compute_dtype(hidden, weight)
        with torch.autocast(hidden.device.type, enabled=False):
            return linear_cross_entropy_sum(
                hidden.to(dtype),
                weight.to(dtype),
                labels,
                bias=None if bias is None else bias.to(dtype),
                transform=self.transform,
                chunk_tokens=self.chunk_tokens,
            )

    @contextlib.contextmanager
    def targets(self, labels: torch.Tensor) -> Iterator[list[torch.Tensor]]:
        """While open, the head computes the loss against ``labels``; the losses land in the yielded list."""
        self._labels, self._losses = labels, []
        try:
            yield self._losses
        finally:
            self._labels = None

    def loss_sum(self, call: ModelCall, labels: torch.Tensor) -> torch.Tensor:
        with self.targets(labels) as losses:
            call()
        if len(losses) != 1:
            raise RuntimeError(f"the model called its output head {len(losses)} times in one forward, expected once")
        return losses[0]


def _probe_mismatch(
    model: PreTrainedModel, head: nn.Module, transform: LogitTransform, device: torch.device
) -> str | None:
    """Why the model's logits are not ``transform(head(hidden))`` on a probe input (None: they are)."""
    vocab = model.config.get_text_config().vocab_size
    inputs = (torch.arange(PROBE_TOKENS, device=device).view(1, -1) * 7919 + 3) % vocab
    seen: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=inputs).logits
        model.train(was_training)
    finally:
        hook.remove()
    if len(seen) != 1:
        return f"the model called its output head {len(seen)} times in a forward, not once"
    out = seen[0]
    if not isinstance(out, torch.Tensor) or out.shape != logits.shape:
        shape = tuple(getattr(out, "shape", ()))
        return f"its logits {tuple(logits.shape)} are not its output head's output {shape}"
    expected = transform.apply(out.float())
    # bf16 logits carry about 3 significant digits; a missing transform moves them by far more.
    tol = 1e-4 if logits.dtype == torch.float32 else 2e-2
    worst = (logits.float() - expected).abs().max().item()
    if worst > tol * max(1.0, expected.abs().max().item()):
        return f"its logits differ from {transform} applied to its output head's output by up to {worst:.3g}"
    return None


def _agreed(reason: str | None, device: torch.device) -> str | None:
    """Every rank takes the same decision (a rank that saw a mismatch decides for all)."""
    if not dist.is_available() or not dist.is_initialized():
        return reason
    flag = torch.tensor([0.0 if reason is None else 1.0], device=device)
    dist.all_reduce(flag)
    if flag.item() == 0:
        return None
    return reason or "another rank found the model's logits differ from its head's output"


def output_loss(model: PreTrainedModel, requested: str, device: torch.device) -> OutputLoss:
    """The loss computation for this run; collective under torch.distributed (every rank calls it)."""
    if requested == "full":
        return FullLogits(reason="training.logits: full")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    # A plain Linear only: a subclass may compute more than weight x hidden + bias.
    if isinstance(head, nn.Linear) and type(head) is nn.Linear:
        transform = logit_transform(model.config)
        reason = _agreed(_probe_mismatch(model, head, transform, device), device)
        if reason is None:
            chunked = ChunkedHead(head, transform, loss_chunk_tokens(model.config.get_text_config().vocab_size))
            chunked.install()
            return chunked
    else:
        why = "the model has no output head" if head is None else f"its output head is a {type(head).__name__}"
        reason = _agreed(f"{why}, not a plain Linear", device)
    log.warning("training.logits: chunked is not possible for this model (%s); training on full logits", reason)
    return FullLogits(reason=reason or "")
