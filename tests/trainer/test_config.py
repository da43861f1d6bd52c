"""Configuration errors name the field and stop the trainer before any process group exists;
the package and its config import without torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
import yaml
from fsdp_api.launch import trainer_program
from fsdp_trainer.build import prepare
from fsdp_trainer.config import load_config, parse_overrides
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.parallel.distributed import WorldInfo

from tests.trainer.harness import SMALL_MODEL, base_config, cpu_world, offline_env


def _errors(tmp_path: Path, config: dict, world: WorldInfo | None = None, overrides: list[str] | None = None) -> str:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        prepare(load_config(path, overrides), world or cpu_world())
    assert not dist.is_initialized(), "the process group must not exist when a config error is raised"
    return "\n".join(info.value.lines)


@pytest.fixture
def config(tmp_path: Path, inputs: dict[str, Path]) -> dict:
    return base_config(tmp_path, inputs["aligned"], inputs["tokenizer"])


def test_valid_config_prepares(tmp_path: Path, config: dict) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    prepared = prepare(load_config(path), cpu_world())
    assert len(prepared.tokenizer) == 204 and not dist.is_initialized()


def test_seq_len_longer_than_the_model(tmp_path: Path, config: dict) -> None:
    text = _errors(tmp_path, config, overrides=["--training.seq-len", "512"])
    assert text == "training.seqLen: training.seqLen must not exceed the model's maxSeqLen"


def test_hybrid_mesh_that_does_not_divide_the_world(tmp_path: Path, config: dict) -> None:
    config["fsdp"] = {"shardingStrategy": "hybrid"}
    text = _errors(tmp_path, config, world=cpu_world(world_size=4, local_world_size=3))
    assert text.startswith("fsdp.shardGroupSize (unset: processes per node): the world size 4 is not a multiple")
    config["fsdp"]["shardGroupSize"] = 8
    text = _errors(tmp_path, config, world=cpu_world(world_size=4))
    assert text == "fsdp.shardGroupSize: shard group of 8 ranks is larger than the world size 4"


def test_missing_files_are_named(tmp_path: Path, config: dict) -> None:
    config["data"] = {"path": str(tmp_path / "nope" / "*.jsonl"), "tokenizer": str(tmp_path / "no-tokenizer")}
    config["model"] = {"pretrained": str(tmp_path)}  # exists, but is no model directory
    lines = _errors(tmp_path, config).splitlines()
    assert lines == [
        f"data.path: no .json, .jsonl, .parquet, .txt files in {tmp_path / 'nope' / '*.jsonl'}",
        f"data.tokenizer: {tmp_path / 'no-tokenizer'} is not a directory with tokenizer files",
        f"model.pretrained: {tmp_path} has no config.json (expected a Hugging Face model directory)",
    ]


def test_pretrained_without_a_model_type_or_readable_weights(tmp_path: Path, config: dict) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"hidden_size": 128, "num_hidden_layers": 2, "vocab_size": 256}))
    (hf / "model.safetensors").write_bytes(b"")
    config["model"] = {"pretrained": str(hf)}
    config["data"]["tokenizer"] = str(config["data"]["tokenizer"])
    assert _errors(tmp_path, config).startswith(f"model.pretrained: cannot read the model config in {hf}")
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "vocab_size": 256}))
    assert _errors(tmp_path, config).startswith(f"model.pretrained: cannot read the safetensors weights in {hf}")


def test_tokenizer_larger_than_the_vocabulary(tmp_path: Path, config: dict) -> None:
    del config["data"]["tokenizer"]  # the embedded tokenizer: 4096 tokens
    config["model"]["config"] = {**SMALL_MODEL, "vocabSize": 1000}
    text = _errors(tmp_path, config)
    assert text.startswith("model.config.vocabSize: the tokenizer")
    assert "has 4096 tokens but the model's vocabulary is 1000; raise vocabSize to at least 4096" in text


def test_a_tokenizer_too_large_for_a_pretrained_model_names_the_setting_that_chose_it(
    tmp_path: Path, config: dict, inputs: dict[str, Path]
) -> None:
    """Issue 24: the message blamed data.tokenizer although only model.pretrained was set."""
    from tests.trainer.model.architectures import build_checkpoint

    model = build_checkpoint("llama", tmp_path / "small-vocab", inputs["tokenizer"], vocab_size=100)
    config["model"] = {"pretrained": str(model)}
    del config["data"]["tokenizer"]  # the directory's own tokenizer: 204 tokens
    assert _errors(tmp_path, config) == (
        f"model.pretrained: the tokenizer ({model}, from model.pretrained) has 204 tokens but the model's "
        "vocabulary is 100: the directory's tokenizer and config.json do not belong together; fix the "
        "directory, or set data.tokenizer to one with at most 100 tokens"
    )
    config["data"]["tokenizer"] = str(inputs["tokenizer"])
    assert _errors(tmp_path, config) == (
        f"data.tokenizer: the tokenizer ({inputs['tokenizer']}, from data.tokenizer) has 204 tokens but the "
        "model's vocabulary is 100; use the model's own tokenizer (unset data.tokenizer)"
    )


def test_cpu_offload_without_gpus(tmp_path: Path, config: dict) -> None:
    config["fsdp"] = {"cpuOffload": True}
    text = _errors(tmp_path, config)
    assert text == "fsdp.cpuOffload: needs GPUs; without them the parameters already live in CPU memory"


def test_unknown_override_and_bad_value(tmp_path: Path, config: dict) -> None:
    text = _errors(tmp_path, config, overrides=["--training.max-stepz", "5", "--fsdp.sharding-strategy=zero3"])
    # Worded as the API server words them, with the nearest known name.
    assert 'training.maxStepz: unknown field "training.maxStepz"; did you mean "maxSteps"?' in text
    supported = '"full", "shard_grad_op", "no_shard", "hybrid"'
    assert f'fsdp.shardingStrategy: Unsupported value: "zero3": supported values: {supported}' in text


def test_override_parsing() -> None:
    assert parse_overrides(
        ["--training.max-steps", "20", "--fsdp.cpu-offload=true", "--model.config.num-layers", "2"]
    ) == {
        "training": {"maxSteps": 20},
        "fsdp": {"cpuOffload": True},
        "model": {"config": {"numLayers": 2}},
    }
    with pytest.raises(ConfigError, match=r"--training\.max-steps: missing value"):
        parse_overrides(["--training.max-steps"])


@pytest.mark.slow
def test_cli_reports_errors_on_every_rank_without_a_rendezvous(tmp_path: Path, config: dict) -> None:
    """torchrun's environment but no rendezvous to join: only a pre-flight error can end this quickly."""
    config["fsdp"] = {"shardingStrategy": "hybrid"}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    env = offline_env(
        {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "192.0.2.1"}
    )
    env["MASTER_PORT"] = "1"
    proc = subprocess.run(
        [sys.executable, *trainer_program(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "fsdp.shardGroupSize (unset: processes per node): the world size 4 is not a multiple" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_package_and_config_import_without_torch() -> None:
    """The operator image installs fsdp_trainer without torch."""
    code = (
        "import sys, fsdp_trainer, fsdp_trainer.config, fsdp_trainer.errors; "
        "assert 'torch' not in sys.modules, 'torch imported'; print(fsdp_trainer.__version__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.1.0"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", r"data\.path: .*empty\.jsonl: every file is empty"),
        (
            '{"text": ""}\n{"text": "   "}\n',
            r"data\.path: .*empty\.jsonl: none of the 2 rows has any text in field 'text'",
        ),
        (
            '{"body": "words"}\n',
            r"data\.path: .*empty\.jsonl: no row has a field 'text' \(fields: body\); set data\.textField",
        ),
    ],
    ids=["empty-file", "blank-rows", "no-such-field"],
)
def test_data_without_text_stops_before_the_model(tmp_path: Path, config: dict, content: str, expected: str) -> None:
    data = tmp_path / "empty.jsonl"
    data.write_text(content)
    config["data"] = {"path": str(data), "tokenizer": config["data"]["tokenizer"]}
    assert re.search(expected, _errors(tmp_path, config)), _errors(tmp_path, config)


def test_the_text_probe_reads_only_to_the_first_row_with_text(tmp_path: Path) -> None:
    from fsdp_trainer.data import files

    data = tmp_path / "big.jsonl"
    data.write_text('{"text": "first"}\n' + "not json\n")
    assert files.check_has_text(files.resolve(str(data)), "text") is None


def test_help_names_the_other_commands(capsys: pytest.CaptureFixture[str]) -> None:
    from fsdp_trainer.__main__ import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "fsdp-train export --checkpoint DIR --output DIR" in out
    assert "fsdp-train check --config FILE --nnodes N --nproc-per-node P" in out
    assert "fsdp-train generate --model DIR|--checkpoint DIR --prompt TEXT" in out
    assert "fsdp-train eval --model DIR|--checkpoint DIR --data FILE" in out
