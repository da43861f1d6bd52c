"""Context parallelism: each row split over the context ranks, attention over the whole row.

Every rank of a context group holds ``seqLen / context`` tokens of each row:
chunks ``r`` and ``2·context - 1 - r`` of ``2·context`` equal chunks (an
early one and a late one, so causal attention's work is the same on every
rank). Embeddings, norms, MLPs, the output head and the loss are per token
and run on those tokens alone. Attention is the one place tokens meet: each
layer all-gathers the row's keys and values over the group (their gradients
are summed back in backward) and attends its local queries to all of them
under a mask built from the tokens' global positions.

Why an all-gather of keys and values and an explicit mask, not torch's
ring attention (``torch.distributed.tensor.experimental.context_parallel``):
torch's context-parallel SDPA takes no attention mask, only ``is_causal``,
so packed rows would attend across their documents and a model's sliding
window would be lost. The mask here is exact for any of them: a query may
see a key at or before it, in the same document (packed SFT rows, where the
positions restart at 0), and within the layer's ``sliding_window`` if it has
one. On CUDA a plain token stream with no window needs no mask at all: each
of the rank's two chunks attends causally to the keys up to its own end
(``causal_lower_right``, which SDPA's flash kernel takes). The cost: every
layer holds the row's keys and values (``2 · seqLen · kv_heads · head_dim``
per row, not divided by ``context``), and packed rows, a window or a CPU add
an additive mask of ``seqLen / context × seqLen`` per row in the compute
dtype, built once per micro-batch and shared by the layers.

The attention goes in through transformers' attention interface (the model's
``_attn_implementation`` becomes ``IMPLEMENTATION``), so any architecture
whose attention layers call that interface works unchanged; that they do is
checked on the first forward, and architectures that mix tokens elsewhere
(state-space or convolution layers) or soft-cap attention logits are refused
before training. Rotary and learned positions come from ``position_ids``: the
tokens' global positions (per document in packed rows).

Outside a training or validation batch (the loss's probe, the export probe)
no layout is active: a layer then attends over the tokens it was given, as
a plain causal model does.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface, PreTrainedModel

from ..errors import ConfigError
from .distributed import WorldInfo
from .parallelize import compute_context, reshard
from .plan import ParallelPlan, context_group

log = logging.getLogger(__name__)

IMPLEMENTATION = "fsdp_context_parallel"
# Token mixers that a split sequence would break (each rank would see only its tokens).
_ATTENTION_LAYERS = {"full_attention", "sliding_attention"}


class _SdpaOptions(TypedDict):
    """The keyword arguments every ``scaled_dot_product_attention`` call of a layer shares."""

    dropout_p: float
    scale: float | None
    enable_gqa: bool


def chunk_positions(seq_len: int, degree: int, index: int) -> torch.Tensor:
    """The global positions a context rank holds: chunks ``index`` and ``2·degree - 1 - index``."""
    size = seq_len // (2 * degree)
    first = torch.arange(index * size, (index + 1) * size)
    last = 2 * degree - 1 - index
    return torch.cat([first, torch.arange(last * size, (last + 1) * size)])


def context_parallel_errors(model: PreTrainedModel, degree: int, seq_len: int) -> list[str]:
    """Why ``model`` cannot split its rows over ``degree`` context ranks (one line each); empty when it can."""
    if degree == 1:
        return []
    name = type(model).__name__
    if seq_len % (2 * degree):
        return [
            f"parallelism.context: training.seqLen {seq_len} is not a multiple of 2 x context = {2 * degree}: "
            "each context rank holds two equal chunks of every row"
        ]
    config = model.config.get_text_config()
    if getattr(config, "attn_logit_softcapping", None):
        return [
            f"parallelism.context: {name} soft-caps its attention logits, which the context-parallel attention "
            "(PyTorch's scaled_dot_product_attention) cannot; use parallelism.context: 1"
        ]
    if getattr(config, "attention_chunk_size", None):
        return [f"parallelism.context: {name}'s chunked attention is not supported; use parallelism.context: 1"]
    others = sorted(set(getattr(config, "layer_types", None) or []) - _ATTENTION_LAYERS)
    convs = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.Conv1d)})
    if others or convs:
        return [
            f"parallelism.context: {name} mixes tokens outside attention ({', '.join(others + convs)}), which "
            "would see only a rank's part of each row; use parallelism.context: 1"
        ]
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return [
            f"parallelism.context: {name} takes no position_ids, so a rank's tokens cannot be given their "
            "positions in the row; use parallelism.context: 1"
        ]
    return []


class _GatherRow(torch.autograd.Function):
    """All-gather along the sequence (dim 2 of [batch, heads, seq, dim]); backward sums each rank's part."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: dist.ProcessGroup, degree: int, index: int) -> torch.Tensor:
        ctx.group, ctx.degree, ctx.index = group, degree, index
        parts = [torch.empty_like(local) for _ in range(degree)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        parts = [p.contiguous() for p in grad.chunk(ctx.degree, dim=2)]
        if grad.is_cuda:
            out = torch.empty_like(parts[ctx.index])
            dist.reduce_scatter(out, parts, group=ctx.group)
            return out, None, None, None
        # gloo has no reduce-scatter: sum everything, keep this rank's part.
        whole = torch.cat(parts, dim=2)
        dist.all_reduce(whole, group=ctx.group)
        return whole.chunk(ctx.degree, dim=2)[ctx.index].contiguous(), None, None, None


@dataclass
class Layout:
    """Where one micro-batch's local tokens sit in their rows, and the masks that follow from it."""

    queries: torch.Tensor  # [local] global positions of this rank's tokens
    seq_len: int
    documents: torch.Tensor | None  # [batch, seq_len] document index per token of the whole row; None: one stream
    masks: dict[tuple[int | None, torch.dtype], torch.Tensor] = field(default_factory=dict)

    def mask(self, window: int | None, dtype: torch.dtype) -> torch.Tensor:
        """[batch or 1, 1, local, seq_len], additive in ``dtype``: 0 where a query may see a key.

        Additive and cached: given a boolean mask, SDPA converts it into a new
        additive one on every call, which each layer would keep for backward.
        """
        key = (window, dtype)
        if key not in self.masks:
            q = self.queries[:, None]
            k = torch.arange(self.seq_len, device=q.device)[None, :]
            allowed = k <= q
            if window is not None:
                allowed = allowed & (q - k < window)
            if self.documents is None:
                allowed = allowed[None]
            else:
                docs = self.documents
                allowed = allowed[None] & (docs[:, self.queries][:, :, None] == docs[:, None, :])
            additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            self.masks[key] = additive.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]
        return self.masks[key]


class ContextParallel:
    """The model's attention for a context group; ``data.context_split`` cuts the batches."""

    def __init__(self, model: PreTrainedModel, group: dist.ProcessGroup, degree: int, index: int, seq_len: int) -> None:
        self.group, self.degree, self.index, self.seq_len = group, degree, index, seq_len
        self.positions = chunk_positions(seq_len, degree, index)
        # Slot i of the gathered row holds this global position: gathered[..., order] is the row in order.
        gathered = torch.cat([chunk_positions(seq_len, degree, r) for r in range(degree)])
        self.order = torch.argsort(gathered)
        self.layout: Layout | None = None
        self.calls = 0
        # Eager under torch.compile (a graph break per layer): each micro-batch's layout is a new
        # object, which compiled code would guard on and recompile for.
        AttentionInterface.register(IMPLEMENTATION, torch.compiler.disable(self._attention))
        model.set_attn_implementation(IMPLEMENTATION)
        log.info(
            "context parallel: rows of %d tokens over %d ranks, %d tokens each (positions %d-%d and %d-%d)",
            seq_len,
            degree,
            len(self.positions),
            self.positions[0],
            self.positions[len(self.positions) // 2 - 1],
            self.positions[len(self.positions) // 2],
            self.positions[-1],
        )

    @contextlib.contextmanager
    def active(self, documents: torch.Tensor | None, device: torch.device) -> Iterator[None]:
        """One micro-batch's layout for its forward and backward (activation checkpointing recomputes in it).

        ``documents``: [batch, seqLen], the document index of every token of the
        whole rows (packed rows); None for one token stream.
        """
        self.layout = Layout(self.positions.to(device), self.seq_len, documents)
        try:
            yield
        finally:
            self.layout = None

    def _attention(
        self,
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if kwargs.get("s_aux") is not None or kwargs.get("softcap"):
            raise RuntimeError(f"{type(module).__name__}: attention sinks and soft-capping are not supported")
        self.calls += 1
        window = kwargs.get("sliding_window")
        sdpa = _SdpaOptions(
            dropout_p=dropout if module.training else 0.0,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
        layout = self.layout
        if layout is None:  # no batch of this rank's tokens: the tokens given are the whole sequence
            n = query.shape[2]
            if window is None:
                out = F.scaled_dot_product_attention(query, key, value, is_causal=True, **sdpa)
                return out.transpose(1, 2).contiguous(), None
            layout = Layout(torch.arange(n, device=query.device), n, None)
        else:
            order = self._order_on(key.device)
            key = _GatherRow.apply(key, self.group, self.degree, self.index)[:, :, order]
            value = _GatherRow.apply(value, self.group, self.degree, self.index)[:, :, order]
            if layout.documents is None and window is None and query.is_cuda:
                return self._causal_chunks(query, key, value, sdpa), None
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=layout.mask(window, query.dtype), **sdpa)
        return out.transpose(1, 2).contiguous(), None

    def _order_on(self, device: torch.device) -> torch.Tensor:
        """The gathered row's order, moved to the device once (not a host copy per layer and call)."""
        if self.order.device != device:
            self.order = self.order.to(device)
        return self.order

    def _causal_chunks(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sdpa: _SdpaOptions
    ) -> torch.Tensor:
        """One token stream, no window: each local chunk attends causally to the keys up to its end.

        No mask is built: ``causal_lower_right`` aligns the chunk's queries with
        the last of its keys, which SDPA's flash kernel takes as it is (and its
        memory-efficient kernel without grouped key-value heads). CUDA only:
        elsewhere SDPA materialises that bias for every call and layer, more
        than the one cached mask (measured on CPU: 0.93 against 0.76 GB).
        """
        size = self.seq_len // (2 * self.degree)
        outs = []
        for i, chunk in enumerate((self.index, 2 * self.degree - 1 - self.index)):
            end = (chunk + 1) * size
            q = query[:, :, i * size : (i + 1) * size]
            bias = causal_lower_right(size, end)
            outs.append(F.scaled_dot_product_attention(q, key[:, :, :end], value[:, :, :end], attn_mask=bias, **sdpa))
        return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def build_context_parallel(
    model: PreTrainedModel, world: WorldInfo, plan: ParallelPlan, seq_len: int, precision: str
) -> ContextParallel | None:
    """With parallelism.context: this rank's part of every row, and the attention over whole rows (collective).

    A probe forward (no layout: no collectives in attention) shows whether the
    attention layers go through transformers' interface at all; one that does
    not would silently see only its chunk, so it is refused in one line.
    """
    if plan.cp == 1:
        return None
    group, index = context_group(world, plan)
    context = ContextParallel(model, group, plan.cp, index, seq_len)
    inputs = torch.zeros(1, 8, dtype=torch.long, device=world.device)
    with (
        torch.no_grad(),
        compute_context(model, precision, world.device),
        torch.compiler.set_stance("force_eager"),
    ):
        model(input_ids=inputs, use_cache=False)
    reshard(model)
    if context.calls == 0:
        raise ConfigError(
            [
                f"parallelism.context: {type(model).__name__}'s attention layers do not call transformers' "
                "attention interface, so their rows cannot be split; use parallelism.context: 1"
            ]
        )
    return context
