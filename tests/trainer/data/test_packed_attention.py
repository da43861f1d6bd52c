"""Packed documents never see each other: a packed batch gives each document the logits and
loss it gets alone, for tiny random transformers models (fp32, CPU, in-process)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import transformers.integrations.flex_attention
from fsdp_trainer.data.attention import (
    FLEX,
    FLEX_IMPLEMENTATION,
    MASK,
    PackedAttention,
    additive,
    block_causal_mask,
    choose_kernel,
)
from fsdp_trainer.data.sft import Document, DocumentPacker, stack_sequences
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.loss import token_loss_sum
from torch import nn
from torch.nn.attention.flex_attention import flex_attention
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
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


def qwen3_hybrid(attention: str) -> nn.Module:
    # Sliding and full layers mixed, q/k norms: each layer type gets its own block mask from transformers.
    config = Qwen3Config(
        **DIMS,
        head_dim=16,
        use_sliding_window=True,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"],
    )
    config._attn_implementation = attention
    return Qwen3ForCausalLM(config)


FLEX_MODELS = {"llama": llama, "mistral-window": mistral_window, "qwen3-hybrid": qwen3_hybrid}


@pytest.mark.slow  # the first FlexAttention call sets up its reference kernel: about 7 s of CPU
@pytest.mark.parametrize("name", list(FLEX_MODELS))
def test_flex_attention_gives_packed_rows_the_dense_masks_logits(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The masks FlexAttention gets (ours without a window, transformers' with one) against the dense path.

    FlexAttention runs forward on CPU, not backward; the kernel runs eager here (torch's reference
    implementation): inductor's CPU build of it is not what a GPU runs and fails to compile some windows.
    """
    eager = lambda q, k, v, training=False, **kw: flex_attention(q, k, v, **kw)  # noqa: E731
    monkeypatch.setattr(transformers.integrations.flex_attention, "compile_friendly_flex_attention", eager)
    torch.manual_seed(0)
    dense = FLEX_MODELS[name]("sdpa").eval()
    flex = copy.deepcopy(dense)
    with_mask, with_flex = PackedAttention(dense, SEQ, MASK), PackedAttention(flex, SEQ, FLEX)
    assert flex.config._attn_implementation == FLEX_IMPLEMENTATION
    assert ("window" in with_flex.describe()) == (name != "llama"), with_flex.describe()
    batch = _packed(_documents(2))
    with torch.no_grad():
        expected = dense(input_ids=batch.inputs, **with_mask.kwargs(batch.position_ids)).logits
        got = flex(input_ids=batch.inputs, **with_flex.kwargs(batch.position_ids)).logits
        plain = flex(input_ids=batch.inputs).logits  # its causal mask alone: documents see each other
    assert (got - expected).abs().max().item() <= 1e-5
    assert (plain - expected).abs().max().item() > 1e-2


class _NoFlex(nn.Module):
    _supports_flex_attn = False


class _Flex(nn.Module):
    _supports_flex_attn = True


CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("choice", "model", "device", "context", "expected"),
    [
        ("auto", _Flex(), CUDA, False, (FLEX, "training.packedAttention auto")),
        ("flex", _Flex(), CUDA, False, (FLEX, "training.packedAttention flex")),
        ("mask", _Flex(), CUDA, False, (MASK, "training.packedAttention mask")),
        ("auto", _Flex(), CPU, False, (MASK, "auto: cpu ranks: FlexAttention has no backward pass on CPU")),
        (
            "auto",
            _NoFlex(),
            CUDA,
            False,
            (MASK, "auto: _NoFlex's attention does not support FlexAttention in transformers"),
        ),
        ("auto", _Flex(), CUDA, True, (MASK, "parallelism.context > 1: the context-parallel attention's own mask")),
        ("mask", _NoFlex(), CPU, False, (MASK, "training.packedAttention mask")),
    ],
)
def test_the_kernel_is_chosen_with_its_reason(
    choice: str, model: nn.Module, device: torch.device, context: bool, expected: tuple[str, str]
) -> None:
    assert choose_kernel(choice, model, device, context) == expected


@pytest.mark.parametrize(
    ("model", "device", "context", "line"),  # line: why flex cannot run (None: context parallelism)
    [
        (_Flex(), CPU, False, "cpu ranks: FlexAttention has no backward pass on CPU"),
        (_NoFlex(), CUDA, False, "_NoFlex's attention does not support FlexAttention in transformers"),
        (_Flex(), CUDA, True, None),
    ],
)
def test_flex_where_it_cannot_run_is_one_config_line(
    model: nn.Module, device: torch.device, context: bool, line: str | None
) -> None:
    with pytest.raises(ConfigError) as refused:
        choose_kernel(FLEX, model, device, context)
    whole = (
        f"training.packedAttention: flex cannot run here: {line}; use auto or mask"
        if line
        else "training.packedAttention: flex with parallelism.context > 1 is not supported; use auto or mask"
    )
    assert refused.value.lines == [whole]
