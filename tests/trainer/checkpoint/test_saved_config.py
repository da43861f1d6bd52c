"""A checkpoint's config read by a trainer older than the one that wrote it: export names each field it does not
know, with the likely reason, in one line; the ownership checks still read whose checkpoints these are."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.__main__ import main as cli
from fsdp_trainer.checkpoint.layout import CONFIG_FILE
from fsdp_trainer.checkpoint.ownership import saved_job
from fsdp_trainer.checkpoint.saved_config import NEWER, parse_saved_config, read_saved_config
from fsdp_trainer.errors import ConfigError


def newer_checkpoint(path: Path) -> Path:
    """A step folder whose config has a field no version of this trainer has."""
    cfg = TrainerConfig.model_validate(
        {"job": {"name": "llama", "namespace": "team"}, "model": {"preset": "tiny"}, "training": {"maxSteps": 5}}
    ).to_dict()
    cfg["training"]["fromTheFuture"] = 3
    path.mkdir(parents=True)
    (path / CONFIG_FILE).write_text(yaml.safe_dump(cfg))
    (path / "COMPLETE").write_text("")
    return path


def test_a_newer_field_is_named_with_the_reason(tmp_path: Path) -> None:
    step = newer_checkpoint(tmp_path / "step-00000005")
    with pytest.raises(ConfigError) as err:
        read_saved_config(step)
    [line] = err.value.lines
    assert line.startswith(f"{step / CONFIG_FILE}: training.fromTheFuture: ") and line.endswith(NEWER), line
    # Whose checkpoint it is stays readable: the ownership checks still refuse another training's.
    owner = saved_job(step)
    assert owner is not None and (owner.namespace, owner.name) == ("team", "llama")


def test_a_value_this_version_refuses_is_named_without_the_newer_version_guess() -> None:
    text = yaml.safe_dump({"model": {"preset": "tiny"}, "training": {"maxSteps": 0}})
    with pytest.raises(ConfigError) as err:
        parse_saved_config(text, "ckpt/train.yaml")
    [line] = err.value.lines
    assert line.startswith("ckpt/train.yaml: training.maxSteps: ") and NEWER not in line, line


def test_export_of_a_newer_trainers_checkpoint_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: 'nothing under ... can be loaded: step-00000005: 1 validation error for TrainerConfig'."""
    step = newer_checkpoint(tmp_path / "checkpoints" / "step-00000005")
    assert cli(["export", "--checkpoint", str(step), "--output", str(tmp_path / "hf")]) == 2
    header, *problems = capsys.readouterr().err.strip().splitlines()
    assert header == "fsdp-train: invalid trainer configuration:", header
    [problem] = problems  # one line per problem, and no traceback
    assert "training.fromTheFuture" in problem and problem.endswith(NEWER), problem
    assert not (tmp_path / "hf").exists()
