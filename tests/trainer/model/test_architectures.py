"""Any Hugging Face causal LM: built, sharded, loaded strictly, trained and exported.

Every architecture of ``architectures.ARCHITECTURES`` is checked against
transformers itself: the sharded model loaded from the checkpoint gives the
logits of ``AutoModelForCausalLM.from_pretrained`` on the same files, a 2-rank
``full`` run on the chunked loss trains like a single process on full logits,
and the export loads back into transformers with the trained logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.build import build_model, prepare
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.export import export_checkpoint
from fsdp_trainer.model.architecture import decoder_units
from fsdp_trainer.model.param_names import unique_parameters
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM

from tests.trainer.harness import base_config, cpu_world, launch, run_script
from tests.trainer.model.architectures import ARCHITECTURES, build_checkpoint

HERE = Path(__file__).parent
NAMES = sorted(ARCHITECTURES)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("architectures")
    return {name: build_checkpoint(name, root / name, inputs["tokenizer"]) for name in NAMES}


def _config(work: Path, data: Path, model: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    cfg = base_config(work, data, Path("unused"), **sections)
    cfg["model"] = model
    del cfg["data"]["tokenizer"]  # the model directory's own tokenizer
    return cfg


def _prepare(cfg: dict[str, Any]):
    return prepare(TrainerConfig.model_validate(cfg), cpu_world(1, 1))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path], checkpoints: dict[str, Path]) -> dict:
    """One 2-rank launch building every architecture sharded: pretrained, and randomly initialised."""
    root = tmp_path_factory.mktemp("sharded")
    args = []
    for name in NAMES:
        for kind in ("pretrained", "architecture"):
            cfg = _config(root / f"{name}-{kind}", inputs["aligned"], {kind: str(checkpoints[name])})
            cfg["fsdp"] = {"shardingStrategy": "full"}
            path = root / f"{name}-{kind}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            args.append(f"{name}-{kind}={path}")
    out = root / "result.pt"
    returncode, output = run_script(HERE / "arch_check.py", [str(out), *args], cwd=root, timeout=600)
    assert returncode == 0, output[-8000:]
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_sharded_pretrained_model_gives_transformers_logits(
    name: str, sharded: dict, checkpoints: dict[str, Path]
) -> None:
    result = sharded[f"{name}-pretrained"]
    reference = AutoModelForCausalLM.from_pretrained(checkpoints[name], dtype=torch.float32).eval()
    assert result["class"].endswith(type(reference).__name__)
    with torch.no_grad():
        want = reference(input_ids=result["inputs"]).logits
    assert (result["logits"] - want).abs().max().item() <= 1e-5
    assert want.std().item() > 0.1  # not a degenerate model that any weights would match


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_random_init_is_the_same_sharded_and_in_one_process(
    name: str, sharded: dict, checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    result = sharded[f"{name}-architecture"]
    cfg = _config(tmp_path, inputs["aligned"], {"architecture": str(checkpoints[name])})
    single = dict(unique_parameters(build_model(_prepare(cfg))))
    assert result["params"].keys() == single.keys()
    for param_name, tensor in result["params"].items():
        assert torch.equal(tensor, single[param_name].detach()), param_name
    # The architecture's own init ran: not the checkpoint's weights, and no parameter left at zero.
    pretrained = sharded[f"{name}-pretrained"]["params"]
    assert any(not torch.equal(t, pretrained[n]) for n, t in result["params"].items())


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_two_rank_full_sharding_trains_like_one_process_and_exports(
    name: str, checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = {}
    # The single process on full logits, the sharded run on the chunked loss (the default).
    for nproc, mbs, logits in ((None, 4, "full"), (2, 2, "chunked")):
        work = tmp_path / f"n{nproc}"
        cfg = _config(
            work,
            inputs["aligned"],
            {"pretrained": str(checkpoints[name])},
            training={"maxSteps": 10, "microBatchSize": mbs, "logits": logits},
            fsdp={"shardingStrategy": "full"},
        )
        runs[nproc] = launch(work, cfg, nproc=nproc).check()
        assert runs[nproc].events("start")[0]["logits"] == logits
    single, sharded_losses = runs[None].losses(), runs[2].losses()
    assert sorted(single) == list(range(1, 11))
    # Step 1 trains the pretrained weights as loaded: its loss is transformers' own
    # on the same batch (a garbage buffer, a wrong mask or a lost tie shows here).
    assert single[1] == pytest.approx(_transformers_loss(checkpoints[name], inputs), abs=1e-4)
    for step, loss in single.items():
        assert abs(sharded_losses[step] - loss) <= 1e-4, (step, loss, sharded_losses[step])
    assert min(single[8], single[9], single[10]) < single[1]  # it trained

    exported = export_checkpoint(runs[2].workdir / "checkpoints", tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    assert model.config.model_type == name
    probe = torch.load(runs[2].trace_dir / "probe.pt")
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"]).logits
    torch.testing.assert_close(logits, probe["logits"], atol=1e-5, rtol=1e-5)

    if name == "llama":  # once: fsdp-train generate on the checkpoint answers as on its export
        from fsdp_trainer.generate import main as generate

        answers = []
        for source in (["--checkpoint", str(runs[2].workdir / "checkpoints")], ["--model", str(exported)]):
            capsys.readouterr()
            assert generate([*source, "--prompt", "w3 w4 w5", "--max-new-tokens", "5", "-o", "jsonl"]) == 0
            answers.append(capsys.readouterr().out)
        assert answers[0] == answers[1] and '"completion": "' in answers[0], answers
        # and fsdp-train eval scores the checkpoint as its export.
        from fsdp_trainer.eval_command import main as evaluate

        scores = []
        for source in (["--checkpoint", str(runs[2].workdir / "checkpoints")], ["--model", str(exported)]):
            capsys.readouterr()
            assert evaluate([*source, "--data", str(inputs["aligned"]), "--seq-len", "32", "-o", "json"]) == 0
            scores.append(json.loads(capsys.readouterr().out))
        assert scores[0] == scores[1] and scores[0]["tokens"] > 0, scores


def _transformers_loss(checkpoint: Path, inputs: dict[str, Path]) -> float:
    """Mean next-token loss of transformers' model, in training mode, on the one-process run's first batch."""
    from fsdp_api.spec import DataSpec
    from fsdp_trainer.data.loader import TrainData
    from fsdp_trainer.loss import token_loss_sum
    from transformers import AutoTokenizer

    train = base_config(Path("unused"), inputs["aligned"], Path("unused"))["training"]
    data = TrainData(
        DataSpec(path=str(inputs["aligned"])),
        AutoTokenizer.from_pretrained(checkpoint),
        seq_len=train["seqLen"],
        micro_batch_size=4,
        rank=0,
        world_size=1,
        seed=train["seed"],
    )
    batch = data.next_batch()
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).train()
    with torch.no_grad():
        logits = model(input_ids=batch.inputs).logits
    return (token_loss_sum(logits, batch.labels) / batch.labels.numel()).item()


# -- strict loading and validation: before any process group ---------------------


def _tamper(src: Path, dst: Path, edit) -> Path:
    import shutil

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.update(extra=torch.zeros(3)), "unexpected tensors: extra"),
        (lambda t: t.pop("model.norm.weight"), "missing tensors: model.norm.weight"),
        (
            lambda t: t.update({"model.norm.weight": torch.ones(31)}),
            "wrong shapes: model.norm.weight [31] (the model's is [32])",
        ),
    ],
    ids=["extra", "missing", "shape"],
)
def test_a_checkpoint_that_does_not_match_fails_before_training_naming_the_tensor(
    edit, message: str, checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    bad = _tamper(checkpoints["llama"], tmp_path / "bad", edit)
    with pytest.raises(ConfigError) as e:
        _prepare(_config(tmp_path, inputs["aligned"], {"pretrained": str(bad)}))
    assert message in str(e.value)
    assert "does not match LlamaForCausalLM" in str(e.value)


def test_qwen2_weights_under_a_llama_config_are_refused_not_trained_without_biases(
    checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    import json
    import shutil

    fake = shutil.copytree(checkpoints["qwen2"], tmp_path / "fake")
    config = json.loads((fake / "config.json").read_text())
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (fake / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as e:
        _prepare(_config(tmp_path, inputs["aligned"], {"pretrained": str(fake)}))
    assert "unexpected tensors: model.layers.0.self_attn.k_proj.bias" in str(e.value)


def test_an_encoder_decoder_model_is_refused_by_name(inputs: dict[str, Path], tmp_path: Path) -> None:
    from transformers import AutoConfig

    AutoConfig.for_model("t5", vocab_size=256, d_model=32, num_layers=1).save_pretrained(tmp_path / "t5")
    with pytest.raises(ConfigError) as e:
        _prepare(_config(tmp_path, inputs["aligned"], {"architecture": str(tmp_path / "t5")}))
    assert "T5Config (model_type 't5') is not a decoder-only causal LM" in str(e.value)


@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra"])
def test_an_encoder_is_refused_unless_it_is_configured_as_a_decoder(
    inputs: dict[str, Path], tmp_path: Path, model_type: str
) -> None:
    """transformers maps encoders to causal-LM heads that attend both ways (issue 24, 7): they trained
    as causal LMs with every position seeing its label. A decoder-configured one (is_decoder) is causal."""
    from transformers import AutoConfig

    small = {"vocab_size": 256, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    AutoConfig.for_model(model_type, intermediate_size=64, **small).save_pretrained(tmp_path / model_type)
    with pytest.raises(ConfigError) as e:
        _prepare(_config(tmp_path, inputs["aligned"], {"architecture": str(tmp_path / model_type)}))
    assert f"model.architecture: {model_type!r} is an encoder: its causal-LM head (" in str(e.value)
    assert "attends in both directions (is_decoder is false)" in str(e.value)
    from fsdp_trainer.model.architecture import encoder_as_decoder

    assert encoder_as_decoder(AutoConfig.for_model(model_type, is_decoder=True, **small)) is None
    # Decoder-only models and the decoder halves of encoder-decoders are never taken for encoders.
    for decoder in ("llama", "gpt2", "qwen2", "bart", "marian"):
        assert encoder_as_decoder(AutoConfig.for_model(decoder)) is None, decoder


def test_overrides_the_architecture_lacks_and_too_long_sequences_are_config_errors(
    checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    gpt2 = str(checkpoints["gpt2"])
    cfg = _config(tmp_path, inputs["aligned"], {"architecture": gpt2, "config": {"numKeyValueHeads": 2}})
    with pytest.raises(ConfigError, match=r"model.config.numKeyValueHeads: GPT2Config has no num_key_value_heads"):
        _prepare(cfg)
    # An override the architecture has is applied (GPT-2 spells it n_layer).
    cfg["model"]["config"] = {"numLayers": 3}
    assert len(decoder_units(_prepare(cfg).model)) == 3
    cfg["model"] = {"pretrained": gpt2}
    cfg["training"]["seqLen"] = 65
    with pytest.raises(ConfigError, match=r"training.seqLen: 65 exceeds the model's maximum sequence length 64"):
        _prepare(cfg)
    del cfg["training"]["seqLen"]
    assert _prepare(cfg).seq_len == 64  # unset: min(2048, the model's maximum)


def test_a_model_without_decoder_blocks_is_a_clear_error() -> None:
    class Blockless(nn.Module):
        _no_split_modules = ("Block",)

        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2)])

    with pytest.raises(ConfigError, match="cannot find the decoder layers of Blockless"):
        decoder_units(Blockless())


@pytest.mark.parametrize(
    ("model_type", "config", "block"),
    [
        (
            "biogpt",
            {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 48},
            "BioGptDecoderLayer",
        ),
        (
            "blenderbot",
            {"d_model": 32, "decoder_layers": 3, "decoder_attention_heads": 4, "decoder_ffn_dim": 48},
            "BlenderbotDecoderLayer",
        ),
    ],
)
def test_a_model_that_declares_no_split_modules_is_sharded_by_its_repeated_blocks(
    model_type: str, config: dict[str, Any], block: str
) -> None:
    """transformers 5 declares no _no_split_modules for these: they were refused (the sweep's table)."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, vocab_size=256, max_position_embeddings=64, **config)
    model = AutoModelForCausalLM.from_config(cfg)
    assert not getattr(model, "_no_split_modules", None)
    units = decoder_units(model)
    assert [type(u.module).__name__ for u in units] == [block] * 3
    assert len({id(u.parent) for u in units}) == 1  # one list: the decoder's layers, in order


def test_a_list_of_bare_layers_is_not_taken_for_blocks() -> None:
    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])

    with pytest.raises(ConfigError, match="cannot find the decoder layers of Heads: no _no_split_modules class"):
        decoder_units(Heads())


def test_a_negative_position_count_means_unbounded_not_a_limit_of_minus_one() -> None:
    """XLNet's max_position_embeddings is -1 (relative positions): it was refused with
    'training.seqLen: 32 exceeds the model's maximum sequence length -1' (the architecture sweep)."""
    from fsdp_trainer.model.architecture import max_positions
    from transformers import AutoConfig

    assert AutoConfig.for_model("xlnet").max_position_embeddings == -1
    assert max_positions(AutoConfig.for_model("xlnet")) is None
    assert max_positions(AutoConfig.for_model("llama", max_position_embeddings=64)) == 64


@pytest.mark.parametrize(
    ("model_type", "config", "tied"),
    [
        ("cpmant", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "dim_head": 8}, False),
        (
            "bigbird_pegasus",
            {"d_model": 32, "decoder_layers": 2, "decoder_attention_heads": 4, "max_position_embeddings": 64},
            False,
        ),
        (
            "llama",
            {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "tie_word_embeddings": True},
            True,
        ),
        ("llama", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}, False),
    ],
    ids=["cpmant", "bigbird_pegasus", "llama-tied", "llama-untied"],
)
def test_the_head_is_tied_only_where_transformers_ties_it(model_type: str, config: dict[str, Any], tied: bool) -> None:
    """tie_word_embeddings defaults to true, but CPM-Ant and BigBird-Pegasus declare no tie: materialising
    tied their head to the embedding (CPM-Ant's head silently became its 1,280-row embedding; sharded,
    'FSDP untied the output head from the input embedding', the architecture sweep)."""
    from fsdp_trainer.model.architecture import build_meta_model, embeddings_tied, materialize
    from transformers import AutoConfig

    model = build_meta_model(AutoConfig.for_model(model_type, vocab_size=256, **config))
    assert model.config.tie_word_embeddings is True or not tied
    assert embeddings_tied(model) is tied
    materialize(model, "cpu")
    head, embedding = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert (head is embedding) is tied
    assert tuple(head.shape) == (256, 32)
