"""Router health of a mixture-of-experts model: how evenly each layer's router spreads the tokens.

A router that sends most tokens to a few experts (a collapse) wastes the
others and, with expert parallelism, makes one rank the straggler; it does not
show in the loss until late. transformers declares, for each MoE model, the
module whose output carries the router logits (``_can_record_outputs
["router_logits"]``, the same hook point its ``output_router_logits`` uses).
The probe hooks those modules and, per layer, counts the tokens each expert
is given (the router's own top-k choice where it returns it, else the top-k
of its logits) and sums the router's softmax probabilities; the train step
all-reduces those sums once with its other figures (``StepReductions``).

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

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

LAYER_NUMBER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


@dataclass(frozen=True)
class RouterLayer:
    """One hooked router: its layer's label and how many experts it chooses among, and how many per token."""

    name: str
    layer: str
    experts: int
    top_k: int


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


def _recorder_target(model: nn.Module) -> tuple[type[nn.Module] | None, int, str | None]:
    """The class whose output holds the router logits, at which index, on which submodule (transformers' own)."""
    recorder = (getattr(model, "_can_record_outputs", None) or {}).get("router_logits")
    if recorder is None:
        return None, 0, None
    if isinstance(recorder, type):
        return recorder, 0, None
    return getattr(recorder, "target_class", None), int(getattr(recorder, "index", 0)), recorder.layer_name


def _layer_label(name: str, fallback: int) -> str:
    found = LAYER_NUMBER.findall(name)
    return found[0] if found else str(fallback)


def _top_k(module: nn.Module, model: nn.Module) -> int:
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", lambda: config)()
    return int(getattr(module, "top_k", None) or getattr(text, "num_experts_per_tok", 1) or 1)


class RouterProbe:
    """Hooks on a model's routers that sum each layer's expert load on the device until ``take``."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        target, self.index, layer_name = _recorder_target(model)
        found: list[tuple[str, nn.Module]] = []
        if target is not None:
            found = [
                (name, m)
                for name, m in model.named_modules()
                if isinstance(m, target) and (layer_name is None or name.endswith(layer_name))
            ]
        self.layers: list[RouterLayer] = []
        self._handles = []
        for i, (name, module) in enumerate(found):
            # A router module names its experts; a bare nn.Linear gate has one output per expert.
            experts = int(getattr(module, "num_experts", None) or getattr(module, "out_features", 0) or 0)
            if experts < 2:
                continue
            slot = len(self.layers)
            self.layers.append(RouterLayer(name, _layer_label(name, i), experts, _top_k(module, model)))
            self._handles.append(module.register_forward_hook(self._hook(slot)))
        self.device = device
        width = sum(lay.experts for lay in self.layers)
        # Per expert of every layer: tokens given to it, then the summed softmax probability.
        self._sums = torch.zeros(2 * width, device=device, dtype=torch.float32)
        self._offsets = [sum(lay.experts for lay in self.layers[:i]) for i in range(len(self.layers))]

    @property
    def enabled(self) -> bool:
        return bool(self.layers)

    @property
    def width(self) -> int:
        """How many floats ``take`` returns (the all-reduce slot's size)."""
        return int(self._sums.numel())

    def _hook(self, slot: int) -> Callable[[nn.Module, object, object], None]:
        def record(module: nn.Module, args: object, output: object) -> None:
            logits = output[self.index] if isinstance(output, (tuple, list)) else output
            if not isinstance(logits, torch.Tensor):
                return
            layer = self.layers[slot]
            with torch.no_grad():
                logits = logits.detach().reshape(-1, logits.shape[-1]).float()
                chosen = None
                if isinstance(output, (tuple, list)) and len(output) >= 3:
                    candidate = output[2]
                    if isinstance(candidate, torch.Tensor) and not candidate.is_floating_point():
                        chosen = candidate.detach()
                if chosen is None:
                    chosen = logits.topk(layer.top_k, dim=-1).indices
                # A scatter of ones, not bincount: its output's shape is known, so a compiled layer keeps it.
                flat = chosen.reshape(-1).long()
                counts = torch.zeros(layer.experts, device=flat.device).scatter_add_(
                    0, flat, torch.ones_like(flat, dtype=torch.float32)
                )
                start, width = self._offsets[slot], self.width // 2
                self._sums[start : start + layer.experts] += counts
                probs = logits.softmax(dim=-1).sum(dim=0)
                self._sums[width + start : width + start + layer.experts] += probs

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
