"""Where a mixture-of-experts model's routers are, and what they chose: for the router health and the aux loss.

transformers declares, for each MoE model, the module whose output carries the
router logits (``_can_record_outputs["router_logits"]``: the hook point its own
``output_router_logits`` uses). Those modules are the routers: a ``...Router``
returning (logits, scores, expert indices), or a bare ``nn.Linear`` gate
returning the logits, whose top-k is then taken here as the model would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

LAYER_NUMBER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


@dataclass(frozen=True)
class Router:
    """One router: its module path, its layer's number, how many experts it picks among and how many per token."""

    name: str
    module: nn.Module
    layer: str
    experts: int
    top_k: int
    logits_index: int  # where the logits are in the module's output tuple

    def outputs(self, output: object) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(logits as tokens x experts, each token's chosen experts) from the module's output; None: not its shape."""
        logits = output[self.logits_index] if isinstance(output, (tuple, list)) else output
        if not isinstance(logits, torch.Tensor):
            return None
        logits = logits.reshape(-1, logits.shape[-1])
        chosen = None
        if isinstance(output, (tuple, list)) and len(output) >= 3:
            candidate = output[2]
            if isinstance(candidate, torch.Tensor) and not candidate.is_floating_point():
                chosen = candidate.detach()  # the router's own choice (DeepSeek's grouped, biased top-k)
        if chosen is None:
            chosen = logits.detach().topk(self.top_k, dim=-1).indices
        return logits, chosen.reshape(-1).long()

    def counts(self, chosen: torch.Tensor) -> torch.Tensor:
        """Tokens per expert (float32); a scatter of ones, not bincount, so a compiled layer keeps its shape."""
        out = torch.zeros(self.experts, device=chosen.device, dtype=torch.float32)
        return out.scatter_add_(0, chosen, torch.ones_like(chosen, dtype=torch.float32))


def _recorder_target(model: nn.Module) -> tuple[type[nn.Module] | None, int, str | None]:
    recorder = (getattr(model, "_can_record_outputs", None) or {}).get("router_logits")
    if recorder is None:
        return None, 0, None
    if isinstance(recorder, type):
        return recorder, 0, None
    return getattr(recorder, "target_class", None), int(getattr(recorder, "index", 0)), recorder.layer_name


def _top_k(module: nn.Module, model: nn.Module) -> int:
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", lambda: config)()
    return int(getattr(module, "top_k", None) or getattr(text, "num_experts_per_tok", 1) or 1)


def find_routers(model: nn.Module) -> list[Router]:
    """The model's routers in module order (none for a dense model)."""
    target, index, layer_name = _recorder_target(model)
    if target is None:
        return []
    found = []
    for i, (name, module) in enumerate(
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, target) and (layer_name is None or n.endswith(layer_name))
    ):
        # A router module names its experts; a bare nn.Linear gate has one output per expert.
        experts = int(getattr(module, "num_experts", None) or getattr(module, "out_features", 0) or 0)
        if experts < 2:
            continue
        numbers = LAYER_NUMBER.findall(name)
        found.append(Router(name, module, numbers[0] if numbers else str(i), experts, _top_k(module, model), index))
    return found
