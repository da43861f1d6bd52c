"""Fixtures of the parallelism tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.model.architectures import build_checkpoint
from tests.trainer.parallel.split_runs import MODELS, TP_STYLE_MODELS


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> dict[str, Path]:
    """Tiny pretrained directories (with the harness tokenizer) of every split-tested architecture, built once."""
    root = tmp_path_factory.mktemp("split-models")
    return {name: build_checkpoint(name, root / name, inputs["tokenizer"]) for name in (*MODELS, *TP_STYLE_MODELS)}
