"""The training run: set-up in a fixed order, then the step loop.

Set-up: config checks and tokenizer (no process group yet) -> process group
and mesh -> model on the meta device -> activation checkpointing / compile /
FSDP2 -> materialise and initialise (or load pretrained) -> AdamW + schedule ->
data -> resume from the newest complete checkpoint.

A step: ``gradAccumSteps`` micro-batches, the gradient reduction skipped on all
but the last; the loss of each micro-batch is its token-sum times the
data-parallel size divided by the trained tokens of the whole global batch,
and FSDP averages gradients over the data-parallel ranks, so the gradient is
that of the mean loss over every trained token of the global batch. With
``data.format: text`` every token is trained and every rank has the same
count, known in advance; the supervised formats mask prompts and padding, so
the step's micro-batches are fetched first and their trained tokens summed
over ranks (one all-reduce) before the first backward. Then clipping, the optimizer and the schedule, and
one host sync for the numbers the metrics need (loss and gradient norm,
fetched together).
"""

from __future__ import annotations

import copy
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path

import torch
from fsdp_api.contract import ENV_SHUTDOWN_TIMEOUT, FORWARDED_SIGNALS, STALLS_DIR
from fsdp_api.trainer_config import TrainerConfig

from . import flight_recorder
from .build import Prepared, build_model, prepare
from .checkpoint import CONFIG_FILE as CHECKPOINT_CONFIG_FILE
from .checkpoint import MODEL_CONFIG_DIR as CHECKPOINT_MODEL_CONFIG_DIR
from .checkpoint import Checkpointer, check_candidates, resume_candidates
from .checkpoint.source import forget_downloaded_source, source_candidates
from .data.attention import PackedAttention, choose_kernel
from .data.formats import data_format
from .data.loader import TrainData
from .data.prefetch import PrefetchedData
from .data.row_report import log_rows, step_rows
from .errors import CheckpointSaveError
from .evaluation import Validation
from .faults import maybe_fault
from .footprint import frozen_digest, state_bytes, write_probe
from .loss.preference import PreferenceStats
from .metrics import MetricsProcessor
from .metrics.flops import shape_of
from .metrics.router_probe import RouterProbe
from .metrics.stats import StepStats
from .model.architecture import count_parameters, max_positions
from .model.lora import count_trainable, lora_summary
from .optim import build_optimizer, build_scheduler, clip_gradients, restore_schedule
from .parallel.compile import MODE_INDUCTOR
from .parallel.context_parallel import build_context_parallel
from .parallel.distributed import destroy_distributed, init_distributed
from .samples import Samples
from .step import ForwardBackward, StepReductions, build_objective, non_finite_loss, step_strategy, wait_for_peers
from .step.pipeline import pipeline_strategy
from .trace import Trace
from .watchdog import StepWatchdog

log = logging.getLogger(__name__)

# torchrun's own default when TORCH_ELASTIC_SHUTDOWN_TIMEOUT is unset: the
# seconds it gives its workers after passing SIGTERM on, before SIGKILL.
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
EXIT_MARGIN_SECONDS = 5.0


class Stopped(Exception):
    """Training stopped early on SIGTERM, after saving a checkpoint of ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step
        super().__init__(f"stopped on SIGTERM after step {step}; a checkpoint of it was saved")


class Trainer:
    def __init__(self, p: Prepared, trace_dir: Path | None = None) -> None:
        self.cfg, self.world, self.tokenizer = p.cfg, p.world, p.tokenizer
        cfg, world = self.cfg, self.world
        # The data and the token counts are per data-parallel rank (world rank: logs, traces, faults).
        self.dp_size, self.dp_rank = p.plan.dp_size, p.plan.dp_rank(world.rank)
        # Context peers each compute their own tokens of a row (the plain-text loss divisor).
        self.cp = p.plan.cp
        # Pipeline stages: each rank holds one stage's layers, the last stage's ranks alone compute the loss.
        self.pp = p.plan.pp
        self.mesh_shape = p.plan.describe() if p.plan.uses_fsdp else {}
        self.seq_len = p.seq_len
        self.device = world.device
        torch.manual_seed(cfg.training.seed)
        # Newest first; an architecture change stops here, before anything is materialised,
        # and checkpoints whose metadata cannot be read are passed over (Checkpointer.resume).
        found = resume_candidates(cfg.checkpoint, world, cfg.job)
        if cfg.checkpoint.resume_from is not None:
            if found:
                forget_downloaded_source(cfg, world)
            else:
                found = source_candidates(cfg, world)  # another training's steps, only read
        self.resume_candidates, self.unreadable = check_candidates(found, p.model, world, cfg.peft)
        # dpo without LoRA: the reference is built from the untouched meta model (shapes only, a cheap copy).
        needs_copy = cfg.training.needs_reference and not p.adapted
        reference_meta = copy.deepcopy(p.model) if needs_copy else None
        self.model = build_model(p, resuming=bool(found))
        self.context = build_context_parallel(self.model, world, p.plan, self.seq_len, cfg.training.precision)
        # A mixture of experts' router health (per-layer expert load), summed with the step's figures.
        # Not under pipelining yet: each stage holds other layers, and the sums are per layer position.
        self.router = RouterProbe(self.model if self.pp == 1 else None, self.device)
        if self.router.enabled:
            first = self.router.layers[0]
            log.info(
                "router health: %d MoE layers (%d experts, top %d), expert load exported per layer",
                len(self.router.layers), first.experts, first.top_k,
            )  # fmt: skip
        self.compile = p.compile
        self.float8 = p.float8
        # Counted on the whole model: a pipeline stage holds a part of it (the meta model has every layer).
        whole = self.model if self.pp == 1 else p.model
        self.num_params = count_parameters(whole)
        self.num_trainable = count_trainable(whole)
        packs_rows = data_format(cfg.data.format).packs_documents
        self.objective = build_objective(p, self.model, reference_meta, counts_rows=packs_rows)
        # Packed rows of the supervised formats attend only within their row.
        self.packed = None
        if packs_rows:
            choice = cfg.training.packed_attention
            kernel, why = choose_kernel(choice, self.model, self.device, self.context is not None)
            self.packed = PackedAttention(self.model, self.seq_len, kernel)
            how = "the context-parallel attention's mask" if self.context is not None else self.packed.describe()
            log.info("data.format %s: documents kept apart by %s (%s)", cfg.data.format, how, why)
        # How each step's micro-batches run forward and backward: the parallel plan's strategy.
        self.steps: ForwardBackward
        if p.stage is not None:
            self.steps = pipeline_strategy(p, self.model, self.packed)
        else:
            self.steps = step_strategy(self.model, cfg.training.precision, self.device, self.packed, self.context)
        self.optimizer = build_optimizer(self.model, cfg.training, self.device)
        self.scheduler = build_scheduler(self.optimizer, cfg.training)
        self.data = PrefetchedData(
            TrainData(
                cfg.data,
                self.tokenizer,
                seq_len=self.seq_len,
                micro_batch_size=cfg.training.micro_batch_size,
                rank=self.dp_rank,
                world_size=self.dp_size,
                seed=cfg.training.seed,
            )
        )
        self.checkpointer = Checkpointer(
            cfg.checkpoint, world, self.model, self.optimizer, self.data, self._write_assets
        )
        self.trace = Trace(trace_dir, world.rank)
        self.metrics = MetricsProcessor(
            cfg,
            world,
            self.num_params,
            seq_len=self.seq_len,
            flops=shape_of(whole),
            num_trainable=self.num_trainable,
            logits=self.objective.mode,
        )
        self.validation = Validation(
            cfg,
            self.tokenizer,
            seq_len=self.seq_len,
            dp_rank=self.dp_rank,
            dp_size=self.dp_size,
            model=self.model,
            steps=self.steps,
            objective=self.objective,
            device=self.device,
        )
        spec, limit = cfg.training.samples, max_positions(self.model.config)
        self.samples = Samples(spec, self.tokenizer, cfg.training.precision, self.device, limit) if spec else None
        self.stop_signal: int | None = None
        self.stop_time: float | None = None
        if self.checkpointer.remote is not None:
            self.checkpointer.remote.on_change = self._report_remote
        self.watchdog = StepWatchdog(
            rank=world.rank,
            stalls_dir=Path(cfg.checkpoint.dir) / STALLS_DIR,
            enabled=cfg.stall.trainer_step_timeout_seconds > 0,
        )
        accum = cfg.training.grad_accum_steps
        self.tokens_per_rank_step = cfg.training.micro_batch_size * self.seq_len * accum
        self.step = 0
        self.first_step = 1  # the step this process trains first (after a resume: the one after it)
        log.info(
            "model: %s (%s), %.1fM parameters%s, seq_len %d, global batch %d sequences",
            cfg.model.source(),
            type(self.model).__name__,
            self.num_params / 1e6,
            lora_summary(p.adapted, self.num_trainable, self.num_params),
            self.seq_len,
            cfg.training.micro_batch_size * accum * self.dp_size,
        )
        log.info("%s", p.kernels.line())

    def _report_compile(self) -> None:
        """After the first step, when inductor has compiled (or failed on) the layers: the mode that ran."""
        report = self.compile
        self.metrics.set_compiled(report.mode == MODE_INDUCTOR)
        self.trace.write("compile", step=self.step, **report.record())
        if report.enabled and not report.fallbacks:
            log.info("compile: %d graphs compiled by inductor", report.compiled)

    def _write_assets(self, directory: Path) -> None:
        """Files export needs besides the weights (rank 0, inside the checkpoint)."""
        self.tokenizer.save_pretrained(directory / "tokenizer")
        self.model.config.save_pretrained(directory / CHECKPOINT_MODEL_CONFIG_DIR)
        (directory / CHECKPOINT_CONFIG_FILE).write_text(self.cfg.to_yaml())

    # -- the loop -------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop_signal = signum
        self.stop_time = time.monotonic()
        if self.checkpointer.remote is not None:  # waiting for uploads at the end: the grace period now counts
            self.checkpointer.remote.cut_wait(self.grace_left())

    def grace_left(self) -> float:
        """Seconds of torchrun's shutdown timeout left since SIGTERM, less a margin to exit cleanly."""
        timeout = float(os.environ.get(ENV_SHUTDOWN_TIMEOUT, "") or DEFAULT_SHUTDOWN_TIMEOUT)
        spent = time.monotonic() - self.stop_time if self.stop_time is not None else 0.0
        return max(0.0, timeout - spent - EXIT_MARGIN_SECONDS)

    def _report_remote(self, _stats: object = None) -> None:
        remote = self.checkpointer.remote
        if remote is not None:
            stats = remote.stats
            lag = remote.lag_steps(self.checkpointer.last_local_step or 0)
            self.metrics.on_remote(stats.committed_step, lag, stats.failures, stats.bytes)

    def train(self) -> None:
        """Train to maxSteps; raises Stopped if SIGTERM arrived (checkpoint saved first).

        Kubernetes sends SIGTERM before deleting a pod (spot interruption,
        node drain, suspend) and torchrun passes it to the workers, then
        waits (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s by default): the current step finishes, every rank agrees to stop at
        the same step, and that step is checkpointed, so nothing is lost if
        the save fits in the grace period (and nothing is corrupted if not).
        """
        if threading.current_thread() is threading.main_thread():
            # Ctrl-C and a closed terminal stop like the kubelet's SIGTERM: save the step, then exit.
            # torchrun passes on the signal it got, so a rank sees SIGINT under run-local's Ctrl-C.
            for s in FORWARDED_SIGNALS:
                signal.signal(s, self._on_signal)
        cfg = self.cfg
        self.metrics.start()
        self.metrics.set_float8(len(self.float8.converted), self.float8.kept_linears)
        if cfg.training.eval_interval_steps:
            self.validation.batches()  # tokenized now: the prefetch thread owns the tokenizer once it runs
        stall = cfg.stall
        timeout = stall.trainer_step_timeout_seconds
        if self.resume_candidates or self.unreadable:
            self.watchdog.arm("loading the checkpoint", timeout + stall.startup_seconds)
            self.step, seconds, skipped = self.checkpointer.resume(self.resume_candidates, self.unreadable)
            restore_schedule(self.optimizer, self.scheduler, cfg.training, self.step)
            self.metrics.on_checkpoint_loaded(self.step, seconds, skipped=len(skipped))
        self.trace.write(
            "start",
            step=self.step,
            world_size=self.world.world_size,
            mesh=self.mesh_shape,
            num_params=self.num_params,
            trainable_params=self.num_trainable,
            logits=self.objective.mode,
            float8_linears=len(self.float8.converted),
            **({"frozen_sha256": frozen_digest(self.model)} if self.trace.enabled else {}),
        )
        max_steps = cfg.training.max_steps
        eval_every = cfg.training.eval_interval_steps
        first = True
        self.first_step = self.step + 1
        while self.step < max_steps:
            self.step += 1
            # The first step after a start also builds caches, compiles, warms up the collectives.
            self.watchdog.arm(f"step {self.step}", timeout + (stall.startup_seconds if first else 0))
            first = False
            stats, samples, stop = self.train_step(self.step)
            self.metrics.on_step(stats)
            self.trace.write(
                "step",
                step=stats.step,
                loss=stats.loss,
                lr=stats.learning_rate,
                grad_norm=stats.grad_norm,
                samples=samples,
                wait=round(stats.wait_seconds, 4),
                lateness=round(stats.lateness_seconds, 4),
                **(step_rows(stats, self.data.state_dict()) if self.packed is not None else {}),
            )
            if self.step == self.first_step:
                self._report_compile()
            maybe_fault("after_step", self.step, self.world.rank, cfg.checkpoint.dir)
            if eval_every and (self.step % eval_every == 0 or self.step == max_steps):
                self.watchdog.arm(f"validation at step {self.step}", timeout + stall.checkpoint_seconds)
                self.evaluate(self.step)
            elif self.step == max_steps:
                self.watchdog.arm(f"the samples of step {self.step}", timeout + stall.checkpoint_seconds)
                self.answer_samples(self.step)
            if stop or self.checkpointer.due(self.step, max_steps):
                self.watchdog.arm(f"the checkpoint save of step {self.step}", timeout + stall.checkpoint_seconds)
                seconds = self.checkpointer.save(self.step)
                self.metrics.on_checkpoint_saved(self.step, seconds, self.checkpointer.last_size_bytes)
                self._report_remote()
                self.trace.write("checkpoint", step=self.step, seconds=seconds, bytes=self.checkpointer.last_size_bytes)
            if stop:
                self.checkpointer.finalize()
                self.watchdog.disarm()
                self.trace.write("stopped", step=self.step)
                raise Stopped(self.step)
        self.watchdog.arm(f"the checkpoint save of step {self.step}", timeout + stall.checkpoint_seconds)
        self.checkpointer.finalize()
        self.watchdog.disarm()
        log_rows(self.data.state_dict(), self.world.rank, self.seq_len)
        if self.trace.enabled:
            params, optim = state_bytes(self.model, self.optimizer)
            self.trace.write(
                "memory",
                param_bytes=params,
                optim_bytes=optim,
                checkpoint_bytes=self.checkpointer.last_size_bytes,
                trainable_params=self.num_trainable,
            )
            assert self.trace.directory is not None  # enabled: it writes there
            if self.pp == 1:  # a stage cannot run a forward alone
                write_probe(
                    self.model, self.cfg.training.precision, self.device, self.trace.directory, self.world.is_main
                )
        if self.trace.enabled:  # hashing the frozen base is a test aid, not for production runs
            self.trace.write("end", step=self.step, frozen_sha256=frozen_digest(self.model))

    def train_step(self, step: int) -> tuple[StepStats, list[str], bool]:
        """One optimizer step; also returns whether any rank was asked to stop."""
        t0 = time.perf_counter()
        accum = self.cfg.training.grad_accum_steps
        batches = [self.data.next_batch() for _ in range(accum)]
        samples = [s for b in batches for s in b.sample_ids]
        batches = [self.steps.local(b) for b in batches]
        local_count, local_trained = self.objective.local_counts(batches)
        batches = [b.to(self.device) for b in batches]
        data_seconds = time.perf_counter() - t0
        self.router.reset()  # what validation or samples routed since the last step is not this step's
        waited = wait_for_peers(self.world.world_size, self.device, self.metrics)
        divisor, trained = self.objective.divisor(local_count, local_trained, self.tokens_per_rank_step, self.cp)
        loss_sum, pair_sums = self.steps.forward_backward(batches, self.objective, divisor, self.objective.pair_stats)
        # The routers' load-balancing part (training.routerAuxLossCoef) is trained, not logged as the loss.
        if (balance := self.objective.take_router_aux()) is not None:
            loss_sum = loss_sum - balance / divisor
        grad_norm = clip_gradients(self.model, self.cfg.training.grad_clip_norm, self.pp)
        self.optimizer.step()
        lr = float(self.scheduler.get_last_lr()[0])
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        # One all-reduce carries the loss (each rank's mean, summed), the stop votes (every rank
        # stops at the same step, whichever of them got the signal first), the pairs' sums and
        # each rank's wait at the step's start, in that rank's place.
        slots = StepReductions(self.device)
        slots.sum("loss", loss_sum)
        slots.sum("stop", float(self.stop_signal is not None))
        slots.sum("pairs", pair_sums)
        if self.router.enabled:
            slots.sum("router", self.router.take())
        waits = torch.zeros(self.world.world_size, device=self.device, dtype=torch.float32)
        waits[self.world.rank] = waited
        slots.sum("waits", waits)
        slots.read("grad_norm", grad_norm)
        if trained is not None:
            slots.read("trained", trained)
        values = slots.exchange()
        stop_votes, pair_values, all_waits = values["stop"][0], values["pairs"], values["waits"]
        (norm_value,), trained_value = values["grad_norm"], values.get("trained", [])
        # The all-reduce summed every rank's mean (a rank's model-parallel peers repeat its value;
        # under pipelining only the last stage's ranks have one).
        loss_value = values["loss"][0] / (self.world.world_size // self.pp)
        tokens = self.tokens_per_rank_step * self.dp_size
        if not math.isfinite(loss_value):
            raise FloatingPointError(non_finite_loss(loss_value, step, first=step == self.first_step))
        stats = StepStats(
            step=step,
            loss=loss_value,
            learning_rate=lr,
            grad_norm=norm_value,
            tokens=tokens,
            step_seconds=time.perf_counter() - t0,
            data_seconds=data_seconds,
            # The first rank to arrive waited for the last: how much later than it this one came.
            # Not at a run's first step: ranks that loaded or compiled at different speeds are not stragglers.
            wait_seconds=0.0 if step == self.first_step else waited,
            lateness_seconds=0.0 if step == self.first_step else max(0.0, max(all_waits) - waited),
            trained_tokens=round(trained_value[0]) if trained_value else tokens,
            # Every rank's pair sums: model-parallel peers would repeat theirs (divided out like the loss).
            preference=PreferenceStats.from_sums([v * self.dp_size / self.world.world_size for v in pair_values])
            if pair_values
            else None,
            router=self.router.stats(values["router"]) if self.router.enabled else None,
        )
        return stats, samples, stop_votes > 0

    # -- validation -------------------------------------------------------------

    def evaluate(self, step: int) -> float | None:
        self.answer_samples(step)
        loss = self.validation.loss()
        if loss is None:
            return None
        self.metrics.on_eval(step, loss)
        perplexity = {} if self.objective.preference else {"perplexity": math.exp(min(loss, 700.0))}
        self.trace.write("eval", step=step, loss=loss, batches=len(self.validation.batches()), **perplexity)
        return loss

    def answer_samples(self, step: int) -> None:
        """training.samples: the model's answers now, on the log, in the trace and the trackers (collective)."""
        if self.samples is None:
            return
        if self.stop_signal is not None:
            # The grace period is for the checkpoint: samples could take longer than what is left of it.
            log.info("training.samples: skipped at step %d, the training is stopping", step)
            return
        timeout = self.cfg.stall.trainer_step_timeout_seconds
        rearm = lambda: self.watchdog.arm(f"the samples of step {step}", timeout)  # noqa: E731
        rows = [(s.prompt, s.completion) for s in self.samples.answer(self.model, rearm)]
        self.metrics.on_samples(step, rows)
        self.trace.write("samples", step=step, samples=[{"prompt": p, "completion": c} for p, c in rows])

    def close(self, *, clean: bool = True, remote_wait_seconds: float | None = None) -> bool:
        """Release everything; ``clean=False`` after an error skips the collectives of
        a pending save (another rank may be gone), leaving it unmarked and thus unused.

        With a remote tier, the uploads get up to ``remote_wait_seconds`` to finish; returns
        whether the newest checkpoint reached it (True without one)."""
        self.watchdog.close()
        uploaded = True
        if clean:
            wait = self.cfg.checkpoint.remote_wait_seconds if remote_wait_seconds is None else remote_wait_seconds
            uploaded = self.checkpointer.close(wait)
            self._report_remote()
        self.data.close()
        self.metrics.close()
        self.trace.close()
        return uploaded


def run(cfg: TrainerConfig, trace_dir: Path | None = None) -> None:
    """Train from the config to ``training.maxSteps`` (resuming if a checkpoint exists)."""
    prepared = prepare(cfg)
    # Before the process groups exist: they read it when created.
    flight_recorder.arm(Path(cfg.checkpoint.dir) / STALLS_DIR, nccl="nccl" in prepared.world.backend)
    init_distributed(prepared.world)
    try:
        trainer = Trainer(prepared, trace_dir)
        try:
            trainer.train()
        except Stopped:
            trainer.close(remote_wait_seconds=trainer.grace_left())
            raise
        except BaseException:
            trainer.close(clean=False)
            raise
        trainer.metrics.linger()
        if not trainer.close():
            # Succeeded must mean the last step is in the remote tier: the pod's local directory
            # may be an emptyDir. A restart resumes from the local copy and uploads it again.
            raise CheckpointSaveError(
                f"checkpoint.remote: the final checkpoint (step {trainer.step}) was not committed to "
                f"{cfg.checkpoint.remote} within checkpoint.remoteWaitSeconds ({cfg.checkpoint.remote_wait_seconds} s; "
                "the rank logs say why); the local tier has it, and a restart uploads it"
            )
    finally:
        destroy_distributed()
