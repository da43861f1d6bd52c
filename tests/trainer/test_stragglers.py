"""The straggler signal: every rank measures how long it waited at each step's start, and how late it came."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_api.contract import ENV_TRAINER_FAULT

from tests.trainer.harness import base_config, launch

SLOW = 0.5


@pytest.mark.slow
def test_a_slow_rank_is_the_late_one_and_its_peer_waits_for_it(tmp_path: Path, inputs: dict[str, Path]) -> None:
    cfg = base_config(tmp_path, inputs["ragged"], inputs["tokenizer"], training={"maxSteps": 7})
    # Rank 1 sleeps after every step from step 2 on: it reaches the start of steps 3..7 late.
    run = launch(tmp_path, cfg, env={ENV_TRAINER_FAULT: f"after_step:2:1:slow{SLOW}"}).check()
    steps = {rank: {r["step"]: r for r in run.events("step", rank)} for rank in (0, 1)}
    assert sorted(steps[0]) == sorted(steps[1]) == list(range(1, 8))
    for step in range(3, 8):
        fast, slow = steps[0][step], steps[1][step]
        # The sleep is the peer's wait and the slow rank's lateness; a few ms of the barrier's own latency aside.
        assert fast["wait"] == pytest.approx(SLOW, abs=0.15), (step, fast)
        assert slow["lateness"] == pytest.approx(SLOW, abs=0.15), (step, slow)
        assert slow["wait"] < 0.1 and fast["lateness"] < 0.1, (step, fast, slow)
    # Before the fault neither rank made the other wait for long; a run's first step (loading, compiling) not at all.
    assert steps[1][2]["lateness"] < 0.2 and steps[0][2]["lateness"] < 0.2
    assert steps[0][1]["lateness"] == steps[1][1]["lateness"] == steps[0][1]["wait"] == 0
