"""How many tokens the chunked loss (``training.logits: chunked``) takes at once.

Shared by the trainer (``fsdp_trainer.loss``) and the memory plan, so the
plan's logits term is the buffer the trainer really allocates.
"""

from __future__ import annotations

# fp32 logits of one chunk: 256 MiB is 512 tokens at Llama 3's vocabulary of
# 128,256 (523, rounded down to CHUNK_MULTIPLE), large enough that the head's matmuls keep a GPU busy, small enough
# that the chunk's few buffers are a rounding error next to the activations.
LOSS_CHUNK_BYTES = 256 * 2**20
FP32_BYTES = 4


# A chunk is a whole number of these: the head's weight gradient is a matmul over the chunk's
# tokens, and a bf16 GEMM whose inner dimension is odd (523) is off cuBLAS's aligned kernels.
CHUNK_MULTIPLE = 128


def loss_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk for this vocabulary (at least one; a multiple of CHUNK_MULTIPLE where that fits)."""
    tokens = max(1, LOSS_CHUNK_BYTES // (max(1, vocab_size) * FP32_BYTES))
    return tokens - tokens % CHUNK_MULTIPLE if tokens >= CHUNK_MULTIPLE else tokens
