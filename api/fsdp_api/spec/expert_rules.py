"""The rules of expert parallelism (``parallelism.expert``) across sections.

Checked on the spec (so ``validate`` and the API server refuse the same
layouts) and again on the trainer's config. What needs the model's own
config (its expert count, its expert-parallel plan) is checked by the
trainer when it builds the model (``fsdp_trainer.parallel.expert_parallel``).
"""

from __future__ import annotations

from typing import Any

from ..rules import Rule

_NO_EP = "!has(self.parallelism) || self.parallelism.expert == 1"


def _ep(spec: Any) -> int:
    return spec.parallelism.expert


EXPERT_CONFIG_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"{_NO_EP} || self.parallelism.tensor == 1",
        message="parallelism.expert with parallelism.tensor > 1 is not supported yet: the tensor-parallel peers "
        "share one batch, which the experts' all-to-all would have to split between them; use one of the two",
        field_path=".parallelism.expert",
        check=lambda s: _ep(s) == 1 or s.parallelism.tensor == 1,
    ),
    Rule(
        cel=f"{_NO_EP} || !has(self.fsdp) || self.fsdp.shardingStrategy != 'no_shard'",
        message="fsdp.shardingStrategy no_shard with parallelism.expert > 1 is not supported: expert parallelism "
        "splits each expert layer over the ranks FSDP shards over, and no_shard shards over none; use full, "
        "shard_grad_op or hybrid",
        field_path=".parallelism.expert",
        check=lambda s: _ep(s) == 1 or s.fsdp.sharding_strategy != "no_shard",
    ),
    Rule(
        cel=f"{_NO_EP} || !has(self.model) || !has(self.model.preset)",
        message="parallelism.expert above 1 needs a mixture-of-experts model: the presets are dense Llama models, "
        "with no experts to split; leave it at 1",
        field_path=".parallelism.expert",
        check=lambda s: _ep(s) == 1 or s.model.preset is None,
    ),
)

_GPUS_CEL = "(has(self.resources) ? self.resources.gpusPerNode : 8)"
_WORLD_CEL = f"((has(self.resources) ? self.resources.nodes : 1) * ({_GPUS_CEL} > 0 ? {_GPUS_CEL} : 1))"

# On the spec only: a local run's world is the launch's, which the parallel plan checks.
EXPERT_SPEC_RULES: tuple[Rule, ...] = (
    Rule(
        cel=f"{_NO_EP} || {_WORLD_CEL} % self.parallelism.expert == 0",
        message="parallelism.expert must divide resources.nodes x gpusPerNode: each expert layer is split over "
        "that many of the data-parallel ranks",
        field_path=".parallelism.expert",
        check=lambda s: s.world_size() % _ep(s) == 0,
    ),
    Rule(
        cel=(
            f"{_NO_EP} || !has(self.fsdp) || self.fsdp.shardingStrategy != 'hybrid' || "
            f"(has(self.fsdp.shardGroupSize) ? self.fsdp.shardGroupSize : {_GPUS_CEL}) % self.parallelism.expert == 0"
        ),
        message="with fsdp.shardingStrategy hybrid, parallelism.expert must divide the shard group "
        "(fsdp.shardGroupSize, by default resources.gpusPerNode): the experts are split inside one group",
        field_path=".parallelism.expert",
        check=lambda s: (
            _ep(s) == 1
            or s.fsdp.sharding_strategy != "hybrid"
            or (s.fsdp.shard_group_size or s.resources.gpus_per_node) % _ep(s) == 0
        ),
    ),
)
