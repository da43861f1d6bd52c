"""The step of a pipelined model: the micro-batches through the stages with torch's pipeline schedule.

The step's ``gradAccumSteps`` micro-batches are the schedule's micro-batches,
handed over as they are (no re-chunking): the first stage gets their token
ids, the last their labels, and every stage their ids and attention inputs
as keyword arguments, so each stage builds the same positions and masks
(``parallel.pipeline.StageForward``). The last stage computes each
micro-batch's summed token loss from its logits, divided by the step's
divisor as in the other strategies; the schedule runs the backward of that,
and torch's stage defers FSDP's gradient reduction to the last micro-batch.
The schedule's own gradient scaling is off: the divisor already makes the
gradient that of the mean over the global batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from fsdp_api.parallel_plan import PP
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from ..build import Prepared
from ..data.attention import PackedAttention
from ..data.packing import Batch
from ..loss import ModelCall
from ..loss.head import token_loss_sum
from ..parallel.parallelize import compute_context
from ..parallel.pipeline import Stage
from .forward_backward import Objective, PlainStep

log = logging.getLogger(__name__)

SCHEDULES: dict[str, type[PipelineScheduleSingle]] = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe}


def pipeline_strategy(p: Prepared, model: nn.Module, packed: PackedAttention | None) -> PipelineStep:
    """The pipeline step of this rank's stage (``p.stage``), on the mesh's pipeline dimension."""
    assert p.stage is not None and p.mesh is not None  # a pipeline of several stages shards each with FSDP
    training, schedule = p.cfg.training, p.cfg.parallelism.pipeline_schedule
    accum = training.grad_accum_steps
    log.info(
        "pipeline: %s, schedule %s over %d micro-batches per step (each stage idle %.0f%% of a step)",
        p.stage.describe(), schedule, accum, 100 * idle_share(p.stage.count, accum),
    )  # fmt: skip
    group = p.mesh[PP].get_group()
    return PipelineStep(model, p.stage, group, schedule, accum, training.precision, p.world.device, packed)


def idle_share(stages: int, micro_batches: int) -> float:
    """The share of a step each stage waits with one stage per rank (1F1B and GPipe alike): (p - 1) / (m + p - 1)."""
    return (stages - 1) / (micro_batches + stages - 1)


class PipelineStep(PlainStep):
    """This rank's stage of the model, run by the pipeline schedule over the step's micro-batches.

    Every row whole on its data-parallel rank, as in ``PlainStep`` (whose ``local``, ``layout`` and
    ``attention`` it keeps); the model is called by the schedule, stage by stage.
    """

    def __init__(
        self,
        model: nn.Module,
        stage: Stage,
        group: ProcessGroup,
        schedule: str,
        micro_batches: int,
        precision: str,
        device: torch.device,
        packed: PackedAttention | None,
    ) -> None:
        super().__init__(model, precision, device, packed)
        self.stage = stage
        self._divisor: float | torch.Tensor = 1.0
        self.group = group
        pipeline_stage = PipelineStage(model, stage.index, stage.count, device, group=group)
        self.schedule = SCHEDULES[schedule](pipeline_stage, micro_batches, loss_fn=self._loss, scale_grads=False)
        self._validation: ScheduleGPipe | None = None  # built at the first validation batch

    @property
    def computes_loss(self) -> bool:
        """Whether this rank's forward returns the loss (the last stage's ranks) or zero."""
        return self.stage.last

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(logits, labels) / self._divisor

    def call(self, batch: Batch) -> ModelCall:
        raise NotImplementedError("a pipelined model runs through its schedule only (parallelism.pipeline)")

    def forward(self, batch: Batch, objective: Objective) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One validation batch's summed token loss through the stages (no backward); zero but on the last stage."""
        if self._validation is None:
            # Its own stage object: a forward-only schedule of one micro-batch per call, any batch count.
            stage = PipelineStage(self.model, self.stage.index, self.stage.count, self.device, group=self.group)
            self._validation = ScheduleGPipe(stage, 1, loss_fn=token_loss_sum)
        losses: list[torch.Tensor] = []
        with compute_context(self.model, self.precision, self.device):
            self._validation.eval(
                arg_mbs=[(batch.inputs,)] if self.stage.first else None,
                kwarg_mbs=[{"tokens": batch.inputs, **self.attention(batch)}],
                target_mbs=[batch.labels] if self.stage.last else None,
                losses=losses,
            )
        loss = losses[0].detach().float() if losses else torch.zeros((), device=self.device, dtype=torch.float32)
        return loss, None

    def forward_backward(
        self, batches: Sequence[Batch], objective: Objective, divisor: float | torch.Tensor, pair_stats: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's micro-batches through the schedule; (this stage's loss sum: zero but on the last, no pairs)."""
        self._divisor = divisor
        losses: list[torch.Tensor] = []
        with compute_context(self.model, self.precision, self.device):
            self.schedule.step(
                arg_mbs=[(b.inputs,) for b in batches] if self.stage.first else None,
                kwarg_mbs=[{"tokens": b.inputs, **self.attention(b)} for b in batches],
                target_mbs=[b.labels for b in batches] if self.stage.last else None,
                losses=losses,
                return_outputs=False,
            )
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        for loss in losses:
            loss_sum += loss.detach().float()
        return loss_sum, torch.zeros(pair_stats, device=self.device, dtype=torch.float32)
