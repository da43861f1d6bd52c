"""Expert parallelism (``parallelism.expert``) from the model's own transformers plan (``base_model_ep_plan``).

transformers 5 declares, for some 70 mixture-of-experts architectures, how
their experts split: each experts module's 3-D weights (``gate_up_proj``,
``down_proj``: experts first) are cut along the expert dimension
(``grouped_gemm``) and the module itself reaches its experts through a token
dispatch (``ep_dispatch_experts``): every rank sends each (token, chosen
expert) pair to the rank holding that expert by one all-to-all and gets the
outputs back by a second, weighted by the router on the sender
(``transformers.distributed.expert_parallel``). This module applies that plan
with transformers' own styles, so routers, shared experts and dense first
layers stay as each model defines them and only the routed experts move.

The split goes on the meta model before activation checkpointing, compile
and ``fully_shard``, like tensor parallelism. FSDP then shards each experts
module over the rest of its group (``efsdp``) and the dense layers over the
usual data-parallel mesh (``parallelize.apply_fsdp``). An expert's gradient
sums the tokens of all ``ep x efsdp`` ranks (the all-to-all's backward brings
every routed token's gradient to the expert's rank), so it is divided by
their count, as a dense layer's average over the same ranks is.

Checkpoints keep the model's own parameter names and whole-model shapes (a
DTensor per expert weight), so DCP reshards a run written with expert 2 to
expert 1 or 4 on resume, and the export gathers whole tensors.
"""

from __future__ import annotations

import logging
import re

import transformers
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from transformers import PreTrainedModel

from ..model.experts import experts_modules

log = logging.getLogger(__name__)

FIELD = "parallelism.expert"
# transformers' two expert-parallel styles: the weights' split and the module's token dispatch.
WEIGHT_STYLE = "grouped_gemm"
DISPATCH_STYLE = "ep_dispatch_experts"
STYLES = (WEIGHT_STYLE, DISPATCH_STYLE)
# Set on each dispatched experts module, so FSDP finds them after checkpoint wrappers renamed the tree.
EXPERT_PARALLEL_MARK = "_fsdp_expert_parallel"


def ep_plan(model: nn.Module) -> dict[str, str]:
    """The model's expert-parallel plan (patterns relative to ``model``, ``*`` for layer numbers); empty without."""
    plan = getattr(model, "ep_plan", None)
    return dict(plan or {}) if isinstance(plan, dict) else {}


def expand_plan(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """One entry per parameter or module of ``model`` that a pattern names (a ``*`` matches a layer number).

    Parameters come first: sharding an experts module's weights sets its per-rank expert count, which its
    token dispatch reads when it is installed.
    """
    patterns = [(re.compile(re.escape(p).replace(r"\*", r"\d+")), style) for p, style in plan.items()]
    names = [name for name, _ in model.named_parameters()] + [name for name, _ in model.named_modules()]
    return {name: style for name in names for pattern, style in patterns if pattern.fullmatch(name)}


def expert_count(model: nn.Module) -> int | None:
    """The routed experts per layer (the first dimension of the experts' weights); None without experts."""
    for name in experts_modules(model):
        weights = [p for p in model.get_submodule(name).parameters(recurse=False) if p.dim() == 3]
        if weights:
            return int(weights[0].shape[0])
    return None


def expert_parallel_errors(model: PreTrainedModel, degree: int) -> list[str]:
    """Why ``model``'s experts cannot be split over ``degree`` ranks (one line each); empty when they can."""
    if degree == 1:
        return []
    name = type(model).__name__
    if not experts_modules(model):
        return [f"{FIELD}: {name} has no mixture-of-experts layers, so there are no experts to split: leave it at 1"]
    plan = ep_plan(model)
    if not plan:
        return [
            f"{FIELD}: {name} declares no expert-parallel plan in transformers {transformers.__version__} "
            "(its config's base_model_ep_plan is empty), so its experts cannot be split; use 1"
        ]
    other = sorted({style for style in plan.values() if style not in STYLES})
    if other or DISPATCH_STYLE not in plan.values():
        return [
            f"{FIELD}: {name}'s expert-parallel plan uses {', '.join(sorted(set(plan.values())))}; this trainer "
            f"applies {' with '.join(STYLES)}; use 1"
        ]
    experts = expert_count(model)
    if experts is not None and experts % degree:
        return [
            f"{FIELD}: {degree} does not divide {name}'s {experts} experts per layer: each rank holds whole experts"
        ]
    return []


def apply_expert_parallel(model: PreTrainedModel, ep_mesh: DeviceMesh, batch_mesh: DeviceMesh) -> int:
    """Split the model's experts over ``ep_mesh``; returns how many experts modules now dispatch their tokens.

    ``batch_mesh`` is the group of ranks that hold the same batch (transformers' TP group): one rank each
    here, since tensor parallelism is refused beside expert parallelism.
    """
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    experts = expert_count(model)
    plan = expand_plan(model, ep_plan(model))
    apply_expert_parallelism(model, ep_mesh, batch_mesh, plan, ep_implementation="all_to_all")
    dispatched = [model.get_submodule(name) for name, style in plan.items() if style == DISPATCH_STYLE]
    for module in dispatched:
        setattr(module, EXPERT_PARALLEL_MARK, True)
    log.info(
        "expert parallel: %d experts modules split over %d ranks (%s: %s experts per layer, %d on each rank; "
        "tokens exchanged by all-to-all)",
        len(dispatched),
        ep_mesh.size(),
        type(model).__name__,
        experts,
        (experts or 0) // ep_mesh.size(),
    )
    return len(dispatched)


def expert_parallel_modules(model: nn.Module) -> list[nn.Module]:
    """The experts modules ``apply_expert_parallel`` split (each gets its own FSDP group on the experts' mesh)."""
    return [m for m in model.modules() if getattr(m, EXPERT_PARALLEL_MARK, False)]
