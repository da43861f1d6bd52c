"""What to change in a spec that does not fit its GPUs: the memory plan's suggestion.

Candidate changes in the order they are preferred (cheapest in speed and cost
first: the loss's buffers, activation checkpointing, sharding, smaller
micro-batches, more context, tensor or pipeline parallelism, more nodes, CPU offload),
each one judged by the plan (``memory_plan.plan_memory`` passes its verdict in,
so this module needs none of the estimate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .parallel_plan import ParallelPlan
from .spec import MAX_NODES, MAX_PIPELINE, PIPELINE_CONFIG_RULES, FSDPTrainingSpec


def _training(spec: FSDPTrainingSpec, **changes: Any) -> FSDPTrainingSpec:
    return spec.model_copy(update={"training": spec.builtin_training.model_copy(update=changes)})


def _fsdp(spec: FSDPTrainingSpec, **changes: Any) -> FSDPTrainingSpec:
    return spec.model_copy(update={"fsdp": spec.fsdp.model_copy(update=changes)})


def _nodes(spec: FSDPTrainingSpec, nodes: int) -> FSDPTrainingSpec:
    return spec.model_copy(update={"resources": spec.resources.model_copy(update={"nodes": nodes})})


def _parallelism(spec: FSDPTrainingSpec, **degrees: int) -> FSDPTrainingSpec:
    return spec.model_copy(update={"parallelism": spec.parallelism.model_copy(update=degrees)})


def context_degrees(spec: FSDPTrainingSpec) -> list[int]:
    """Context-parallel degrees above the current one that the spec's rules would accept (powers of 2)."""
    training = spec.builtin_training
    seq = training.seq_len
    if seq is None or training.trains_preferences or spec.fsdp.sharding_strategy == "no_shard":
        return []
    if spec.parallelism.pipeline > 1:  # not beside pipeline stages (spec.pipeline_rules)
        return []
    world, tp = spec.world_size(), spec.parallelism.tensor
    out, degree = [], spec.parallelism.context * 2
    while degree <= world // tp:
        if world % (tp * degree) == 0 and seq % (2 * degree) == 0:
            out.append(degree)
        degree *= 2
    return out


def tensor_degrees(spec: FSDPTrainingSpec) -> list[int]:
    """Tensor-parallel degrees above the current one that the spec's rules would accept."""
    dims = spec.model.dims() if spec.model is not None else None
    gpus = spec.resources.gpus_per_node
    if dims is None or spec.peft is not None or spec.fsdp.cpu_offload or spec.builtin_training.precision == "float8":
        return []
    sizes = (dims.num_heads, dims.num_key_value_heads, dims.intermediate_size)
    others = spec.parallelism.pipeline * spec.parallelism.context  # what else divides the world
    return [
        t
        for t in range(spec.parallelism.tensor + 1, gpus + 1)
        if gpus % t == 0 and all(n % t == 0 for n in sizes) and spec.world_size() % (t * others) == 0
    ]


def pipeline_changes(spec: FSDPTrainingSpec) -> list[tuple[str, FSDPTrainingSpec]]:
    """More pipeline stages than now, each as the spec's rules accept it (at least one micro-batch per stage:
    the micro-batch split to keep the global batch where it divides, else more of them)."""
    dims = spec.model.dims() if spec.model is not None else None
    if dims is None or dims.tie_word_embeddings:
        return []
    t, par, world = spec.builtin_training, spec.parallelism, spec.world_size()
    out = []
    for degree in range(par.pipeline + 1, min(MAX_PIPELINE, dims.num_layers) + 1):
        if world % (degree * par.tensor * par.context):
            continue
        text, training = f"set parallelism.pipeline: {degree}", {}
        if t.grad_accum_steps < degree:
            rows = t.micro_batch_size * t.grad_accum_steps
            if rows % degree == 0:
                training = {"micro_batch_size": rows // degree, "grad_accum_steps": degree}
                text += f" (and microBatchSize: {rows // degree}, gradAccumSteps: {degree}: the same global batch)"
            else:
                training = {"grad_accum_steps": degree}
                text += f" (and gradAccumSteps: {degree}, a larger global batch)"
        candidate = _parallelism(_training(spec, **training) if training else spec, pipeline=degree)
        if all(rule.check(candidate) for rule in PIPELINE_CONFIG_RULES):
            out.append((text, candidate))
    return out


def _candidates(spec: FSDPTrainingSpec) -> list[tuple[str, FSDPTrainingSpec]]:
    """Single changes, in the order they are preferred (cheapest in speed and cost first)."""
    t, f = spec.builtin_training, spec.fsdp
    out: list[tuple[str, FSDPTrainingSpec]] = []
    # First: the loss's buffers, which cost no recompute and keep the batch.
    if t.logits == "full":
        out.append(("set training.logits: chunked", _training(spec, logits="chunked")))
    # By recompute cost: op recomputes only the cheap ops of each layer, selective half the layers whole.
    order = ("none", "op", "selective", "full")
    for mode in order[order.index(t.activation_checkpointing) + 1 :]:
        out.append((f"set training.activationCheckpointing: {mode}", _training(spec, activation_checkpointing=mode)))
    if f.sharding_strategy != "full" and spec.world_size() > 1:
        out.append(("set fsdp.shardingStrategy: full", _fsdp(spec, sharding_strategy="full", shard_group_size=None)))
    mbs = t.micro_batch_size // 2
    while mbs >= 1:
        factor = t.micro_batch_size // mbs
        out.append(
            (
                f"set training.microBatchSize: {mbs} (and gradAccumSteps: {t.grad_accum_steps * factor} "
                "to keep the global batch)",
                _training(spec, micro_batch_size=mbs, grad_accum_steps=t.grad_accum_steps * factor),
            )
        )
        out.append((f"set training.microBatchSize: {mbs}", _training(spec, micro_batch_size=mbs)))
        mbs //= 2
    for degree in context_degrees(spec):
        out.append((f"set parallelism.context: {degree}", _parallelism(spec, context=degree)))
    for degree in tensor_degrees(spec):
        out.append((f"set parallelism.tensor: {degree}", _parallelism(spec, tensor=degree)))
    out.extend(pipeline_changes(spec))
    if ParallelPlan.for_spec(spec).shards_over_all_dp_ranks:
        for nodes in range(spec.resources.nodes + 1, MAX_NODES + 1):
            out.append((f"set resources.nodes: {nodes}", _nodes(spec, nodes)))
    if not f.cpu_offload and spec.resources.gpus_per_node > 0:
        out.append(("set fsdp.cpuOffload: true", _fsdp(spec, cpu_offload=True)))
    return out


def _combined(spec: FSDPTrainingSpec) -> list[tuple[str, FSDPTrainingSpec]]:
    """The same changes applied one on top of the other, strongest of each kind."""
    steps = [
        ("training.logits: chunked", lambda s: _training(s, logits="chunked")),
        ("training.activationCheckpointing: full", lambda s: _training(s, activation_checkpointing="full")),
        ("fsdp.shardingStrategy: full", lambda s: _fsdp(s, sharding_strategy="full", shard_group_size=None)),
        ("training.microBatchSize: 1", lambda s: _training(s, micro_batch_size=1)),
    ]
    out, current, names = [], spec, []
    for name, change in steps:
        current = change(current)
        names.append(name)
        out.append((", ".join(names), current))
    for nodes in range(spec.resources.nodes + 1, MAX_NODES + 1):
        out.append((", ".join([*names, f"resources.nodes: {nodes}"]), _nodes(current, nodes)))
    return out


def suggest(spec: FSDPTrainingSpec, fits: Callable[[FSDPTrainingSpec], bool]) -> str:
    """The first single change after which ``fits`` (the plan's verdict on a spec) holds; else the fewest together."""
    for text, candidate in _candidates(spec):
        if fits(candidate):
            return text
    for text, candidate in _combined(spec):
        if fits(candidate):
            return f"no single change fits; together: set {text}"
    return "no combination of these changes fits: use GPUs with more memory"
