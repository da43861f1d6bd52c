"""The chunked output head and loss (``training.logits: chunked``) against the plain path.

In one process: the loss and every gradient equal those of the full fp32
logits; on real tiny models, the trainer's choice and its fallback. The
2-rank runs of ``tests/trainer/model/test_architectures.py`` train with it
(the default) against a single process on full logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fsdp_api.loss_chunks import loss_chunk_tokens
from fsdp_trainer.loss import ChunkedHead, FullLogits, LogitTransform, ModelCall, linear_cross_entropy_sum, output_loss
from fsdp_trainer.loss.transform import logit_transform
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from tests.trainer.model.architectures import ARCHITECTURES, build_checkpoint

CPU = torch.device("cpu")
TRANSFORMS = {
    "identity": LogitTransform(),
    "scale": LogitTransform(scale=0.25),
    "softcap": LogitTransform(cap=3.0),
    "scale+softcap": LogitTransform(scale=2.0, cap=5.0),
}


def _inputs(dtype: torch.dtype, vocab: int = 97, with_bias: bool = True):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 11, 16, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(vocab, 16, generator=g) * 0.5).to(dtype).requires_grad_()
    b = (torch.randn(vocab, generator=g) * 0.1).to(dtype).requires_grad_() if with_bias else None
    labels = torch.randint(0, vocab, (3, 11), generator=g)
    labels[0, :4] = -100  # a prompt
    labels[2, -1] = -100
    return h, w, b, labels


def _plain(h, w, b, labels, transform):
    logits = F.linear(h, w, b)
    return F.cross_entropy(transform.apply(logits.float()).flatten(0, 1), labels.flatten(), reduction="sum")


def _grads(loss, *tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("transform", list(TRANSFORMS.values()), ids=list(TRANSFORMS))
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_chunked_loss_and_gradients_equal_the_full_logits_in_fp32(transform: LogitTransform, chunk: int) -> None:
    h, w, b, labels = _inputs(torch.float32)
    want = _plain(h, w, b, labels, transform)
    got = linear_cross_entropy_sum(h, w, labels, bias=b, transform=transform, chunk_tokens=chunk)
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    # A scaled loss, as the trainer divides by the tokens of the step.
    for g_want, g_got in zip(_grads(want / 7, h, w, b), _grads(got / 7, h, w, b), strict=True):
        torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-6)


def test_chunked_loss_in_bf16_is_as_accurate_as_the_bf16_full_logits_path() -> None:
    h, w, _, labels = _inputs(torch.bfloat16, with_bias=False)
    h32, w32 = (t.detach().float().requires_grad_() for t in (h, w))
    exact = _plain(h32, w32, None, labels, TRANSFORMS["identity"])
    plain = _plain(h, w, None, labels, TRANSFORMS["identity"])
    got = linear_cross_entropy_sum(h, w, labels, chunk_tokens=5)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(plain.item(), rel=1e-3)
    for g_exact, g_plain, g_got in zip(_grads(exact, h32, w32), _grads(plain, h, w), _grads(got, h, w), strict=True):
        assert g_got.dtype == torch.bfloat16
        # bf16 rounding on both paths, in different places: compare their distance to the fp32 gradient.
        error = (g_got.float() - g_exact).norm() / g_exact.norm()
        assert error <= 2 * (g_plain.float() - g_exact).norm() / g_exact.norm() + 1e-3


def test_without_grad_only_the_loss_is_computed() -> None:
    h, w, b, labels = _inputs(torch.float32)
    with torch.no_grad():
        got = linear_cross_entropy_sum(h, w, labels, bias=b, chunk_tokens=4)
        assert got.item() == pytest.approx(_plain(h, w, b, labels, TRANSFORMS["identity"]).item(), rel=1e-6)


def test_the_chunk_holds_256_mib_of_fp32_logits() -> None:
    assert loss_chunk_tokens(128_256) == 512  # 523, rounded down to a multiple of 128
    assert loss_chunk_tokens(10**12) == 1


@pytest.mark.parametrize(
    ("model_type", "overrides", "want"),
    [
        ("llama", {}, LogitTransform()),
        ("gemma2", {"final_logit_softcapping": 30.0}, LogitTransform(cap=30.0)),
        ("cohere", {"logit_scale": 0.0625}, LogitTransform(scale=0.0625)),
        ("granite", {"logits_scaling": 8.0}, LogitTransform(scale=0.125)),
        ("hyperclovax", {"logits_scaling": 4.0}, LogitTransform(scale=4.0)),
        ("falcon_h1", {"lm_head_multiplier": 0.5}, LogitTransform(scale=0.5)),
    ],
)
def test_the_transform_after_the_head_is_read_from_the_config(model_type: str, overrides: dict, want) -> None:
    assert logit_transform(AutoConfig.for_model(model_type, **overrides)) == want


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loss-models")
    # gemma2 soft-capped hard enough that a missing cap would show in every test below.
    extra = {"gemma2": {"final_logit_softcapping": 0.5}}
    return {
        name: build_checkpoint(name, root / name, inputs["tokenizer"], **extra.get(name, {}))
        for name in ("llama", "qwen2", "gemma2", "falcon_h1")
    }


def _load(path: Path) -> nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma2", "falcon_h1"])
def test_a_model_trains_on_the_chunked_head_with_the_full_logits_loss_and_gradients(
    name: str, tiny_models: dict[str, Path]
) -> None:
    full, chunked = _load(tiny_models[name]), _load(tiny_models[name])
    loss = output_loss(chunked, "chunked", CPU)
    assert isinstance(loss, ChunkedHead), loss.reason
    vocab = ARCHITECTURES[name].get("vocab_size", 256)
    ids = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    labels = ids.roll(-1, 1)
    labels[:, -1] = -100
    want = FullLogits().loss_sum(ModelCall(full, {"input_ids": ids}), labels)
    got = loss.loss_sum(ModelCall(chunked, {"input_ids": ids}), labels)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    want.backward()
    got.backward()
    for (n, p_full), (_, p_chunked) in zip(full.named_parameters(), chunked.named_parameters(), strict=True):
        torch.testing.assert_close(p_chunked.grad, p_full.grad, rtol=1e-4, atol=1e-6, msg=n)
    # Outside a loss the head is the model's own: logits for export, probes, generation.
    with torch.no_grad():
        torch.testing.assert_close(chunked(input_ids=ids).logits, full(input_ids=ids).logits)


def test_a_model_whose_logits_are_not_its_heads_output_trains_on_full_logits(
    tiny_models: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    model = _load(tiny_models["llama"])
    model.config.logit_scale = 4.0  # read as Cohere's scale, which Llama's forward never applies
    loss = output_loss(model, "chunked", CPU)
    assert isinstance(loss, FullLogits)
    assert "differ from LogitTransform(scale=4.0, cap=None)" in loss.reason
    assert "training on full logits" in caplog.text


def test_a_head_that_is_not_a_plain_linear_trains_on_full_logits(tiny_models: dict[str, Path]) -> None:
    class Projection(nn.Linear):
        pass

    model = _load(tiny_models["llama"])
    old = model.lm_head
    model.lm_head = Projection(old.in_features, old.out_features, bias=False)
    loss = output_loss(model, "chunked", CPU)
    assert isinstance(loss, FullLogits)
    assert loss.reason == "its output head is a Projection, not a plain Linear"


def test_logits_full_is_honoured(tiny_models: dict[str, Path]) -> None:
    assert isinstance(output_loss(_load(tiny_models["llama"]), "full", CPU), FullLogits)
