"""Fixtures of the parallelism tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.model.architectures import build_checkpoint
from tests.trainer.parallel.split_runs import MODELS


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> dict[str, Path]:
    """Tiny pretrained Llama, Mistral and Qwen2 directories (with the harness tokenizer), built once."""
    root = tmp_path_factory.mktemp("split-models")
    return {name: build_checkpoint(name, root / name, inputs["tokenizer"]) for name in MODELS}
