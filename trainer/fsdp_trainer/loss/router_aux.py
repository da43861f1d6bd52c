"""``training.routerAuxLossCoef``: a mixture of experts' load-balancing loss, added to the training loss.

The loss transformers adds when a model is called with ``output_router_logits``
(Switch Transformer's, ``load_balancing_loss_func`` without an attention
mask): over every MoE layer's tokens of a forward pass at once,
``experts x sum over experts of (share of the top-k choices it got) x (its mean
router probability)``. It is ``top_k`` when the routers spread the tokens
evenly, and its gradient pushes the router probabilities of the overloaded
experts down.

Hooks on the routers collect, during the policy's forward of a training
micro-batch only, each expert's count (no gradient) and summed softmax
probability (with its gradient). They compute the same differentiable ops on
every call, including an activation-checkpointing recompute in the backward
(which checks that a recompute saves what the forward saved), and keep the
result only while a training forward is being captured.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import ConfigError
from ..model.routers import Router, find_routers

FIELD = "training.routerAuxLossCoef"


def router_aux_errors(model: nn.Module, coef: float) -> list[str]:
    """Why ``coef`` cannot apply to ``model`` (the check on the meta model, before any rank starts); [] if it can."""
    return _errors(model, find_routers(model)) if coef > 0 else []


def _errors(model: nn.Module, routers: list[Router]) -> list[str]:
    if not routers:
        return [
            f"{FIELD}: {type(model).__name__} has no mixture-of-experts routers, so there is no load to balance: "
            "leave it at 0"
        ]
    widths = sorted({r.experts for r in routers})
    if len(widths) > 1:
        return [
            f"{FIELD}: the model's MoE layers route among {widths} experts; the load-balancing loss needs one "
            "number of experts in every layer"
        ]
    return []


class RouterAuxLoss:
    def __init__(self, model: nn.Module, coef: float, device: torch.device) -> None:
        self.coef = coef
        self.routers = find_routers(model)
        if errors := _errors(model, self.routers):
            raise ConfigError(errors)
        self.experts = self.routers[0].experts
        self._capturing = False
        self._counts = torch.zeros(self.experts, device=device, dtype=torch.float32)
        self._probs: torch.Tensor | None = None
        self._tokens = 0
        self._handles = [r.module.register_forward_hook(self._hook(r)) for r in self.routers]

    def _hook(self, router: Router) -> Callable[[nn.Module, object, object], None]:
        def record(module: nn.Module, args: object, output: object) -> None:
            found = router.outputs(output)
            if found is None:
                return
            logits, chosen = found
            if not logits.requires_grad:  # a frozen reference's forward, validation, generation
                return
            probs = logits.float().softmax(dim=-1).sum(dim=0)  # the same ops on a recompute
            if not self._capturing:
                return
            self._counts += router.counts(chosen)
            self._probs = probs if self._probs is None else self._probs + probs
            self._tokens += logits.shape[0]

        return record

    def begin(self) -> None:
        """Collect the routers of the training forward that follows."""
        self._capturing, self._probs, self._tokens = True, None, 0
        self._counts.zero_()

    def end(self) -> torch.Tensor | None:
        """The captured forward's load-balancing loss with its gradient, times the coefficient; None: no router ran."""
        self._capturing = False
        probs, tokens, self._probs = self._probs, self._tokens, None
        if probs is None or tokens == 0:
            return None
        return self.coef * self.experts * torch.sum((self._counts / tokens) * (probs / tokens))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
