"""The parallelism section: degrees of model parallelism beside FSDP's data parallelism."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import ApiModel

# The most GPUs one node of any supported instance type holds (p5, p4d: 8).
MAX_TENSOR = 8
# Context ranks one row may be split over (may span nodes).
MAX_CONTEXT = 64
# Expert-parallel ranks: the largest expert counts of 2026's open models (DeepSeek V3, Kimi K2: 256, 384).
MAX_EXPERT = 64
# Pipeline stages: torchtitan's guidance tops out at 8 for 405B-class models; 16 leaves room.
MAX_PIPELINE = 16
# torch.distributed.pipelining's schedules this trainer runs (one stage per rank).
PipelineScheduleName = Literal["1F1B", "GPipe"]


class ParallelismSpec(ApiModel):
    """How each layer's work is split beside FSDP's data parallelism (docs/parallelism.md)."""

    tensor: int = Field(
        default=1,
        ge=1,
        le=MAX_TENSOR,
        description=(
            "Tensor-parallel degree: each decoder block's attention and MLP projections are split over this "
            "many GPUs of one node, with the model's own transformers tensor-parallel plan (base_model_tp_plan); "
            "FSDP shards over the rest (data-parallel size = nodes x gpusPerNode / tensor). It must divide "
            "resources.gpusPerNode and the model's attention heads, key-value heads and MLP width. "
            "1: data parallelism only."
        ),
    )
    context: int = Field(
        default=1,
        ge=1,
        le=MAX_CONTEXT,
        description=(
            "Context-parallel degree: every row of training.seqLen tokens is split over this many ranks (two "
            "chunks each, one early and one late, so causal attention's work is even); each rank computes its "
            "tokens' layers and attends to the whole row's keys and values, gathered per layer, with packed "
            "documents and SFT loss masks kept exactly. FSDP shards over the context ranks too. Needs "
            "training.seqLen set to a multiple of 2 x context. 1: every rank holds whole rows."
        ),
    )
    expert: int = Field(
        default=1,
        ge=1,
        le=MAX_EXPERT,
        description=(
            "Expert-parallel degree for a mixture-of-experts model: each expert layer's experts are split over "
            "this many neighbouring data-parallel ranks (whole experts per rank, the tokens exchanged by two "
            "all-to-alls per layer), with the model's own transformers expert-parallel plan "
            "(base_model_ep_plan); FSDP shards each expert over the rest of the data-parallel ranks, and the "
            "dense layers exactly as without it. It must divide the model's expert count and the data-parallel "
            "ranks FSDP shards over (the shard group under hybrid). 1: every expert sharded by FSDP alone."
        ),
    )
    pipeline: int = Field(
        default=1,
        ge=1,
        le=MAX_PIPELINE,
        description=(
            "Pipeline-parallel degree: the decoder layers are split into this many consecutive stages (the "
            "embedding on the first, the final norm and output head on the last, the layers balanced by their "
            "parameters), one per group of ranks, and each optimizer step's training.gradAccumSteps micro-batches "
            "flow through them with torch's pipeline schedules (parallelism.pipelineSchedule); activations cross "
            "between stages, so stages may span nodes where FSDP's all-gathers would. FSDP shards each stage over "
            "the data-parallel ranks (data-parallel size = nodes x gpusPerNode / (pipeline x tensor)). Needs "
            "training.gradAccumSteps >= pipeline and a model with untied input and output embeddings. "
            "1: every rank holds every layer."
        ),
    )
    pipeline_schedule: PipelineScheduleName = Field(
        default="1F1B",
        description=(
            "The pipeline schedule (torch.distributed.pipelining): 1F1B alternates one micro-batch's forward and "
            "one's backward once the pipeline is full, so at most pipeline micro-batches' activations are held per "
            "stage; GPipe runs every forward, then every backward, holding all gradAccumSteps micro-batches' "
            "activations, with the same idle share. Both leave (pipeline - 1) / (gradAccumSteps + pipeline - 1) of "
            "a step idle per stage: more micro-batches per step shrink it."
        ),
    )
