"""How many tokens the chunked loss (``training.logits: chunked``) takes at once.

Shared by the trainer (``fsdp_trainer.loss``) and the memory plan, so the
plan's logits term is the buffer the trainer really allocates.
"""

from __future__ import annotations

# fp32 logits of one chunk: 256 MiB is 523 tokens at Llama 3's vocabulary of
# 128,256, large enough that the head's matmuls keep a GPU busy, small enough
# that the chunk's few buffers are a rounding error next to the activations.
LOSS_CHUNK_BYTES = 256 * 2**20
FP32_BYTES = 4


def loss_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk for this vocabulary (at least one)."""
    return max(1, LOSS_CHUNK_BYTES // (max(1, vocab_size) * FP32_BYTES))
