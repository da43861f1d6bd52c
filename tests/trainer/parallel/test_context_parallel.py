"""Context parallelism (``parallelism.context``): rows split over ranks, attention over whole rows.

Four gloo ranks as context 2 x data 2 train tiny Llama, Mistral (a sliding
window shorter than the row) and Qwen2 models with the losses of a single
process to 1e-4 over 10 steps; packed chat rows stay apart exactly (the loss,
the trained-token counts and the validation loss equal the single process's,
whose rows are masked block-diagonally); and what cannot be split is refused
before any process group exists, in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_api.trainer_config import TrainerConfig
from fsdp_trainer.build import prepare
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.parallel.context_parallel import chunk_positions

from tests.trainer.data.chat_inputs import build_chat_tokenizer, write_half_window_chats
from tests.trainer.harness import cpu_world, launch
from tests.trainer.model.architectures import build_checkpoint
from tests.trainer.parallel.split_runs import MODELS, STEPS, assert_same_losses, model_config, one_process_and_split


def test_each_rank_holds_an_early_and_a_late_chunk_and_together_all() -> None:
    parts = [chunk_positions(16, 2, r).tolist() for r in range(2)]
    assert parts == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]]
    four = torch.cat([chunk_positions(32, 4, r) for r in range(4)])
    assert sorted(four.tolist()) == list(range(32))


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_context_2_by_data_2_trains_like_one_process(
    name: str, checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    _, split = one_process_and_split(tmp_path, inputs["aligned"], checkpoints[name], {"context": 2})
    assert split.events("start")[0]["mesh"] == {"shard": 2, "cp": 2}


@pytest.mark.slow
def test_packed_chat_rows_stay_apart_and_resume_exactly(tmp_path: Path) -> None:
    """Rows of 17 tokens packed two to a 32-token sequence: the context chunks (8 tokens) cut through them.

    Mistral: its 16-token sliding window and the documents both shape the mask.
    """
    name = "mistral"
    import shutil

    tokenizer = build_chat_tokenizer(tmp_path / "tokenizer")
    data = write_half_window_chats(tmp_path / "chats.jsonl")
    model = {"pretrained": str(build_checkpoint(name, tmp_path / name, tokenizer))}

    def config(work: str, nproc_mbs: int, context: int) -> dict[str, Any]:
        return model_config(
            tmp_path / work,
            data,
            model,
            data={"format": "chat"},
            training={"maxSteps": STEPS, "microBatchSize": nproc_mbs, "gradAccumSteps": 2, "evalIntervalSteps": 5},
            parallelism={"context": context},
            checkpoint={"intervalSteps": 5},
        )

    reference = launch(tmp_path / "single", config("single", 4, 1), nproc=None).check()
    split = launch(tmp_path / "cp2", config("cp2", 2, 2), nproc=4).check()
    assert_same_losses(reference.losses(), split.losses())
    # The trained tokens (the loss's divisor) are counted once per data-parallel rank, not per chunk.
    assert [r["trained_tokens"] for r in split.events("step")] == [
        r["trained_tokens"] for r in reference.events("step")
    ]
    ref_eval = {r["step"]: r["loss"] for r in reference.events("eval")}
    assert {r["step"]: r["loss"] for r in split.events("eval")} == pytest.approx(ref_eval, abs=1e-4)

    # Stopped at step 5 and resumed on the same layout: the very same steps 6 to 10.
    shutil.copytree(
        tmp_path / "cp2" / "checkpoints" / "step-00000005", tmp_path / "again" / "checkpoints" / "step-00000005"
    )
    resumed = launch(tmp_path / "again", config("again", 2, 2), nproc=4).check()
    assert resumed.events("start")[0]["step"] == 5
    assert resumed.losses() == {s: loss for s, loss in split.losses().items() if s > 5}


def _refusal(cfg: dict[str, Any], world: int = 2, local: int = 2) -> str:
    with pytest.raises(ConfigError) as err:
        prepare(TrainerConfig.model_validate(cfg), cpu_world(world, local))
    assert len(err.value.lines) == 1, err.value.lines
    return err.value.lines[0]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gemma2", "parallelism.context: Gemma2ForCausalLM soft-caps its attention logits"),
        ("falcon_h1", "parallelism.context: FalconH1ForCausalLM mixes tokens outside attention"),
    ],
)
def test_architectures_that_cannot_split_rows_are_refused_in_one_line(
    name: str, expected: str, inputs: dict[str, Path], tmp_path: Path
) -> None:
    path = build_checkpoint(name, tmp_path / name, inputs["tokenizer"])
    cfg = model_config(tmp_path, inputs["aligned"], {"architecture": str(path)}, parallelism={"context": 2})
    assert expected in _refusal(cfg)


def test_what_context_parallelism_cannot_take_is_refused_by_the_config(inputs: dict[str, Path], tmp_path: Path) -> None:
    from pydantic import ValidationError

    base = {"model": {"preset": "tiny"}, "training": {"maxSteps": 1, "seqLen": 32}, "parallelism": {"context": 2}}
    cases = {
        "parallelism.context needs training.seqLen set to a multiple of 2 x context": {
            "training": {"maxSteps": 1, "seqLen": 30}
        },
        "fsdp.shardingStrategy no_shard with parallelism.context > 1 is not supported": {
            "fsdp": {"shardingStrategy": "no_shard"}
        },
        "dpo and simpo with parallelism.context > 1 are not supported": {
            "training": {"maxSteps": 1, "seqLen": 32, "objective": "dpo"},
            "data": {"format": "preference", "path": "pairs.jsonl"},
        },
    }
    for message, extra in cases.items():
        with pytest.raises(ValidationError) as err:
            TrainerConfig.model_validate({**base, **extra})
        assert message in str(err.value)
    TrainerConfig.model_validate(base)  # on its own it is fine


def test_the_mask_free_causal_chunks_equal_the_masked_attention() -> None:
    """The CUDA path for a plain token stream (each chunk causal up to its end), checked on CPU."""
    from fsdp_trainer.parallel.context_parallel import ContextParallel, Layout

    torch.manual_seed(0)
    seq, degree = 32, 2
    for index in range(degree):
        cp = ContextParallel.__new__(ContextParallel)
        cp.seq_len, cp.degree, cp.index = seq, degree, index
        positions = chunk_positions(seq, degree, index)
        query = torch.randn(2, 4, len(positions), 8, dtype=torch.float64)
        key, value = torch.randn(2, 2, seq, 8, dtype=torch.float64), torch.randn(2, 2, seq, 8, dtype=torch.float64)
        sdpa = {"dropout_p": 0.0, "scale": None, "enable_gqa": True}
        chunks = cp._causal_chunks(query, key, value, sdpa)
        mask = Layout(positions, seq, None).mask(None, torch.float64)
        masked = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, **sdpa)
        torch.testing.assert_close(chunks, masked.transpose(1, 2), rtol=0, atol=1e-12)


@pytest.mark.slow
def test_context_2_by_tensor_2_trains_like_one_process(
    checkpoints: dict[str, Path], inputs: dict[str, Path], tmp_path: Path
) -> None:
    """Both model-parallel degrees at once on 4 ranks (one data-parallel rank): the whole batch on every rank."""
    degrees = {"context": 2, "tensor": 2}
    _, split = one_process_and_split(tmp_path, inputs["aligned"], checkpoints["qwen2"], degrees, data_parallel=1)
    assert split.events("start")[0]["mesh"] == {"shard": 1, "cp": 2, "tp": 2}
