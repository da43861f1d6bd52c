"""Keeping packed documents apart in attention, for any transformers causal LM.

A packed sequence (``sft.py``) holds several documents; a token must attend
only to the tokens before it in its own document, and its position must count
from its document's start. The train loop passes two things with the input ids:

- ``position_ids`` restarting at 0 per document: rotary and learned position
  embeddings then see each document as if it were alone (ALiBi models take no
  position ids: their bias depends only on distance, which the mask bounds).
- an explicit 4-D ``attention_mask`` [batch, 1, query, key], block-diagonal
  causal: True where the key is at or before the query in the same document.
  transformers' mask builders (``masking_utils._preprocess_mask_arguments``)
  hand a 4-D mask to the attention kernel untouched, for every layer; SDPA
  takes a boolean mask as "may attend", eager attention adds the mask to its
  scores, so eager gets the additive form (0 or a large negative). This does
  not depend on a model forwarding ``position_ids`` to its mask builder (OPT,
  Falcon, Bloom and MPT do not), nor on transformers guessing packing from them.

Models with a local attention window shorter than the sequence
(``sliding_window``, ``attention_chunk_size``) are the exception: a 4-D mask
would replace the window on those layers with the whole document. For them
only ``position_ids`` is passed, with no mask, and transformers builds each
layer's mask itself, splitting documents where the position ids restart
(``find_packed_sequence_indices``); every model with such windows forwards
its position ids to those builders. transformers looks for packing only when
no key/value cache is in use, so ``use_cache=False`` goes with them (the
trainer's configs already say so; a model's own default may not). Kernels
other than SDPA and eager get the same treatment, since transformers sizes
their masks itself.

``training.packedAttention: flex`` (``auto`` on GPU ranks) makes the model's
attention transformers' ``flex_attention`` and no dense mask exists: without a
local window, the mask is a FlexAttention ``BlockMask`` built here from the
document ids (which transformers also passes through untouched), so a model
need not forward its position ids; with a window, transformers builds each
layer's block masks from the position restarts, as above. FlexAttention skips
the blocks the mask empties instead of computing them. It has no backward
pass on CPU (torch raises), so CPU ranks keep the dense mask, as do models
whose attention does not support it (``_supports_flex_attn``) and context
parallelism (its attention has its own exact mask).

Padding after the last document starts at position 0 too, so it is one more
"document": it attends only to itself and nothing attends to it.

Memory: the mask is batch x seqLen² booleans per micro-batch (64 MiB at 8192),
the size transformers itself builds for a packed batch under SDPA.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from transformers import PreTrainedModel

from ..errors import ConfigError

# Layer-local windows that a full 4-D mask would override.
WINDOW_ATTRIBUTES = ("sliding_window", "attention_chunk_size")
FIELD = "training.packedAttention"
FLEX, MASK = "flex", "mask"
FLEX_IMPLEMENTATION = "flex_attention"  # transformers' name of the FlexAttention kernel


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Per token, the index of its document within the row (a new one starts at position 0)."""
    return (position_ids == 0).cumsum(-1)


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """[batch, 1, seq, seq] bool: query i may attend key j iff j <= i in the same document."""
    docs = document_ids(position_ids)
    same = docs[:, :, None] == docs[:, None, :]
    n = position_ids.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=position_ids.device).tril()
    return (same & causal).unsqueeze(1)


def document_block_mask(position_ids: torch.Tensor) -> BlockMask:
    """block_causal_mask as FlexAttention's block-sparse mask: no seqLen² tensor kept."""
    docs = document_ids(position_ids)

    def same_document_causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (docs[b, q] == docs[b, kv]) & (kv <= q)

    batch, n = position_ids.shape
    # Compiled on CUDA, as transformers does: the eager builder evaluates every query-key pair at once.
    build = _compiled_block_mask() if position_ids.is_cuda else create_block_mask
    return build(same_document_causal, batch, None, n, n, device=position_ids.device)


@functools.cache
def _compiled_block_mask() -> Callable[..., BlockMask]:
    return torch.compile(create_block_mask)


def additive(mask: torch.Tensor) -> torch.Tensor:
    """0 where attended, a large negative elsewhere (bf16's lowest: finite in bf16 and fp32 alike)."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return out.masked_fill_(~mask, torch.finfo(torch.bfloat16).min)


def local_window(config: Any, seq_len: int) -> int | None:
    """The shortest attention window of the architecture shorter than ``seq_len``, if any."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    windows = [getattr(text, a, None) for a in WINDOW_ATTRIBUTES]
    short = [w for w in windows if isinstance(w, int) and 0 < w < seq_len]
    return min(short) if short else None


def choose_kernel(choice: str, model: nn.Module, device: torch.device, context_parallel: bool) -> tuple[str, str]:
    """``training.packedAttention`` resolved: (flex or mask, why), or a ConfigError for a ``flex`` that cannot run.

    The spec's rules refuse flex with context parallelism and on CPU-only jobs
    before a pod starts; this is the same answer for a local run.
    """
    if context_parallel:
        if choice == FLEX:
            raise ConfigError([f"{FIELD}: flex with parallelism.context > 1 is not supported; use auto or mask"])
        return MASK, "parallelism.context > 1: the context-parallel attention's own mask"
    if choice == MASK:
        return MASK, "training.packedAttention mask"
    blocker = None
    if device.type != "cuda":
        blocker = f"{device.type} ranks: FlexAttention has no backward pass on CPU"
    elif not getattr(model, "_supports_flex_attn", False):
        blocker = f"{type(model).__name__}'s attention does not support FlexAttention in transformers"
    if blocker is None:
        return FLEX, "training.packedAttention " + choice
    if choice == FLEX:
        raise ConfigError([f"{FIELD}: flex cannot run here: {blocker}; use auto or mask"])
    return MASK, f"auto: {blocker}"


class PackedAttention:
    """The keyword arguments that make one model call keep a batch's documents apart.

    ``kernel`` flex switches the model's attention to FlexAttention first (see the module's docstring).
    """

    def __init__(self, model: nn.Module, seq_len: int, kernel: str = MASK) -> None:
        if kernel == FLEX:
            cast(PreTrainedModel, model).set_attn_implementation(FLEX_IMPLEMENTATION)  # a PEFT model forwards it
        config = model.config
        self.implementation = getattr(config, "_attn_implementation", None) or "eager"
        self.window = local_window(config, seq_len)
        self.explicit_mask = self.implementation in ("sdpa", "eager", FLEX_IMPLEMENTATION) and self.window is None
        parameters = inspect.signature(model.forward).parameters
        self.takes_positions = "position_ids" in parameters
        self.takes_use_cache = "use_cache" in parameters
        if not self.explicit_mask and not self.takes_positions:
            raise ValueError(
                f"{type(model).__name__} takes no position_ids and its attention ({self.implementation}, "
                f"window {self.window}) cannot be given an explicit mask: packed rows cannot be kept apart"
            )

    def describe(self) -> str:
        if self.implementation == FLEX_IMPLEMENTATION:
            if self.explicit_mask:
                return "FlexAttention with a document block mask"
            return (
                f"FlexAttention with the block masks transformers builds from the position ids (window {self.window})"
            )
        if self.explicit_mask:
            return f"explicit block-diagonal causal mask ({self.implementation})" + (
                ", per-document position ids" if self.takes_positions else ""
            )
        return f"per-document position ids; transformers builds the masks (window {self.window})"

    def kwargs(self, position_ids: torch.Tensor | None) -> dict[str, Any]:
        """Nothing for a plain token stream (data.format text): the model's own causal mask applies."""
        if position_ids is None:
            return {}
        out: dict[str, Any] = {"use_cache": False} if self.takes_use_cache else {}
        if self.takes_positions:
            out["position_ids"] = position_ids
        if self.explicit_mask and self.implementation == FLEX_IMPLEMENTATION:
            out["attention_mask"] = document_block_mask(position_ids)
        elif self.explicit_mask:
            mask = block_causal_mask(position_ids)
            out["attention_mask"] = mask if self.implementation == "sdpa" else additive(mask)
        return out
