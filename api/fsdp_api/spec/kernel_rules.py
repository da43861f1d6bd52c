"""The rules of kernels across sections: context parallelism's attention, where FlexAttention and
Liger's fused kernels cannot run, and a mixture of experts' settings on a dense preset."""

from __future__ import annotations

from typing import Any

from ..rules import Rule
from .training import PREFERENCE_OBJECTIVES

_NOT_LIGER = "!has(self.training) || !has(self.training.kernels) || self.training.kernels != 'liger'"
_NOT_FLEX = "!has(self.training) || !has(self.training.packedAttention) || self.training.packedAttention != 'flex'"


_NO_CP = "!has(self.parallelism) || self.parallelism.context == 1"


def _cp(spec: Any) -> int:
    return spec.parallelism.context


def _liger(spec: object) -> bool:
    training = getattr(spec, "training", None)
    return training is not None and training.kernels == "liger"


def _flex(spec: object) -> bool:
    training = getattr(spec, "training", None)
    return training is not None and training.packed_attention == "flex"


def _gpu_ranks_only(wire: str, value: str, unset_cel: str, chosen: Any, why: str, instead: str) -> Rule:
    """``training.<wire>: <value>`` refused on a CPU-only job (resources.gpusPerNode: 0)."""
    return Rule(
        cel=f"{unset_cel} || !has(self.resources) || self.resources.gpusPerNode > 0",
        message=f"training.{wire} {value} needs GPU ranks: {why}; use {instead}",
        field_path=f".training.{wire}",
        check=lambda s: not chosen(s) or s.resources.gpus_per_node > 0,
    )


# On the spec only: a local run's device is known to the trainer, which says the same.
KERNEL_SPEC_RULES: tuple[Rule, ...] = (
    _gpu_ranks_only(
        "kernels",
        "liger",
        _NOT_LIGER,
        _liger,
        "Liger's Triton kernels run on CUDA, so a CPU-only job (resources.gpusPerNode: 0) cannot use them",
        "auto or none",
    ),
    _gpu_ranks_only(
        "packedAttention",
        "flex",
        _NOT_FLEX,
        _flex,
        "FlexAttention has no backward pass on CPU, so a CPU-only job (resources.gpusPerNode: 0) cannot train with it",
        "auto or mask",
    ),
)


# On the spec and on the trainer's own configuration (a local run).
KERNEL_CONFIG_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"!has(self.parallelism) || self.parallelism.tensor == 1 || {_NOT_LIGER}",
        message="training.kernels liger with parallelism.tensor > 1 is not supported: Liger's kernels take whole "
        "local tensors, and tensor parallelism's norms and MLPs hold DTensors; use auto or none",
        field_path=".training.kernels",
        check=lambda s: s.parallelism.tensor == 1 or not _liger(s),
    ),
    Rule(
        cel=f"{_NO_CP} || {_NOT_FLEX}",
        message="training.packedAttention flex with parallelism.context > 1 is not supported: the context-parallel "
        "attention keeps packed documents apart with its own exact mask; use auto or mask",
        field_path=".training.packedAttention",
        check=lambda s: _cp(s) == 1 or not _flex(s),
    ),
)


# A mixture of experts' settings where the model is one of the dense Llama presets.
MOE_CONFIG_RULES: tuple[Rule, ...] = (
    Rule(
        cel=(
            "!has(self.training) || !has(self.training.routerAuxLossCoef) || self.training.routerAuxLossCoef == 0.0"
            " || !has(self.model) || !has(self.model.preset)"
        ),
        message="training.routerAuxLossCoef above 0 needs a mixture-of-experts model: the presets are dense Llama "
        "models, with no routers to balance; leave it at 0",
        field_path=".training.routerAuxLossCoef",
        check=lambda s: s.training is None or s.training.router_aux_loss_coef == 0 or s.model.preset is None,
    ),
)


# --- context parallelism ------------------------------------------------------------

CONTEXT_CONFIG_RULES: tuple[Rule, ...] = (
    Rule(
        cel=(
            f"{_NO_CP} || (has(self.training) && has(self.training.seqLen)"
            " && self.training.seqLen % (2 * self.parallelism.context) == 0)"
        ),
        message="parallelism.context needs training.seqLen set to a multiple of 2 x context: each context rank "
        "holds two equal chunks of every row, one early and one late, so causal attention's work is even",
        field_path=".parallelism.context",
        check=lambda s: (
            _cp(s) == 1
            or (s.training is not None and s.training.seq_len is not None and s.training.seq_len % (2 * _cp(s)) == 0)
        ),
    ),
    Rule(
        cel=f"{_NO_CP} || !has(self.fsdp) || self.fsdp.shardingStrategy != 'no_shard'",
        message="fsdp.shardingStrategy no_shard with parallelism.context > 1 is not supported: FSDP shards over "
        "the context ranks, each of which computes the gradients of its part of the rows; use full, "
        "shard_grad_op or hybrid",
        field_path=".parallelism.context",
        check=lambda s: _cp(s) == 1 or s.fsdp.sharding_strategy != "no_shard",
    ),
    Rule(
        cel=(
            f"{_NO_CP} || !has(self.training) || !has(self.training.objective) || !(self.training.objective in "
            + str(list(PREFERENCE_OBJECTIVES))
            + ")"
        ),
        message="dpo and simpo with parallelism.context > 1 are not supported: they score whole answers, whose "
        "tokens context parallelism spreads over ranks",
        field_path=".parallelism.context",
        check=lambda s: _cp(s) == 1 or s.training is None or not s.training.trains_preferences,
    ),
    *KERNEL_CONFIG_RULES,
    *MOE_CONFIG_RULES,
)
