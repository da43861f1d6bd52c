"""Router health of a mixture-of-experts model: how evenly each layer's router spreads the tokens.

A router that sends most tokens to a few experts (a collapse) wastes the
others and, with expert parallelism, makes one rank the straggler; it does not
show in the loss until late. The probe hooks the model's routers
(``model/routers.py``) and, per layer, counts the tokens each expert is given
and sums the router's softmax probabilities; the train step all-reduces those
sums once with its other figures (``StepReductions``).

What comes out, per layer and over every rank's tokens of the step:
the most- and least-loaded expert's tokens over the mean per expert (1 is
even), the share of experts that got no token, and the load-balancing loss
of Switch Transformer as transformers' ``load_balancing_loss_func`` computes
it (``top_k`` when even). Ratios of summed counts do not change when a
model-parallel peer repeats its ranks' tokens or activation checkpointing runs a
router twice, as every count of the layer doubles alike.
Not counted apart: padding tokens, which the router sees like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..model.routers import find_routers


@dataclass(frozen=True)
class LayerLoad:
    layer: str
    max_ratio: float  # the most-loaded expert's tokens over the mean per expert
    min_ratio: float  # the least-loaded expert's tokens over the mean per expert
    unused_ratio: float  # share of the layer's experts that got no token
    aux_loss: float  # Switch Transformer's load-balancing loss: top_k when even


@dataclass(frozen=True)
class RouterStats:
    layers: tuple[LayerLoad, ...]

    @property
    def worst_max_ratio(self) -> float:
        return max(lay.max_ratio for lay in self.layers)

    @property
    def worst_min_ratio(self) -> float:
        return min(lay.min_ratio for lay in self.layers)

    @property
    def worst_unused_ratio(self) -> float:
        return max(lay.unused_ratio for lay in self.layers)

    @property
    def mean_aux_loss(self) -> float:
        return sum(lay.aux_loss for lay in self.layers) / len(self.layers)


class RouterProbe:
    """Hooks on a model's routers that sum each layer's expert load on the device until ``take``."""

    def __init__(self, model: nn.Module | None, device: torch.device) -> None:
        """``model`` None: no probe (every figure empty)."""
        self.layers = find_routers(model) if model is not None else []
        # Per expert of every layer: tokens given to it, then the summed softmax probability.
        self._offsets = [sum(r.experts for r in self.layers[:i]) for i in range(len(self.layers))]
        self._sums = torch.zeros(2 * sum(r.experts for r in self.layers), device=device, dtype=torch.float32)
        self._handles = [r.module.register_forward_hook(self._hook(i)) for i, r in enumerate(self.layers)]

    @property
    def enabled(self) -> bool:
        return bool(self.layers)

    @property
    def width(self) -> int:
        """How many floats ``take`` returns (the all-reduce slot's size)."""
        return int(self._sums.numel())

    def _hook(self, slot: int) -> Callable[[nn.Module, object, object], None]:
        router = self.layers[slot]
        start, experts = self._offsets[slot], router.experts

        def record(module: nn.Module, args: object, output: object) -> None:
            with torch.no_grad():
                found = router.outputs(output)
                if found is None:
                    return
                logits, chosen = found
                half = self.width // 2
                self._sums[start : start + experts] += router.counts(chosen)
                self._sums[half + start : half + start + experts] += logits.detach().float().softmax(dim=-1).sum(0)

        return record

    def reset(self) -> None:
        self._sums.zero_()

    def take(self) -> torch.Tensor:
        """The sums since the last reset (for the step's all-reduce), and a fresh start."""
        out = self._sums.clone()
        self._sums.zero_()
        return out

    def stats(self, summed: Sequence[float]) -> RouterStats | None:
        """Each layer's load from the all-reduced sums of every rank (None: no token was routed)."""
        if not self.layers:
            return None
        width = len(summed) // 2
        loads = []
        for lay, start in zip(self.layers, self._offsets, strict=True):
            counts = list(summed[start : start + lay.experts])
            probs = list(summed[width + start : width + start + lay.experts])
            routed = sum(counts)
            if routed <= 0:
                return None
            tokens = routed / lay.top_k
            mean = routed / lay.experts
            # transformers' load_balancing_loss_func: experts x sum over experts of
            # (the share of tokens sent to it) x (its mean router probability).
            aux = lay.experts * sum((c / tokens) * (p / tokens) for c, p in zip(counts, probs, strict=True))
            loads.append(
                LayerLoad(
                    layer=lay.layer,
                    max_ratio=max(counts) / mean,
                    min_ratio=min(counts) / mean,
                    unused_ratio=sum(1 for c in counts if c == 0) / lay.experts,
                    aux_loss=aux,
                )
            )
        return RouterStats(tuple(loads))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
