"""The preference losses (``training.objective`` dpo and simpo) of packed pairs.

A packed sequence holds whole pairs (``data/formats/preference.py``): its
sequences, told apart by position ids that restart at 0, alternate prompt +
chosen and prompt + rejected, and may end in padding (trained on nothing).
Each sequence's log-probability is the sum over its trained (answer) tokens
of the log-softmax of the model's logits at the answer token, in fp32.

- dpo (sigmoid, Rafailov et al.): reward = beta * (log p_policy - log
  p_reference) of an answer; loss = -log sigmoid(reward_chosen -
  reward_rejected). TRL's DPOTrainer computes the same sums and the same
  loss (``loss_type="sigmoid"``), checked step by step in the tests.
- simpo (Meng et al.): reward = beta * the mean log-probability over the
  answer's tokens, no reference; loss = -log sigmoid(reward_chosen -
  reward_rejected - gamma), TRL's ``loss_type="simpo"``.

The loss of a micro-batch is the sum over its pairs; the train loop divides
by the pairs of the whole global batch, as it divides the token loss by the
trained tokens, so the gradient is that of the mean over every pair.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from fsdp_api.spec import PreferenceSpec
from torch import nn

from ..data.attention import document_ids
from ..data.packing import IGNORE_INDEX
from .model_call import ModelCall

# The reference's logits on the micro-batch of the policy's call (dpo): the base with the adapters
# off, or a frozen copy of the model as loaded.
Reference = Callable[[ModelCall], torch.Tensor]

# Per step, summed over micro-batches and ranks: pairs, reward chosen, reward rejected, pairs ranked right.
STATS = ("pairs", "reward_chosen", "reward_rejected", "correct")


@dataclass
class PreferenceStats:
    """A step's pairs, as means over the global batch (what the metrics and trackers show)."""

    pairs: int
    reward_chosen: float
    reward_rejected: float
    accuracy: float  # share of pairs whose chosen answer gets the higher reward

    @property
    def margin(self) -> float:
        return self.reward_chosen - self.reward_rejected

    @classmethod
    def from_sums(cls, sums: list[float]) -> PreferenceStats:
        pairs, chosen, rejected, correct = sums
        n = max(pairs, 1.0)
        return cls(round(pairs), chosen / n, rejected / n, correct / n)


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) per position in fp32 ([batch, seq]); 0 where the label is ignored."""
    flat = -F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none", ignore_index=IGNORE_INDEX)
    return flat.view(labels.shape)


@dataclass
class PairIndex:
    """Where each trained position's pair and side are, for one packed micro-batch."""

    slots: torch.Tensor  # [batch * seq] index into pair slots * 2 + side, for trained positions
    trained: torch.Tensor  # [batch * seq] bool
    num_slots: int  # pair slots (row-major; only those with both sides trained are pairs)

    @classmethod
    def of(cls, labels: torch.Tensor, position_ids: torch.Tensor) -> PairIndex:
        docs = document_ids(position_ids) - 1  # 0-based sequence within its row: chosen, rejected, chosen, ...
        per_row = labels.shape[1] // 2 + 1
        row = torch.arange(labels.shape[0], device=labels.device).unsqueeze(1)
        slot = (row * per_row + docs // 2) * 2 + docs % 2
        trained = (labels != IGNORE_INDEX).flatten()
        return cls(slot.flatten(), trained, labels.shape[0] * per_row)

    def sums(self, values: torch.Tensor) -> torch.Tensor:
        """Per pair slot, the sum of ``values`` over each side's trained positions: [num_slots, 2]."""
        out = values.new_zeros(self.num_slots * 2)
        out = out.index_add(0, self.slots[self.trained], values.flatten()[self.trained])
        return out.view(self.num_slots, 2)

    def counts(self) -> torch.Tensor:
        ones = torch.ones(self.slots.shape, dtype=torch.float32, device=self.slots.device)
        return self.sums(ones)


def count_pairs(labels: torch.Tensor, position_ids: torch.Tensor) -> int:
    """Pairs in a packed micro-batch (both answers have trained tokens)."""
    counts = PairIndex.of(labels, position_ids).counts()
    return int(((counts[:, 0] > 0) & (counts[:, 1] > 0)).sum())


class Dpo:
    """Sigmoid DPO: reward = beta x (log p_policy - log p_reference); margin = reward_chosen - reward_rejected."""

    needs_reference = True

    def rewards(
        self, spec: PreferenceSpec, policy: torch.Tensor, reference: torch.Tensor | None, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert reference is not None
        rewards = spec.beta * (policy - reference)
        return rewards, rewards[:, 0] - rewards[:, 1]


class Simpo:
    """SimPO: reward = beta x mean log p over the answer's tokens; margin = the difference minus gamma."""

    needs_reference = False

    def rewards(
        self, spec: PreferenceSpec, policy: torch.Tensor, reference: torch.Tensor | None, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rewards = spec.beta * policy / tokens.clamp(min=1)
        return rewards, rewards[:, 0] - rewards[:, 1] - spec.gamma


class PreferenceObjective(Protocol):
    """An objective's rewards of a micro-batch's answers and each pair's margin."""

    needs_reference: bool

    def rewards(
        self, spec: PreferenceSpec, policy: torch.Tensor, reference: torch.Tensor | None, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


# training.objective -> its rewards; the loss of a pair is -log sigmoid(margin) for every one of them.
OBJECTIVES: dict[str, PreferenceObjective] = {"dpo": Dpo(), "simpo": Simpo()}


@dataclass
class PreferenceLoss:
    """One objective's loss of a micro-batch of pairs; ``reference`` gives the frozen model's logits (dpo)."""

    objective: str
    spec: PreferenceSpec
    reference: Reference | None = None  # the policy's call -> the reference's logits on its inputs

    def loss_sum(
        self, call: ModelCall, labels: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed loss over the micro-batch's pairs (differentiable) and its STATS sums (detached).

        ``positions`` (per-sequence position ids) tell the sequences apart;
        ``call`` is the policy's forward on the micro-batch (input ids and the
        packed attention's).
        """
        objective = OBJECTIVES[self.objective]
        index = PairIndex.of(labels, positions)
        reference = None
        if objective.needs_reference:
            assert self.reference is not None, f"objective {self.objective} needs a reference model"
            # First, so its logits are gone before the policy's activations exist: the peak stays the policy's.
            with torch.no_grad():
                reference = index.sums(token_logps(self.reference(call), labels))
        logits = call().logits
        policy = index.sums(token_logps(logits, labels))
        del logits
        tokens = index.counts()
        is_pair = (tokens[:, 0] > 0) & (tokens[:, 1] > 0)
        rewards, margin = objective.rewards(self.spec, policy, reference, tokens)
        losses = -F.logsigmoid(margin)[is_pair]
        detached = rewards.detach()[is_pair]
        stats = torch.stack(
            [
                is_pair.sum().float(),
                detached[:, 0].sum(),
                detached[:, 1].sum(),
                (detached[:, 0] > detached[:, 1]).sum().float(),
            ]
        )
        return losses.sum(), stats


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """The base model: every LoRA layer's adapters bypassed for the block.

    PEFT's ``enable_adapters(False)`` also flips the adapters'
    ``requires_grad``, which must not change on FSDP2's sharded parameters
    between two forwards of one step; the flag its layers' forward reads
    (``disable_adapters``) is set instead.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def lora_reference(model: nn.Module) -> Reference:
    """dpo with LoRA: the reference is the policy's own call with its adapters off (no second copy of the model)."""

    def logits(call: ModelCall) -> torch.Tensor:
        with adapters_off(model):
            return call().logits

    return logits


def model_reference(reference: nn.Module, after: Callable[[], None]) -> Reference:
    """dpo without LoRA: a frozen copy, called on the policy's inputs; ``after`` frees what its forward gathered."""

    def logits(call: ModelCall) -> torch.Tensor:
        try:
            return ModelCall(reference, call.inputs)().logits
        finally:
            after()

    return logits
