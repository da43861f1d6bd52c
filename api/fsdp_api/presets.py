"""Model presets: the architecture numbers behind ``spec.model.preset``.

Torch-free on purpose: the operator uses them for validation (CEL rules embed
the table) and for status columns, the trainer uses them to build a
``LlamaConfig``. The Llama numbers are those of the published model cards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

PresetName = Literal["tiny", "llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b"]


@dataclass(frozen=True)
class ModelDims:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float = 500000.0
    tie_word_embeddings: bool = False
    # Llama 3.1/3.2 extend context with "llama3" RoPE scaling; tiny has none.
    rope_scaling: bool = True
    # A mixture of experts in every layer's MLP (Mixtral, Qwen3-MoE, OLMoE): num_experts SwiGLU
    # experts of intermediate_size each, experts_per_token of them per token, and a router. 0: dense.
    num_experts: int = 0
    experts_per_token: int = 0
    # A config.json's own head_dim where heads x head_dim is not the width (Qwen3, Gemma 3); 0: width / heads.
    explicit_head_dim: int = 0

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @property
    def attention_width(self) -> int:
        """The query heads' width (q_proj's output, o_proj's input): heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def mlp_params(self) -> int:
        """One layer's MLP: three projections, or every expert's three and the router."""
        h, i = self.hidden_size, self.intermediate_size
        return self.num_experts * 3 * h * i + h * self.num_experts if self.is_moe else 3 * h * i

    def active_mlp_params(self) -> int:
        """The MLP parameters one token runs through: its experts' and the router."""
        h, i = self.hidden_size, self.intermediate_size
        return self.experts_per_token * 3 * h * i + h * self.num_experts if self.is_moe else 3 * h * i

    def num_params(self) -> int:
        """Parameter count of the Llama architecture with these dims (MoE: every expert's)."""
        h, v = self.hidden_size, self.vocab_size
        kv = self.num_key_value_heads * self.head_dim
        attn = h * self.attention_width * 2 + h * kv * 2  # q, o, k, v projections
        mlp = self.mlp_params()
        norms = 2 * h
        per_layer = attn + mlp + norms
        embed = v * h
        head = 0 if self.tie_word_embeddings else v * h
        return self.num_layers * per_layer + embed + head + h

    def num_active_params(self) -> int:
        """The parameters one token runs through (MoE: its experts only; dense: all)."""
        return self.num_params() - self.num_layers * (self.mlp_params() - self.active_mlp_params())

    def with_overrides(self, **overrides: int | None) -> ModelDims:
        # Any, since a type checker matches **changes against every field, the bool ones too.
        changes: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
        return replace(self, **changes)


# tiny is sized for the embedded default: a few hundred steps on 2 CPU cores
# in minutes, with the vocabulary of the tokenizer the trainer builds offline.
PRESETS: dict[str, ModelDims] = {
    "tiny": ModelDims(
        hidden_size=256,
        num_layers=4,
        num_heads=8,
        num_key_value_heads=4,
        intermediate_size=688,
        vocab_size=4096,
        max_seq_len=1024,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        rope_scaling=False,
    ),
    "llama3.2-1b": ModelDims(
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        max_seq_len=131072,
        tie_word_embeddings=True,
    ),
    "llama3.2-3b": ModelDims(
        hidden_size=3072,
        num_layers=28,
        num_heads=24,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        max_seq_len=131072,
        tie_word_embeddings=True,
    ),
    "llama3.1-8b": ModelDims(
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        max_seq_len=131072,
    ),
    "llama3.1-70b": ModelDims(
        hidden_size=8192,
        num_layers=80,
        num_heads=64,
        num_key_value_heads=8,
        intermediate_size=28672,
        vocab_size=128256,
        max_seq_len=131072,
    ),
}

# Hub checkpoints whose config.json has exactly a preset's numbers: what is
# known about a `model.pretrained` hub id without downloading it (the memory plan).
HUB_MODEL_PRESETS: dict[str, str] = {
    f"meta-llama/{name}{suffix}": preset
    for name, preset in (
        ("Llama-3.2-1B", "llama3.2-1b"),
        ("Llama-3.2-3B", "llama3.2-3b"),
        ("Llama-3.1-8B", "llama3.1-8b"),
        ("Llama-3.1-70B", "llama3.1-70b"),
    )
    for suffix in ("", "-Instruct")
}

# Hub checkpoints of other architectures whose numbers the memory plan knows without a download:
# each from its published config.json (the experts' width is moe_intermediate_size; Qwen3's
# head_dim 128 makes 32 heads twice the width 2048).
HUB_MODEL_DIMS: dict[str, ModelDims] = {
    "Qwen/Qwen3-30B-A3B": ModelDims(
        hidden_size=2048,
        num_layers=48,
        num_heads=32,
        num_key_value_heads=4,
        intermediate_size=768,
        vocab_size=151936,
        max_seq_len=40960,
        rope_theta=1000000.0,
        rope_scaling=False,
        num_experts=128,
        experts_per_token=8,
        explicit_head_dim=128,
    ),
}
