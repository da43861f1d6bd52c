"""The preference losses on packed pairs: log-probabilities per answer, DPO and SimPO by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from fsdp_api.spec import PreferenceSpec
from fsdp_api.spec.training import PREFERENCE_OBJECTIVES, REFERENCE_OBJECTIVES
from fsdp_trainer.data.packing import IGNORE_INDEX
from fsdp_trainer.loss import ModelCall
from fsdp_trainer.loss.preference import (
    OBJECTIVES,
    PairIndex,
    PreferenceLoss,
    PreferenceStats,
    count_pairs,
    model_reference,
    token_logps,
)
from torch import nn

VOCAB = 11
X = IGNORE_INDEX


class Logits(nn.Module):
    """A 'model' whose logits are a fixed table indexed by input id (what the loss sees)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed)))

    def forward(self, input_ids: torch.Tensor, **_: object) -> object:
        return type("Out", (), {"logits": self.table[input_ids]})()


# Two rows: the first holds two pairs, the second one pair and padding.
INPUTS = torch.tensor([[0, 3, 4, 0, 5, 0, 6, 7, 0, 8], [0, 2, 3, 0, 2, 9, 9, 1, 1, 1]])
LABELS = torch.tensor([[X, 4, 1, X, 1, X, 7, 1, X, 1], [X, 3, 1, X, 9, 9, 1, X, X, X]])
POSITIONS = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 0, 1], [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]])
# (row, slice) of each answer's positions: pair k = (chosen, rejected).
PAIRS = [
    ((0, slice(0, 3)), (0, slice(3, 5))),
    ((0, slice(5, 8)), (0, slice(8, 10))),
    ((1, slice(0, 3)), (1, slice(3, 7))),
]


def _hand_logps(model: nn.Module) -> list[tuple[float, float, int, int]]:
    logp = torch.log_softmax(model(INPUTS).logits.float(), -1)
    out = []
    for pair in PAIRS:
        sides = []
        for row, cols in pair:
            labels = LABELS[row, cols]
            keep = labels != X
            sides.append((logp[row, cols][keep].gather(1, labels[keep].unsqueeze(1)).sum().item(), int(keep.sum())))
        out.append((sides[0][0], sides[1][0], sides[0][1], sides[1][1]))
    return out


def test_pairs_are_found_from_the_positions_and_padding_is_none() -> None:
    assert count_pairs(LABELS, POSITIONS) == 3
    counts = PairIndex.of(LABELS, POSITIONS).counts()
    assert sorted(tuple(c) for c in counts.tolist() if c != [0, 0]) == [(2, 1), (2, 1), (2, 3)]


def test_token_logps_are_zero_where_ignored() -> None:
    logits = torch.randn(2, 10, VOCAB)
    out = token_logps(logits, LABELS)
    assert out[LABELS == X].abs().max() == 0
    want = -F.cross_entropy(logits[0, 1], LABELS[0, 1])
    assert out[0, 1].item() == pytest.approx(want.item(), abs=1e-6)


def test_dpo_is_the_sigmoid_loss_of_the_log_ratio_margins() -> None:
    policy, reference = Logits(1), Logits(2)
    beta = 0.3
    loss = PreferenceLoss("dpo", PreferenceSpec(beta=beta), model_reference(reference, after=lambda: None))
    total, stats = loss.loss_sum(ModelCall(policy, {"input_ids": INPUTS}), LABELS, POSITIONS)
    want, chosen, rejected, correct = 0.0, 0.0, 0.0, 0
    for (pc, pr, _, _), (rc, rr, _, _) in zip(_hand_logps(policy), _hand_logps(reference), strict=True):
        rc_, rr_ = beta * (pc - rc), beta * (pr - rr)
        want += -math.log(1 / (1 + math.exp(-(rc_ - rr_))))
        chosen, rejected, correct = chosen + rc_, rejected + rr_, correct + (rc_ > rr_)
    assert total.item() == pytest.approx(want, abs=1e-5)
    assert stats.tolist() == pytest.approx([3, chosen, rejected, correct], abs=1e-5)
    total.backward()
    assert policy.table.grad is not None and reference.table.grad is None


def test_dpo_against_itself_is_ln2_per_pair_and_ranks_nothing_right() -> None:
    model = Logits(4)
    loss = PreferenceLoss("dpo", PreferenceSpec(), model_reference(model, after=lambda: None))
    total, stats = loss.loss_sum(ModelCall(model, {"input_ids": INPUTS}), LABELS, POSITIONS)
    assert total.item() == pytest.approx(3 * math.log(2), abs=1e-6)
    assert PreferenceStats.from_sums(stats.tolist()) == PreferenceStats(3, 0.0, 0.0, 0.0)


def test_simpo_uses_mean_log_probs_and_the_margin_gamma_without_a_reference() -> None:
    model = Logits(5)
    beta, gamma = 2.0, 0.7
    total, stats = PreferenceLoss("simpo", PreferenceSpec(beta=beta, gamma=gamma)).loss_sum(
        ModelCall(model, {"input_ids": INPUTS}), LABELS, POSITIONS
    )
    want = 0.0
    for pc, pr, nc, nr in _hand_logps(model):
        z = beta * pc / nc - beta * pr / nr - gamma
        want += math.log1p(math.exp(-z))
    assert total.item() == pytest.approx(want, abs=1e-5)
    assert stats[0].item() == 3


def test_the_objectives_registered_are_the_ones_the_api_accepts() -> None:
    assert set(OBJECTIVES) == set(PREFERENCE_OBJECTIVES)
    # The memory plan counts a reference copy for exactly the objectives that use one.
    assert {name for name, o in OBJECTIVES.items() if o.needs_reference} == set(REFERENCE_OBJECTIVES)


def test_step_stats_are_means_over_the_pairs() -> None:
    stats = PreferenceStats.from_sums([4.0, 2.0, -1.0, 3.0])
    assert (stats.pairs, stats.reward_chosen, stats.reward_rejected, stats.accuracy) == (4, 0.5, -0.25, 0.75)
    assert stats.margin == 0.75
