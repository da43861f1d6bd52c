"""Validation: the held-out batches of this rank, and their mean loss over every rank."""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from fsdp_api.trainer_config import TrainerConfig
from torch import nn
from transformers import PreTrainedTokenizerBase

from .data.loader import validation_batches
from .data.packing import Batch
from .parallel.parallelize import reshard
from .step import ForwardBackward, StepObjective

log = logging.getLogger(__name__)


class Validation:
    def __init__(
        self,
        cfg: TrainerConfig,
        tokenizer: PreTrainedTokenizerBase,
        *,
        seq_len: int,
        dp_rank: int,
        dp_size: int,
        model: nn.Module,
        steps: ForwardBackward,
        objective: StepObjective,
        device: torch.device,
    ) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self.seq_len, self.dp_rank, self.dp_size = seq_len, dp_rank, dp_size
        self.model, self.steps, self.objective, self.device = model, steps, objective, device
        self._batches: list[Batch] | None = None

    def batches(self) -> list[Batch]:
        """This rank's validation batches, tokenized on first use and kept."""
        if self._batches is None:
            t = self.cfg.training
            self._batches = validation_batches(
                self.cfg.data,
                self.tokenizer,
                seq_len=self.seq_len,
                micro_batch_size=t.micro_batch_size,
                eval_steps=t.eval_steps,
                rank=self.dp_rank,
                world_size=self.dp_size,
            )
            if not self._batches:
                log.warning("no validation data (the held-out slice is shorter than one sequence); skipping eval")
        return self._batches

    @torch.no_grad()
    def loss(self) -> float | None:
        """The mean validation loss over every rank's batches (collective); None without validation data."""
        batches = self.batches()
        if not batches:
            return None
        self.model.eval()
        totals = torch.zeros(2, device=self.device, dtype=torch.float64)
        for batch in batches:
            batch = self.steps.local(batch).to(self.device)
            loss, _ = self.steps.forward(batch, self.objective)
            totals[0] += loss.double()
            # Counted where the loss is: a pipeline's earlier stages return none.
            totals[1] += self.objective.count(batch) if self.steps.computes_loss else 0
        self.model.train()
        reshard(self.model)
        dist.all_reduce(totals)
        return (totals[0] / totals[1]).item()
