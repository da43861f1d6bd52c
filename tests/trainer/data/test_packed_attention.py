"""Packed documents never see each other: a packed batch gives each document the logits and
loss it gets alone, for tiny random transformers models (fp32, CPU, in-process)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from fsdp_trainer.data.attention import PackedAttention, additive, block_causal_mask
from fsdp_trainer.data.sft import Document, DocumentPacker, stack_sequences
from fsdp_trainer.loss import token_loss_sum
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

SEQ = 32
VOCAB = 256
DIMS = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def llama(attention: str) -> nn.Module:
    return LlamaForCausalLM(LlamaConfig(**DIMS, attn_implementation=attention))


def gpt2(attention: str) -> nn.Module:
    # Learned absolute positions: only right if the position ids restart per document.
    config = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=0)
    config.eos_token_id = 1
    config._attn_implementation = attention
    return GPT2LMHeadModel(config)


def mistral_window(attention: str) -> nn.Module:
    # A sliding window shorter than the documents: transformers must build each layer's mask.
    return MistralForCausalLM(MistralConfig(**DIMS, sliding_window=5, attn_implementation=attention))


MODELS: dict[str, tuple[Callable[[str], nn.Module], str]] = {
    "llama-sdpa": (llama, "sdpa"),
    "llama-eager": (llama, "eager"),
    "gpt2-sdpa": (gpt2, "sdpa"),
    "gpt2-eager": (gpt2, "eager"),
    "mistral-window-sdpa": (mistral_window, "sdpa"),
    "mistral-window-eager": (mistral_window, "eager"),
}


def _documents(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (9, 12, 7)]


def _packed(docs: list[list[int]]):
    packer = DocumentPacker(seq_len=SEQ, overlong="truncate", pad_id=2)
    for i, tokens in enumerate(docs):
        packer.add(f"d{i}", Document(tokens, [True] * len(tokens)))
    return stack_sequences([packer.take()])


@pytest.mark.parametrize("name", list(MODELS))
def test_packed_documents_get_the_logits_and_loss_they_get_alone(name: str) -> None:
    build, attention = MODELS[name]
    torch.manual_seed(0)
    model = build(attention).eval()
    assert model.config._attn_implementation == attention
    packed_attention = PackedAttention(model, SEQ)
    assert packed_attention.explicit_mask == (not name.startswith("mistral-window"))
    docs = _documents(1)
    batch = _packed(docs)
    assert batch.position_ids[0].tolist()[:9] == [*range(8), 0]
    with torch.no_grad():
        packed = model(input_ids=batch.inputs, **packed_attention.kwargs(batch.position_ids)).logits
        unmasked = model(input_ids=batch.inputs).logits
        start, worst, worst_unmasked = 0, 0.0, 0.0
        for tokens in docs:
            n = len(tokens) - 1
            alone = model(input_ids=torch.tensor([tokens[:-1]])).logits
            here = packed[:, start : start + n]
            worst = max(worst, (here - alone).abs().max().item())
            worst_unmasked = max(worst_unmasked, (unmasked[:, start : start + n] - alone).abs().max().item())
            labels = torch.tensor([tokens[1:]])
            assert token_loss_sum(here, labels).item() == pytest.approx(token_loss_sum(alone, labels).item(), abs=1e-4)
            start += n
    assert worst <= 1e-5, worst
    # The comparison can fail: without the isolation, later documents see earlier ones.
    assert worst_unmasked > 1e-2, worst_unmasked


def test_the_mask_is_block_diagonal_causal() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    mask = block_causal_mask(positions)
    assert mask.shape == (1, 1, 6, 6)
    assert mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    bias = additive(mask)
    assert bias.dtype == torch.float32 and bias[0, 0, 3, 3] == 0
    assert bias[0, 0, 3, 2] == torch.finfo(torch.bfloat16).min
    assert bias.to(torch.bfloat16).isfinite().all()


def test_plain_text_batches_get_no_extra_inputs() -> None:
    model = llama("sdpa")
    assert PackedAttention(model, SEQ).kwargs(None) == {}
