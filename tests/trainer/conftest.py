"""Fixtures of the trainer tests: no hub access, offline tokenizer and datasets, shared runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.harness import ParityRuns, build_word_tokenizer, write_aligned_jsonl, write_ragged_jsonl


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach the Hugging Face hub, in-process or in the trainer it launches.

    The libraries read HF_HUB_OFFLINE once, at import, and another test module
    may have imported them first: set the variable for subprocesses and the
    already-read flags for this process.
    """
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)


@pytest.fixture(scope="session")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trainer-inputs")
    return {
        "tokenizer": build_word_tokenizer(root / "tokenizer"),
        # 500 one-window documents, 10 of them held out for validation: 20
        # steps of 8 windows stay inside the first epoch.
        "aligned": write_aligned_jsonl(root / "aligned.jsonl", 500),
        "ragged": write_ragged_jsonl(root / "ragged.jsonl", 400),
    }


@pytest.fixture(scope="session")
def parity_runs(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> ParityRuns:
    return ParityRuns(tmp_path_factory.mktemp("parity"), inputs)
