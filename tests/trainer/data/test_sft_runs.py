"""The real trainer on chat rows (torchrun, 2 ranks, gloo): packed rows keep apart and the
loss is the mean over the global batch's trained tokens (2 ranks equal 1 process, though
their rows are packed with other neighbours), and a killed run resumes exactly.

Each row renders to exactly 17 tokens (16 positions: half a sequence), so every sequence
holds two whole rows and a step reads the same 16 rows on 1 or 2 ranks; the prompt lengths
vary, so the ranks train on different numbers of tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fsdp_api.contract import ENV_TRAINER_FAULT

from tests.trainer.checkpoint.resume_runs import effective_steps, split_attempts
from tests.trainer.data.chat_inputs import build_chat_tokenizer, write_half_window_chats
from tests.trainer.harness import RunResult, base_config, launch

pytestmark = pytest.mark.slow


class ChatRuns:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tokenizer = build_chat_tokenizer(root / "tokenizer")
        self.data = write_half_window_chats(root / "chats.jsonl")
        self._done: dict[str, RunResult] = {}

    def config(self, name: str) -> dict[str, Any]:
        return base_config(
            self.root / name,
            self.data,
            self.tokenizer,
            data={"format": "chat"},
            training={
                "microBatchSize": 4 if name == "reference" else 2,
                "gradAccumSteps": 2,
                "evalIntervalSteps": 10,
                "evalSteps": 2,
            },
            checkpoint={"intervalSteps": 5, "keepLast": 2},
        )

    def get(self, name: str, **kwargs: Any) -> RunResult:
        if name not in self._done:
            nproc = None if name == "reference" else 2
            self._done[name] = launch(self.root / name, self.config(name), nproc=nproc, **kwargs).check()
        return self._done[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> ChatRuns:
    return ChatRuns(tmp_path_factory.mktemp("chat-runs"))


def _rows(samples: list[str]) -> list[str]:
    return sorted(key for sample in samples for key in sample.split("+"))


def _trained_per_row(path: Path) -> dict[str, int]:
    """Row key -> its trained tokens: the assistant's words and its end marker."""
    rows = [json.loads(line)["messages"] for line in path.read_text().splitlines()]
    return {f"d{i}": len(m[1]["content"].split()) + 1 for i, m in enumerate(rows)}


def _trained(samples: list[str], per_row: dict[str, int]) -> int:
    return sum(per_row[key.split("/")[1]] for key in _rows(samples))


def test_two_ranks_train_like_one_process_on_packed_chats(runs: ChatRuns) -> None:
    reference, sharded = runs.get("reference"), runs.get("straight")
    # training.packedAttention auto on CPU ranks: the dense mask, and the log says why.
    assert (
        "data.format chat: documents kept apart by explicit block-diagonal causal mask (sdpa), per-document "
        "position ids (auto: cpu ranks: FlexAttention has no backward pass on CPU)"
    ) in sharded.output
    per_row = _trained_per_row(runs.data)
    uneven = False
    steps = zip(reference.events("step"), sharded.events("step", 0), sharded.events("step", 1), strict=True)
    for ref, r0, r1 in steps:
        # The same rows in the step, but packed with other neighbours...
        assert _rows(ref["samples"]) == _rows(r0["samples"] + r1["samples"])
        assert set(ref["samples"]) != set(r0["samples"] + r1["samples"])
        # ...give the same loss: no row sees another, and the mean is over the global batch.
        assert r0["loss"] == pytest.approx(ref["loss"], abs=1e-5), ref["step"]
        assert r0["trained_tokens"] == ref["trained_tokens"] == _trained(ref["samples"], per_row)
        uneven |= _trained(r0["samples"], per_row) != _trained(r1["samples"], per_row)
    assert uneven, "the ranks should train on different token counts"
    ref_eval = {r["step"]: r["loss"] for r in reference.events("eval")}
    sharded_eval = {r["step"]: r["loss"] for r in sharded.events("eval")}
    assert ref_eval.keys() == {10, 20} and sharded_eval == pytest.approx(ref_eval, abs=1e-5)
    losses = [r["loss"] for r in reference.events("step")]
    assert losses[-1] < losses[0] - 0.3


def test_killed_chat_run_resumes_with_identical_losses_and_rows(runs: ChatRuns) -> None:
    straight = runs.get("straight")
    killed = runs.get("killed", env={ENV_TRAINER_FAULT: "after_step:13"}, max_restarts=1)
    assert [a[0]["step"] for a in split_attempts(killed, 0)] == [0, 10]
    for rank in (0, 1):
        want, got = straight.events("step", rank), effective_steps(killed, rank)
        assert [r["step"] for r in got] == list(range(1, 21))
        for a, b in zip(want, got, strict=True):
            assert a["loss"] == b["loss"], (a["step"], a["loss"], b["loss"])
            assert a["samples"] == b["samples"] and a["rows"] == b["rows"]
    rows = [k for rank in (0, 1) for r in effective_steps(killed, rank) for k in _rows(r["samples"])]
    assert len(rows) == len(set(rows)) == 20 * 16
