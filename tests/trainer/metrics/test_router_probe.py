"""Router health and the trained load-balancing loss: the routers are found where transformers records their
logits, the tokens each expert gets are counted, and the loss (and its gradient) is the one transformers computes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fsdp_trainer.loss.router_aux import RouterAuxLoss, router_aux_errors
from fsdp_trainer.metrics.router_probe import RouterProbe
from transformers import AutoConfig, AutoModelForCausalLM

_COMMON = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "initializer_range": 0.5,  # logits far from even: the experts' loads differ
}
# Four MoE families, one with shared experts and a dense first layer (DeepSeek V3), one whose router
# has a bias and picks before its softmax (gpt-oss).
MOE: dict[str, dict[str, Any]] = {
    "mixtral": {"intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {"moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2, "head_dim": 8},
    "olmoe": {"intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2},
    "deepseek_v3": {
        "intermediate_size": 32,
        "moe_intermediate_size": 16,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 2,
        "topk_group": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 8,
        "num_key_value_heads": 4,  # its latent attention has as many as heads
    },
    "gpt_oss": {"intermediate_size": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 8},
}


def tiny(model_type: str, layers: int) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **{**_COMMON, **MOE[model_type]}, num_hidden_layers=layers)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def tokens(batch: int = 2, seq: int = 16) -> torch.Tensor:
    return torch.randint(0, 64, (batch, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("model_type", sorted(MOE))
def test_every_moe_layer_is_hooked_and_counts_each_tokens_top_k_choices(model_type: str) -> None:
    model = tiny(model_type, layers=3)
    probe = RouterProbe(model, torch.device("cpu"))
    # DeepSeek V3's first layer is dense (first_k_dense_replace): no router to watch there.
    want = ["1", "2"] if model_type == "deepseek_v3" else ["0", "1", "2"]
    assert [lay.layer for lay in probe.layers] == want
    experts, top_k = probe.layers[0].experts, probe.layers[0].top_k
    assert top_k == 2 and experts == MOE[model_type].get("num_local_experts", 8)
    with torch.no_grad():
        model(tokens())
    sums = probe.take().tolist()
    width = len(sums) // 2
    for i in range(len(want)):
        counts, probs = sums[i * experts : (i + 1) * experts], sums[width + i * experts : width + (i + 1) * experts]
        assert sum(counts) == 2 * 16 * top_k  # every token, its top_k experts
        assert sum(probs) == pytest.approx(2 * 16, rel=1e-5)  # a softmax per token
    assert not probe.take().any(), "take starts the next step at zero"
    stats = probe.stats(sums)
    assert stats is not None
    for load in stats.layers:
        assert load.min_ratio <= 1.0 <= load.max_ratio <= experts / top_k
        assert 0.0 <= load.unused_ratio < 1.0
    probe.remove()
    with torch.no_grad():
        model(tokens())
    assert not probe.take().any(), "removed hooks count nothing"


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe", "olmoe", "gpt_oss"])
def test_the_aux_loss_is_the_one_transformers_adds_with_output_router_logits(model_type: str) -> None:
    """One MoE layer: transformers' aux_loss (over every layer's logits at once) is that layer's."""
    model = tiny(model_type, layers=1)
    probe = RouterProbe(model, torch.device("cpu"))
    with torch.no_grad():
        out = model(tokens(), output_router_logits=True)
    stats = probe.stats(probe.take().tolist())
    assert stats is not None and out.aux_loss is not None
    assert stats.layers[0].aux_loss == pytest.approx(float(out.aux_loss), rel=1e-5)


def test_a_collapsed_router_reads_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every token routed to experts 0 and 1 of 4: twice the even load on them, none on the others."""
    probe = RouterProbe(tiny("mixtral", layers=1), torch.device("cpu"))
    tokens_, experts, top_k = 40, 4, 2
    counts = [tokens_, tokens_, 0, 0]
    probs = [tokens_ * 0.5, tokens_ * 0.5, 0.0, 0.0]
    stats = probe.stats([*counts, *probs])
    assert stats is not None
    [load] = stats.layers
    assert (load.max_ratio, load.min_ratio, load.unused_ratio) == (experts / top_k, 0.0, 0.5)
    # Switch Transformer's loss: 4 x (1 x 0.5 + 1 x 0.5) = 4, against top_k = 2 for an even router.
    assert load.aux_loss == pytest.approx(4.0)
    even = probe.stats([20.0] * experts + [10.0] * experts)
    assert even is not None
    assert (even.layers[0].max_ratio, even.layers[0].unused_ratio, even.layers[0].aux_loss) == (1.0, 0.0, 2.0)


def test_a_dense_model_has_no_router_and_no_slot() -> None:
    config = AutoConfig.for_model("llama", **_COMMON, intermediate_size=16, num_hidden_layers=1)
    probe = RouterProbe(AutoModelForCausalLM.from_config(config), torch.device("cpu"))
    assert not probe.enabled and probe.width == 0 and probe.stats([]) is None


# --- training.routerAuxLossCoef: the same loss, trained ----------------------------------------------


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe", "olmoe"])
def test_the_trained_aux_loss_and_its_gradient_are_transformers_own(model_type: str) -> None:
    """Over two MoE layers at once, as transformers' load_balancing_loss_func concatenates them."""
    coef = 0.25
    ours, theirs = tiny(model_type, layers=2).train(), tiny(model_type, layers=2).train()
    aux = RouterAuxLoss(ours, coef, torch.device("cpu"))
    aux.begin()
    ours(tokens())
    value = aux.end()
    assert value is not None
    value.backward()
    reference = theirs(tokens(), output_router_logits=True).aux_loss
    (coef * reference).backward()
    assert value.item() == pytest.approx(coef * reference.item(), rel=1e-5)
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        if b.grad is not None:
            assert a.grad is not None and torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-7), name


def test_an_activation_checkpointing_recompute_neither_fails_nor_counts_twice() -> None:
    plain, recomputed = tiny("mixtral", layers=2).train(), tiny("mixtral", layers=2).train()
    recomputed.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    values = []
    for model in (plain, recomputed):
        aux = RouterAuxLoss(model, 1.0, torch.device("cpu"))
        aux.begin()
        out = model(tokens(), labels=tokens())
        value = aux.end()
        assert value is not None
        (out.loss + value).backward()  # the recompute runs the routers' hooks again, uncaptured
        values.append(value.item())
    assert values[0] == pytest.approx(values[1], rel=1e-6)
    # Validation and generation run without gradients: nothing is captured.
    aux = RouterAuxLoss(plain, 1.0, torch.device("cpu"))
    aux.begin()
    with torch.no_grad():
        plain(tokens())
    assert aux.end() is None


def test_a_dense_model_refuses_the_coefficient_in_one_line() -> None:
    config = AutoConfig.for_model("llama", **_COMMON, intermediate_size=16, num_hidden_layers=1)
    llama = AutoModelForCausalLM.from_config(config)
    assert router_aux_errors(llama, 0.0) == []
    assert router_aux_errors(llama, 0.001) == [
        "training.routerAuxLossCoef: LlamaForCausalLM has no mixture-of-experts routers, so there is no load to "
        "balance: leave it at 0"
    ]
