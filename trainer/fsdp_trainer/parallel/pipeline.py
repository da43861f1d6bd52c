"""Pipeline parallelism: any causal LM's decoder layers split into consecutive stages.

Each rank of stage ``s`` holds a copy of the meta model in which the layers
of the other stages are parameterless pass-throughs, the input embedding is
kept on the first stage only, the final norm and output head on the last only.
Nothing is renamed, so every parameter keeps the model's own name: DCP saves
each stage's tensors under the names a one-stage run loads (a checkpoint
written with ``pipeline: 2`` resumes with 1, or another split), the random
init draws each tensor from the same seed as without stages, and the
pretrained loader and ``fsdp-train export`` need nothing new.

A stage runs the model's own forward, so whatever the architecture computes
around its layers (rotary tables, per-layer masks of sliding-window and hybrid
models, scaled embeddings, logit soft-capping on the last stage) is computed as
without stages: a later stage's embedding returns zeros of the activations'
shape, and a forward pre-hook on its first own layer hands that layer the
previous stage's activations instead (``StageForward``). Everything before
that layer is then discarded, so what an architecture does between its
embedding and its first layer (GPT-2's learned positions, Gemma's scaling)
happens once, on the first stage.

torchtitan splits its own models the same way (a deep copy per stage with
the other layers deleted); it owns its model code, this trainer runs the
transformers modules and so keeps them in place.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from ..model.architecture import decoder_units, embeddings_tied

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its index among ``count`` and the decoder layers it runs."""

    index: int
    count: int
    layers: range

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def describe(self) -> str:
        return f"stage {self.index} of {self.count}: layers {self.layers.start}-{self.layers.stop - 1}"


def balanced_ranges(weights: list[int], stages: int) -> list[range]:
    """Consecutive ranges of ``weights`` (each non-empty), cut where the running sum is nearest each equal share.

    Layers of one architecture mostly weigh the same, so this is an even split
    of their count; a model whose first layers are dense and the rest mixtures
    of experts (DeepSeek V3) gets fewer MoE layers per stage.
    """
    total, cuts, running = sum(weights), [0], 0
    sums = []
    for w in weights:
        running += w
        sums.append(running)
    for k in range(1, stages):
        lo, hi = cuts[-1] + 1, len(weights) - (stages - k)  # at least one layer each side
        target = total * k / stages
        cut = min(range(lo, hi + 1), key=lambda i: (abs(sums[i - 1] - target), i))
        cuts.append(cut)
    cuts.append(len(weights))
    return [range(a, b) for a, b in itertools.pairwise(cuts)]


def _layer_weights(model: nn.Module) -> list[int]:
    return [sum(p.numel() for p in unit.module.parameters()) for unit in decoder_units(model)]


def stage_of(model: nn.Module, index: int, count: int) -> Stage:
    return Stage(index, count, balanced_ranges(_layer_weights(model), count)[index])


def pipeline_errors(model: PreTrainedModel, stages: int) -> list[str]:
    """Why ``model`` cannot be split into ``stages`` pipeline stages (one line each); empty when it can."""
    if stages == 1:
        return []
    name = type(model).__name__
    units = decoder_units(model)
    if len(units) < stages:
        return [
            f"parallelism.pipeline: {stages} stages need at least {stages} decoder layers, and {name} has "
            f"{len(units)}; use parallelism.pipeline: {max(1, len(units))} or fewer"
        ]
    if embeddings_tied(model):
        return [
            f"parallelism.pipeline: {name} ties its output head to its input embedding (one weight the first and "
            "the last stage would both update), which this trainer does not split yet; use a model with untied "
            "embeddings (tie_word_embeddings: false) or parallelism.pipeline: 1"
        ]
    base = model.base_model
    layers = units[0].parent
    if any(u.parent is not layers for u in units) or all(child is not layers for child in base.children()):
        return [f"parallelism.pipeline: {name}'s decoder layers are not one list of its base model, so they "
                "cannot be cut into stages; use parallelism.pipeline: 1"]  # fmt: skip
    around = [n for n, m in _outside(base, layers) if not isinstance(m, nn.Embedding)]
    if len(around) > 1:
        return [
            f"parallelism.pipeline: {name}'s base model has modules with weights besides its embeddings and "
            f"layers ({', '.join(around)}), and only one (the final norm) can go to the last stage; use "
            "parallelism.pipeline: 1"
        ]
    return []


def _outside(base: nn.Module, layers: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """The base model's children with weights, other than the layers: its embeddings and its final norm."""
    for child_name, child in base.named_children():
        if child is not layers and any(True for _ in child.parameters()):
            yield child_name, child


class Absent(nn.Module):
    """A decoder layer of another stage: no weights, hands its input through (never reached in compute)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        # Hybrid models read each layer's attention type in their loop (Gemma 3, Qwen3's sliding layers).
        if hasattr(layer, "attention_type"):
            self.attention_type = layer.attention_type

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


class ReceivedEmbedding(nn.Module):
    """A later stage's input embedding: zeros of the activations' shape and dtype, replaced at the first own layer."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.dim = embedding.embedding_dim
        self.like: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        assert self.like is not None, "a later stage's embedding runs inside StageForward only"
        return self.like.new_zeros(*input_ids.shape, self.dim)


def stage_model(model: PreTrainedModel, stage: Stage) -> PreTrainedModel:
    """This stage's copy of the meta ``model``: its layers, and the embedding or head where it holds them."""
    part = copy.deepcopy(model)
    units = decoder_units(part)
    layers = units[0].parent
    for i, unit in enumerate(units):
        if i not in stage.layers:
            unit.replace(Absent(unit.module))
    base = part.base_model
    for child_name, child in list(_outside(base, layers)):
        if isinstance(child, nn.Embedding):
            if not stage.first:
                setattr(base, child_name, ReceivedEmbedding(child))
        elif not stage.last:
            setattr(base, child_name, nn.Identity())
    if not stage.last:
        for child_name, child in list(part.named_children()):
            if child is not base and any(True for _ in child.parameters()):
                setattr(part, child_name, nn.Identity())
    log.info("pipeline %s (%s)", stage.describe(), type(model).__name__)
    return part


class StageForward:
    """A stage's forward: its input (token ids, or the previous stage's activations) to logits or activations.

    Installed as the stage model's ``forward`` (FSDP's hooks stay on the
    module's call); the token ids and the attention inputs come as keyword
    arguments on every stage, so every stage builds the same masks and
    positions.
    """

    def __init__(self, model: PreTrainedModel, stage: Stage) -> None:
        self.model, self.stage = model, stage
        self.forward: Callable[..., Any] = type(model).forward  # the architecture's own, unbound
        # The stage's first own layer, as wrapped (activation checkpointing, compile) and sharded.
        self.first_layer = decoder_units(model)[0].module

    def install(self) -> None:
        self.model.forward = self

    def __call__(self, x: torch.Tensor, *, tokens: torch.Tensor, **attention: Any) -> torch.Tensor:
        with self._received(x):
            if self.stage.last:
                return self.forward(self.model, input_ids=tokens, use_cache=False, **attention).logits
            return self.model.base_model(input_ids=tokens, use_cache=False, **attention).last_hidden_state

    @contextmanager
    def _received(self, x: torch.Tensor) -> Iterator[None]:
        if self.stage.first:
            yield
            return
        base = self.model.base_model
        embeddings = [m for m in base.children() if isinstance(m, ReceivedEmbedding)]
        for m in embeddings:
            m.like = x

        def hand_over(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if args:
                return (x, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": x}

        handle = self.first_layer.register_forward_pre_hook(hand_over, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()
            for m in embeddings:
                m.like = None
