"""Fixtures of the core trainer tests: offline tokenizer and datasets, shared runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.core.harness import (
    RunResult,
    base_config,
    build_word_tokenizer,
    launch,
    write_aligned_jsonl,
    write_ragged_jsonl,
)


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


# Sharding variants compared with the single-process reference: the FSDP
# section, plus training overrides. The global batch is always 8 windows:
# 2 ranks x micro batch 2 x 2 accumulation steps (the reference: 1 x 4 x 2).
VARIANTS: dict[str, dict[str, dict]] = {
    "full": {"fsdp": {"shardingStrategy": "full"}},
    "shard_grad_op": {"fsdp": {"shardingStrategy": "shard_grad_op"}},
    "no_shard": {"fsdp": {"shardingStrategy": "no_shard"}},
    "hybrid_2x1": {"fsdp": {"shardingStrategy": "hybrid", "shardGroupSize": 1}},
    "hybrid_1x2": {"fsdp": {"shardingStrategy": "hybrid", "shardGroupSize": 2}},
    "full_ac_prefetch": {
        "fsdp": {"shardingStrategy": "full", "prefetch": 1},
        "training": {"activationCheckpointing": "selective"},
    },
}


class ParityRuns:
    """20-step runs on the aligned data, launched on first use and shared by the tests."""

    def __init__(self, root: Path, inputs: dict[str, Path]) -> None:
        self.root, self.inputs = root, inputs
        self._done: dict[str, RunResult] = {}

    def config(self, name: str) -> dict:
        variant = VARIANTS.get(name, {})
        training = {
            "microBatchSize": 4 if name == "reference" else 2,
            "gradAccumSteps": 2,
            "evalIntervalSteps": 10,
            "evalSteps": 2,
            **variant.get("training", {}),
        }
        return base_config(
            self.root / name,
            self.inputs["aligned"],
            self.inputs["tokenizer"],
            training=training,
            fsdp=variant.get("fsdp", {}),
            checkpoint={"intervalSteps": 10},
        )

    def get(self, name: str) -> RunResult:
        if name not in self._done:
            nproc = None if name == "reference" else 2
            self._done[name] = launch(self.root / name, self.config(name), nproc=nproc).check()
        return self._done[name]


@pytest.fixture(scope="session")
def parity_runs(tmp_path_factory: pytest.TempPathFactory, inputs: dict[str, Path]) -> ParityRuns:
    return ParityRuns(tmp_path_factory.mktemp("parity"), inputs)
