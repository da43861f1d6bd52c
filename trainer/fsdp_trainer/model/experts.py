"""``model.expertsImplementation``: which of transformers' kernels runs a mixture-of-experts model's experts.

transformers 5 runs every MoE model's experts through one interface
(``transformers.integrations.moe``, ``@use_experts_implementation``): a grouped
GEMM over all experts' tokens (``grouped_mm``, its default where the model can
dispatch it), a batched matmul over each token's gathered experts
(``batched_mm``), or the model's own loop over experts (``eager``). The
trainer passes the user's choice on, checks that the model has experts at
all, and says in the log which one a run uses, so a slow MoE run is not a
guess.
"""

from __future__ import annotations

import logging

from torch import nn
from transformers import PretrainedConfig

from ..errors import ConfigError

log = logging.getLogger(__name__)

FIELD = "model.expertsImplementation"


def request_experts(config: PretrainedConfig, requested: str | None) -> None:
    """Ask transformers for ``requested`` when the model is built (its config's setter reaches the sub-configs)."""
    if requested is not None:
        config._experts_implementation = requested


def experts_modules(model: nn.Module) -> list[str]:
    """The names of the model's experts modules (transformers names their classes ``...Experts``)."""
    return [name for name, m in model.named_modules() if type(m).__name__.endswith("Experts")]


def check_experts(model: nn.Module, requested: str | None) -> str | None:
    """The implementation the built model runs (None without experts); a request for a dense model is refused."""
    if not experts_modules(model):
        if requested is not None:
            raise ConfigError(
                [
                    f"{FIELD}: {type(model).__name__} has no mixture-of-experts layers, so there is no experts kernel "
                    "to choose: leave it unset"
                ]
            )
        return None
    config = getattr(model, "config", None)
    chosen = str(getattr(config, "_experts_implementation", None) or "eager")
    why = f"{FIELD}: {requested}" if requested else "transformers' default for this model"
    log.info("experts: %s (%s; %d experts modules)", chosen, why, len(experts_modules(model)))
    return chosen
