"""Weights after meta-device construction are really initialised, identically for
any sharding; pretrained weights stream into the shards exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from fsdp_api.spec import ModelSpec
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.model.architecture import build_meta_model, materialize
from fsdp_trainer.model.init import init_weights, reset_buffers
from fsdp_trainer.model.llama import llama_config
from fsdp_trainer.model.param_names import unique_parameters
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tests.trainer.harness import SMALL_MODEL, base_config, run_script

HERE = Path(__file__).parent


def _plain_model(spec: ModelSpec, seed: int = 7, poison: bool = True) -> LlamaForCausalLM:
    model = build_meta_model(llama_config(spec))
    materialize(model, "cpu")
    if poison:
        # to_empty leaves whatever was in memory; make that unmistakable.
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                t.fill_(float("nan"))
    init_weights(model, seed, torch.device("cpu"))
    return model


def test_weights_are_initialised_after_meta_construction() -> None:
    spec = ModelSpec(preset="tiny")  # 4 layers, hidden 256, vocab 4096, tied
    model = _plain_model(spec)
    for name, p in [*model.named_parameters(), *model.named_buffers()]:
        assert torch.isfinite(p).all(), f"{name} has uninitialised values"
    for name, p in unique_parameters(model):
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
            continue
        # Llama's own _init_weights: every matrix N(0, initializer_range).
        want = 0.02
        assert p.std().item() == pytest.approx(want, rel=0.05), name
        assert abs(p.mean().item()) < want / 10, name
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # Different seeds, different weights; the same seed, the same weights.
    again, other = _plain_model(spec), _plain_model(spec, seed=8)
    assert torch.equal(again.model.layers[0].mlp.up_proj.weight, model.model.layers[0].mlp.up_proj.weight)
    assert not torch.equal(other.model.layers[0].mlp.up_proj.weight, model.model.layers[0].mlp.up_proj.weight)


def test_rotary_frequencies_are_recomputed() -> None:
    spec = ModelSpec(preset="tiny")
    dims = spec.dims()
    rotary = _plain_model(spec).model.rotary_emb
    expected = 1.0 / (dims.rope_theta ** (torch.arange(0, dims.head_dim, 2, dtype=torch.float32) / dims.head_dim))
    torch.testing.assert_close(rotary.inv_freq, expected)
    torch.testing.assert_close(rotary.original_inv_freq, expected)

    # Llama 3.2 presets use "llama3" RoPE scaling (factor 32): low frequencies are stretched.
    small = ModelSpec(preset="llama3.2-1b", config={k: v for k, v in SMALL_MODEL.items() if k != "maxSeqLen"})
    config = llama_config(small)
    assert config.rope_parameters["rope_type"] == "llama3" and config.rope_parameters["factor"] == 32.0
    scaled = _plain_model(small).model.rotary_emb.inv_freq
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    torch.testing.assert_close(scaled, want)
    hd = small.dims().head_dim
    plain = 1.0 / (small.dims().rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    assert scaled[-1] < plain[-1] / 8


def _dist_check(tmp_path: Path, config: dict) -> dict:
    cfg_path, out = tmp_path / "train.yaml", tmp_path / "result.pt"
    cfg_path.write_text(yaml.safe_dump(config))
    returncode, output = run_script(HERE / "dist_check.py", [str(cfg_path), str(out)], cwd=tmp_path)
    assert returncode == 0, output[-6000:]
    return torch.load(out)


# An odd vocabulary (259 rows) so the embedding shards are uneven.
ODD_MODEL = {**SMALL_MODEL, "vocabSize": 259}


@pytest.mark.slow
def test_sharded_init_equals_single_process_init(tmp_path: Path, inputs: dict[str, Path]) -> None:
    config = base_config(tmp_path, inputs["aligned"], inputs["tokenizer"], fsdp={"shardingStrategy": "hybrid"})
    config["model"]["config"] = ODD_MODEL
    result = _dist_check(tmp_path, config)
    reference = _plain_model(TrainerConfig.model_validate(config).model, seed=config["training"]["seed"], poison=False)
    want = dict(unique_parameters(reference))
    assert result["params"].keys() == want.keys()
    for name, tensor in result["params"].items():
        assert torch.equal(tensor, want[name].detach()), name
    assert result["tied"]
    torch.testing.assert_close(result["buffers"]["model.rotary_emb.inv_freq"], reference.model.rotary_emb.inv_freq)


@pytest.mark.slow
def test_pretrained_weights_stream_into_the_shards(tmp_path: Path, inputs: dict[str, Path]) -> None:
    config = base_config(tmp_path, inputs["aligned"], inputs["tokenizer"], fsdp={"shardingStrategy": "full"})
    config["model"]["config"] = ODD_MODEL
    spec = TrainerConfig.model_validate(config).model
    torch.manual_seed(123)
    hf = LlamaForCausalLM(LlamaConfig(**{**llama_config(spec).to_dict(), "initializer_range": 0.05})).eval()
    # Small shards: the loader must follow model.safetensors.index.json across files.
    hf.save_pretrained(tmp_path / "hf", max_shard_size="60KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    # The architecture comes from the checkpoint's config.json alone.
    config["model"] = {"pretrained": str(tmp_path / "hf")}

    result = _dist_check(tmp_path, config)
    for name, tensor in hf.state_dict().items():
        if name in result["params"]:
            assert torch.equal(result["params"][name], tensor), name
    assert set(result["params"]) <= set(hf.state_dict())
    with torch.no_grad():
        want = hf(input_ids=result["inputs"]).logits
    torch.testing.assert_close(result["logits"], want, atol=1e-5, rtol=1e-5)


# Each keeps a non-persistent buffer that its __init__ computes: Llama's rotary
# frequencies (on the module that holds them) and Falcon-H1's muP vector, which
# the model's own _init_weights writes into every layer's mixer from the parent.
BUFFERED = {
    "llama": {"intermediate_size": 48, "num_key_value_heads": 2},
    "falcon_h1": {"intermediate_size": 48, "num_key_value_heads": 2, "mamba_d_ssm": 32, "mamba_n_heads": 4},
}


@pytest.mark.parametrize("model_type", sorted(BUFFERED))
def test_reset_buffers_restores_what_init_computes(model_type: str) -> None:
    """The buffers a pretrained load keeps are those transformers computes, not to_empty's garbage."""
    config = AutoConfig.for_model(
        model_type, vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, **BUFFERED[model_type]
    )
    want = dict(AutoModelForCausalLM.from_config(config).named_buffers())
    model = build_meta_model(config)
    materialize(model, "cpu")
    with torch.no_grad():
        for b in model.buffers():
            b.fill_(float("nan"))
    reset_buffers(model)
    got = dict(model.named_buffers())
    assert sorted(got) == sorted(want)
    assert any("mup_vector" in n for n in got) == (model_type == "falcon_h1")
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, msg=f"{model_type}: {name} not recomputed")


def test_a_non_finite_first_loss_blames_the_model_not_the_learning_rate(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    """The first step's loss comes before any update: a NaN there is the weights' (issue 24: falcon_h1's
    garbage buffer stopped with "lower training.learningRate?")."""
    from safetensors.torch import load_file, save_file

    from tests.trainer.harness import launch
    from tests.trainer.model.architectures import build_checkpoint

    model = build_checkpoint("llama", tmp_path / "nan-model", inputs["tokenizer"])
    tensors = load_file(model / "model.safetensors")
    tensors["model.norm.weight"][0] = float("nan")
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    cfg = base_config(tmp_path / "first", inputs["aligned"], inputs["tokenizer"], training={"maxSteps": 3})
    cfg["model"] = {"pretrained": str(model)}
    first = launch(tmp_path / "first", cfg, nproc=None)
    assert first.returncode != 0
    assert "loss is nan at step 1, before this run's first update: the model as loaded or initialised" in first.output
    assert "learningRate" not in first.output
