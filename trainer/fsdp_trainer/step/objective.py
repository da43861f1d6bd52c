"""What a micro-batch's loss is and what it is a sum over: the token loss, or a preference objective's pairs.

The forward/backward strategies call the objective on each micro-batch; the
step asks it what each micro-batch's summed loss is divided by, so that the
gradient is that of the mean over every trained token (or pair) of the global
batch whatever the ranks hold.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from ..build import Prepared, build_reference
from ..data.packing import Batch
from ..loss import ChunkedHead, FullLogits, ModelCall, OutputLoss, output_loss
from ..loss.preference import STATS, PreferenceLoss, count_pairs, lora_reference, model_reference
from ..loss.router_aux import RouterAuxLoss
from ..parallel.parallelize import compute_context, reshard

log = logging.getLogger(__name__)


class StepObjective:
    def __init__(
        self,
        model: PreTrainedModel,
        token_loss: OutputLoss,
        preference: PreferenceLoss | None,
        *,
        counts_rows: bool,
        device: torch.device,
        world_size: int,
        reduce_size: int,
        router_aux: RouterAuxLoss | None = None,
    ) -> None:
        self.model, self.token_loss, self.preference = model, token_loss, preference
        # training.routerAuxLossCoef: the routers' load-balancing loss, in the backward but not in the logged loss.
        self.router_aux = router_aux
        self._aux_sum = torch.zeros((), device=device, dtype=torch.float32)
        # Rows packed whole (the supervised formats): what a step trains on is counted, not known in advance.
        self.counts_rows = counts_rows
        self.device, self.world_size, self.reduce_size = device, world_size, reduce_size

    @property
    def mode(self) -> str:
        """How the logits are computed (``training.logits``), for the metrics."""
        return self.token_loss.mode

    @property
    def pair_stats(self) -> int:
        """How many sums of pair statistics a micro-batch gives (0 without a preference objective)."""
        return len(STATS) if self.preference is not None else 0

    def __call__(self, batch: Batch, call: ModelCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The summed loss of a micro-batch, from the strategy's call of the model on it; with a preference
        objective also its pairs' stats sums.

        With ``training.routerAuxLossCoef`` a training forward (gradients on) also adds the routers'
        load-balancing loss, weighted by what the micro-batch's loss sums over, so that divided like the
        token loss it is the mean over the step's micro-batches; ``take_router_aux`` returns that part.
        """
        aux = self.router_aux if torch.is_grad_enabled() else None
        if aux is not None:
            aux.begin()
        if self.preference is not None:
            assert batch.position_ids is not None
            loss, pairs = self.preference.loss_sum(call, batch.labels, batch.position_ids)
        else:
            loss, pairs = self.token_loss.loss_sum(call, batch.labels), None
        if aux is not None and (balance := aux.end()) is not None:
            term = balance * float(self.count(batch))
            self._aux_sum += term.detach()
            loss = loss + term
        return loss, pairs

    def take_router_aux(self) -> torch.Tensor | None:
        """The load-balancing part of the losses since the last call, as they were summed (before the divisor);
        None without training.routerAuxLossCoef."""
        if self.router_aux is None:
            return None
        out, self._aux_sum = self._aux_sum, torch.zeros_like(self._aux_sum)
        return out

    def count(self, batch: Batch) -> int:
        """What the loss of a batch is a sum over: its pairs (preference objectives) or its trained tokens."""
        if self.preference is not None:
            assert batch.position_ids is not None
            return count_pairs(batch.labels, batch.position_ids)
        return batch.num_trained

    def local_counts(self, batches: Sequence[Batch]) -> tuple[float, float]:
        """This rank's (loss count, trained tokens) over a step's host batches: no device sync per micro-batch."""
        count = float(sum(self.count(b) for b in batches)) if self.counts_rows else 0.0
        # Trained tokens, for the metrics: the same count but for a preference objective's (its pairs).
        trained = float(sum(b.num_trained for b in batches)) if self.preference is not None else count
        return count, trained

    def divisor(
        self, local: float, local_trained: float, tokens_per_rank_step: int, cp: int
    ) -> tuple[float | torch.Tensor, torch.Tensor | None]:
        """What each micro-batch's token-loss sum is divided by; and the global trained tokens (None: all).

        With G trained tokens over D data-parallel ranks the divisor is G / D:
        FSDP's average of their gradients is then the gradient of the mean
        over all G. Plain text trains every token on every rank alike, so
        G / D is this rank's token count, known without communication.
        ``local``: what this rank's loss sums over in the step (its trained tokens; its pairs for a
        preference objective); ``local_trained``: its trained tokens, which the metrics count.
        """
        if not self.counts_rows:
            return tokens_per_rank_step / cp, None
        counts = torch.tensor([local, local_trained], dtype=torch.float64, device=self.device)
        # Summed over every rank: context peers count their own tokens, tensor-parallel peers repeat
        # them, so the sum is tp x G, and the divisor G / (D x cp) (FSDP averages over D x cp ranks)
        # is that sum over the world size.
        dist.all_reduce(counts)
        count, trained = counts[0], counts[1]
        return (count.clamp(min=1) / self.world_size).float(), trained * self.reduce_size / self.world_size


def probe_token_loss(model: PreTrainedModel, logits: str, precision: str, device: torch.device) -> OutputLoss:
    """How the loss is computed (``training.logits``), decided on a probe forward (collective)."""
    if logits == "full":
        return FullLogits(reason="training.logits: full")
    # Eager for the probe: a compiled layer would trace a no-grad variant at the
    # probe's shape, and a second shape makes dynamo compile for dynamic shapes.
    with compute_context(model, precision, device), torch.compiler.set_stance("force_eager"):
        loss = output_loss(model, logits, device)
    reshard(model)
    if isinstance(loss, ChunkedHead):
        log.info("logits: chunked, %d tokens per chunk (%s)", loss.chunk_tokens, loss.transform)
    return loss


def preference_loss(p: Prepared, model: PreTrainedModel, reference_meta: PreTrainedModel | None) -> PreferenceLoss:
    """The preference objective, with its reference: the base with LoRA's adapters off, or a frozen copy."""
    training = p.cfg.training
    reference = None
    if training.needs_reference:
        if reference_meta is None:
            reference = lora_reference(model)
            log.info("dpo: the reference is the base model with the LoRA adapters off (no second copy)")
        else:
            frozen = build_reference(p, reference_meta)
            reference = model_reference(frozen, lambda: reshard(frozen))
            log.info("dpo: the reference is a frozen copy of the model as loaded, sharded like it")
    return PreferenceLoss(training.objective, training.effective_preference(), reference)


def build_objective(
    p: Prepared, model: PreTrainedModel, reference_meta: PreTrainedModel | None, *, counts_rows: bool
) -> StepObjective:
    """The training's objective on ``model`` (collective: the loss probe, and the dpo reference's build)."""
    training = p.cfg.training
    token_loss = probe_token_loss(model, training.logits, training.precision, p.world.device)
    preference = preference_loss(p, model, reference_meta) if training.trains_preferences else None
    router_aux = None
    if training.router_aux_loss_coef > 0:
        router_aux = RouterAuxLoss(model, training.router_aux_loss_coef, p.world.device)
        log.info(
            "training.routerAuxLossCoef: %g x the load-balancing loss of %d routers (%d experts) added to the loss",
            training.router_aux_loss_coef, len(router_aux.routers), router_aux.experts,
        )  # fmt: skip
    return StepObjective(
        model,
        token_loss,
        preference,
        counts_rows=counts_rows,
        device=p.world.device,
        world_size=p.world.world_size,
        reduce_size=p.plan.dp_size * p.plan.cp,
        router_aux=router_aux,
    )
