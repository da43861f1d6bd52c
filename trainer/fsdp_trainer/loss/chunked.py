"""A linear output head and its cross-entropy, one chunk of tokens at a time.

The plain path builds the logits of every token of a micro-batch, their fp32
copy, log-softmax and, in backward, their gradient: at a 128k vocabulary
the largest tensors of the step. Here forward computes the head's matmul,
the loss and both gradients chunk by chunk and keeps only the gradients of
the hidden states and of the head's weight; backward scales them. The FLOPs
are the plain path's (one matmul forward, two for the gradients), nothing is
recomputed, and no more than one chunk's logits exist at once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..data.packing import IGNORE_INDEX


class LogitTransform(NamedTuple):
    """What the model does to its head's output before the loss: ``cap * tanh(scale * x / cap)``.

    ``cap`` None: no soft-capping (``scale * x``).
    """

    scale: float = 1.0
    cap: float | None = None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The transform as the model computes it (used on the plain path's probe and in tests)."""
        z = logits * self.scale if self.scale != 1.0 else logits
        return torch.tanh(z / self.cap) * self.cap if self.cap else z


IDENTITY = LogitTransform()


def _chunk_loss(
    logits: torch.Tensor, labels: torch.Tensor, transform: LogitTransform, grad_dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Summed cross-entropy of one chunk (fp32 logits, consumed) and, if ``grad_dtype``, d(loss)/d(logits).

    Few passes over the chunk: log-softmax, one exp in place, and the loss
    mask applied in the same pass that casts the gradient to the matmul dtype.
    """
    z = logits.mul_(transform.scale) if transform.scale != 1.0 else logits
    slope = None
    if transform.cap:
        z = torch.tanh(z.div_(transform.cap))
        slope = (1.0 - z * z).mul_(transform.scale) if grad_dtype is not None else None
        z = z.mul_(transform.cap)
    valid = labels != IGNORE_INDEX
    targets = torch.where(valid, labels, 0)
    logp = torch.log_softmax(z, dim=-1)
    del z, logits  # the chunk's logits are freed before the gradient exists
    loss = -(logp.gather(1, targets.unsqueeze(1)).squeeze(1) * valid).sum()
    if grad_dtype is None:
        return loss, None
    # softmax(z) - onehot(target), zero on ignored rows
    grad = logp.exp_()
    grad[torch.arange(grad.shape[0], device=grad.device), targets] -= 1.0
    if slope is not None:
        grad.mul_(slope)
    elif transform.scale != 1.0:
        grad.mul_(transform.scale)
    out = torch.empty(grad.shape, dtype=grad_dtype, device=grad.device)
    return loss, torch.mul(grad, valid.unsqueeze(1), out=out)


_fp32_out_matmul: dict[str, bool] = {}  # device type -> whether addmm takes out_dtype there


def _accumulate(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """total += a @ b, accumulated in total's dtype (fp32) without a whole-size temporary where the backend can."""
    if total.dtype == a.dtype:
        total.addmm_(a, b)
        return
    device = total.device.type
    if _fp32_out_matmul.get(device, device == "cuda"):
        try:  # bf16 inputs, fp32 output: CUDA's addmm.dtype_out (not every torch has it)
            torch.addmm(total, a, b, out_dtype=total.dtype, out=total)
            return
        except (TypeError, RuntimeError, NotImplementedError):
            _fp32_out_matmul[device] = False
    total.add_(a @ b)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, transform, chunk_tokens):
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        want_grad = need_h or need_w or need_b
        grad_h = torch.empty_like(hidden) if need_h else None
        # fp32 sums over the chunks: a bf16 running sum would round once per chunk.
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_dtype = hidden.dtype if want_grad else None
        for start in range(0, hidden.shape[0], chunk_tokens):
            h = hidden[start : start + chunk_tokens]
            # Passed unnamed, so _chunk_loss can free the logits before the gradient is allocated.
            loss, grad = _chunk_loss(
                (h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())).float(),
                labels[start : start + chunk_tokens],
                transform,
                grad_dtype,
            )
            total += loss
            if grad is None:
                continue
            if grad_b is not None:
                grad_b += grad.float().sum(0)
            if grad_h is not None:
                torch.mm(grad, weight, out=grad_h[start : start + chunk_tokens])
            if grad_w is not None:
                _accumulate(grad_w, grad.t(), h)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.param_dtypes = (weight.dtype, bias.dtype if bias is not None else None)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.param_dtypes
        # Scaled in place: these buffers belong to this call alone, so no copy is needed.
        grad_h = grad_h.mul_(grad_out.to(grad_h.dtype)) if grad_h is not None else None
        grad_w = grad_w.mul_(grad_out).to(w_dtype) if grad_w is not None else None
        grad_b = grad_b.mul_(grad_out).to(b_dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None


def linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    transform: LogitTransform = IDENTITY,
    chunk_tokens: int,
) -> torch.Tensor:
    """``cross_entropy(transform(hidden @ weight.T + bias), labels, reduction="sum")``, chunked.

    ``hidden`` is ``[..., H]`` and ``labels`` the matching ``[...]``;
    labels equal to IGNORE_INDEX add nothing. The matmuls run in the
    dtype of ``hidden`` and ``weight`` (cast to one dtype by the caller),
    the softmax and the loss in fp32.
    """
    return _LinearCrossEntropy.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, bias, labels.reshape(-1), transform, max(1, chunk_tokens)
    )
