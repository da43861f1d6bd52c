"""The learning-rate schedule: linear warm-up, then a cosine decay to the floor."""

from __future__ import annotations

import itertools
import math

import pytest
from fsdp_trainer.optim import lr_factor


def test_schedule_warms_up_then_decays_to_the_floor() -> None:
    f = [lr_factor(s, warmup_steps=10, max_steps=110, min_ratio=0.1) for s in range(110)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0)
    assert f[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 50 / 99)))
    assert f[109] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(f[10:]))
    assert lr_factor(0, warmup_steps=0, max_steps=5, min_ratio=0.0) == 1.0
