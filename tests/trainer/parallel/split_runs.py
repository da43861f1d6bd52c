"""Shared by the tensor- and context-parallel tests: a run split over 4 ranks against one process.

The one process trains on micro-batches of 4 windows; the split run's 2
data-parallel ranks on 2 each (their model-parallel peers share them), so the
global batch is the same and the losses must be too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainer.harness import RunResult, base_config, cpu_world, launch

STEPS = 10
MODELS = ("llama", "mistral", "qwen2")  # each declares a tensor-parallel plan; Mistral has a sliding window
# Plans beyond colwise/rowwise: per-head q/k norms whose weight gradients are summed over the
# group (Qwen3; Gemma 3 with sliding-window layers too), fused qkv and gate/up projections whose
# outputs are gathered and whose next projection splits its input (Phi-3).
TP_STYLE_MODELS = ("qwen3", "gemma3_text", "phi3")


def model_config(work: Path, data_path: Path, model: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    """The harness's config for ``model`` (a pretrained or architecture directory with its own tokenizer)."""
    cfg = base_config(work, data_path, Path("unused"), **sections)
    cfg["model"] = model
    del cfg["data"]["tokenizer"]
    return cfg


def assert_same_losses(single: dict[int, float], split: dict[int, float], label: str = "") -> None:
    """Every step's loss equal to 1e-4, and the run trained; prints the largest difference."""
    assert sorted(single) == list(range(1, STEPS + 1))
    print(f"{label}max |loss difference| over {STEPS} steps: {max(abs(split[s] - single[s]) for s in single):.2e}")
    for step, loss in single.items():
        assert abs(split[step] - loss) <= 1e-4, (step, loss, split[step])
    assert min(single[STEPS - 1], single[STEPS]) < single[1]


def same_curve(reference: RunResult, split: RunResult, label: str = "") -> None:
    """Every step's loss equal to 1e-4 (``assert_same_losses``) and every gradient norm within 1e-4 relative."""
    assert_same_losses(reference.losses(), split.losses(), label)
    norms = {r["step"]: r["grad_norm"] for r in reference.events("step")}
    for r in split.events("step"):
        assert r["grad_norm"] == pytest.approx(norms[r["step"]], rel=1e-4), (label, r["step"])


def assert_resumed_curve(before: dict[int, float], after: dict[int, float]) -> None:
    """A run resumed from step 5 trains steps 6 to STEPS with the uninterrupted run's losses (1e-4)."""
    assert sorted(after) == list(range(6, STEPS + 1))
    print(f"resumed: max |loss difference| {max(abs(after[s] - before[s]) for s in after):.2e}")
    for step, loss in after.items():
        assert abs(loss - before[step]) <= 1e-4, (step, loss, before[step])


def prepare_error(cfg: dict[str, Any], world_size: int = 4) -> str:
    """The one line ``prepare`` refuses ``cfg`` with on a CPU launch of ``world_size`` ranks."""
    from fsdp_api.trainer_config import TrainerConfig
    from fsdp_trainer.build import prepare
    from fsdp_trainer.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        prepare(TrainerConfig.model_validate(cfg), cpu_world(world_size, world_size))
    assert len(e.value.lines) == 1, e.value.lines
    return e.value.lines[0]


def one_process_and_split(
    tmp_path: Path, data_path: Path, checkpoint: Path, degrees: dict[str, int], *, data_parallel: int = 2
) -> tuple[RunResult, RunResult]:
    """The same training as one process and as 4 ranks with ``degrees``; both runs, checked."""
    runs = []
    for nproc, mbs, parallelism in ((None, 4, {}), (4, 4 // data_parallel, degrees)):
        work = tmp_path / ("split" if parallelism else "single")
        cfg = model_config(
            work,
            data_path,
            {"pretrained": str(checkpoint)},
            training={"maxSteps": STEPS, "microBatchSize": mbs},
            parallelism=parallelism,
        )
        runs.append(launch(work, cfg, nproc=nproc).check())
    single, split = runs
    same_curve(single, split, f"{degrees}: ")
    return single, split
