"""MetricsProcessor: the one place that turns step statistics into numbers people read.

The train loop measures (loss, tokens, seconds) and calls the hooks; this
class derives tokens/s, TFLOP/s, MFU, memory and ETA, updates the Prometheus
series of this rank and writes rank 0's log line (plus a progress bar when
stdout is a terminal). It does no collective communication: the loop already
hands in job-level numbers, so metrics can never deadlock or slow a step.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

import torch
from fsdp_api import contract
from fsdp_api.contract import ENV_METRICS_ADDR, ENV_METRICS_LINGER_SECONDS, Metric

from ..tracking import Tracking, open_tracking
from .flops import FlopsShape, float8_peak_tflops, mfu, peak_tflops
from .logline import SUMMARY_WARMUP_STEPS, IntervalSummary, ProgressBar, RunSummary, step_line, summary_line
from .memory import memory_bytes
from .nvml import GpuSampler
from .prometheus import MetricsServer, TrainerMetrics, open_pod_endpoint
from .stats import StepStats

if TYPE_CHECKING:
    from fsdp_api.trainer_config import TrainerConfig

    from ..parallel.distributed import WorldInfo

# Bind address of the endpoint: all interfaces in a pod (Prometheus scrapes the
# pod IP); run-local narrows it to loopback.
ADDR_ENV = ENV_METRICS_ADDR
# Seconds the endpoint stays up after a completed run, so that Prometheus (and
# the operator's last read) can collect the final step, loss and checkpoint
# before the pod exits; a run shorter than one scrape interval is otherwise
# never seen at all. 0 (the default) exits at once.
LINGER_ENV = ENV_METRICS_LINGER_SECONDS


def _tf32_enabled() -> bool:
    return torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"


class MetricsProcessor:
    """Per-rank metrics and rank 0's progress output; see docs/metrics.md."""

    # Throughput gauges average the last steps: single steps are noisy, and a
    # scrape every 15-30 s should see a stable figure.
    WINDOW_STEPS = 10
    # NVML calls cost ~1 ms each; a dashboard needs no more than this.
    GPU_SAMPLE_SECONDS = 5.0
    SUMMARY_WARMUP_STEPS = SUMMARY_WARMUP_STEPS

    def __init__(
        self,
        cfg: TrainerConfig,
        world: WorldInfo,
        num_params: int,
        *,
        seq_len: int,
        num_trainable: int | None = None,
        flops: FlopsShape,
        logits: str = "full",
        stream: TextIO | None = None,
    ) -> None:
        self.cfg = cfg
        self.logits = logits
        self.world = world
        self.num_params = num_params
        self.num_trainable = num_params if num_trainable is None else num_trainable
        self.seq_len = seq_len
        self.flops_per_token = flops.flops_per_token(seq_len)
        self.device_name = torch.cuda.get_device_name(world.device) if world.device.type == "cuda" else None
        self.peak_tflops = peak_tflops(self.device_name, cfg.training.precision, tf32=_tf32_enabled())
        # float8 runs: MFU against the bf16 peak (comparable with a bf16 run) and against the float8 one.
        self.float8_peak_tflops = float8_peak_tflops(self.device_name) if cfg.training.precision == "float8" else 0.0
        self.max_steps = cfg.training.max_steps
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self.labels = contract.rank_label_values(cfg.job.name, world.node_rank, world.local_rank)
        self.stream = stream if stream is not None else sys.stdout
        self.is_logger = world.rank == 0
        self.metrics: TrainerMetrics | None = None
        self.server: MetricsServer | None = None
        # The remote tier reports from its own thread; counters move by what is new since the last report.
        self._remote_lock = threading.Lock()
        self._remote_seen: tuple[int, int] = (0, 0)
        self.gpu: GpuSampler | None = None
        self.tracking: Tracking | None = None
        self._runs_exported: dict[str, str] = {}
        self._window: deque[StepStats] = deque(maxlen=self.WINDOW_STEPS)
        self._interval: list[StepStats] = []
        self._steps_seen = 0
        self._steady_start = 0.0
        self._steady_end = 0.0
        # Process CPU time over the same window: a speed figure that other
        # load on a shared machine disturbs far less than wall time.
        self._steady_cpu_start = 0.0
        self._steady_cpu_end = 0.0
        self._steady_tokens = 0
        self._steady_steps: list[int] = []
        self._last_gpu_sample = -math.inf
        self._bar: ProgressBar | None = None
        if self.is_logger and self.stream.isatty():
            self._bar = ProgressBar(self.stream, self.max_steps)

    # --- hooks -------------------------------------------------------------

    def start(self) -> None:
        """Create this rank's series; local rank 0 also serves the pod's endpoint; rank 0 opens the trackers."""
        if self.is_logger:
            self.tracking = open_tracking(
                self.cfg, on_drop=self._count_dropped, say=lambda text: self._print(text, force=True)
            )
        if not self.cfg.metrics.enabled:
            return
        addr = os.environ.get(ADDR_ENV, "0.0.0.0")
        self.server, line = open_pod_endpoint(self.world.local_rank, self.cfg.metrics.port, addr)
        if line is not None:
            w = self.world
            self._print(f"{line} (node {w.node_rank}, {w.local_world_size} local ranks)", force=True)
        self.metrics = m = TrainerMetrics()
        info = {
            contract.LABEL_MODEL: self.cfg.model.source(),
            contract.LABEL_SHARDING_STRATEGY: self.cfg.fsdp.sharding_strategy,
            contract.LABEL_PRECISION: self.cfg.training.precision,
            contract.LABEL_WORLD_SIZE: str(self.world.world_size),
            contract.LABEL_LOGITS: self.logits,
            contract.LABEL_TENSOR_PARALLEL: str(self.cfg.parallelism.tensor),
            contract.LABEL_CONTEXT_PARALLEL: str(self.cfg.parallelism.context),
            contract.LABEL_EXPERT_PARALLEL: str(self.cfg.parallelism.expert),
            contract.LABEL_PIPELINE_PARALLEL: str(self.cfg.parallelism.pipeline),
        }
        m.info.labels(**self.labels, **info).set(1)
        # 0 until the first forward has shown that inductor compiled the layers.
        m.compiled.labels(**self.labels).set(0)
        m.peer_wait_started.labels(**self.labels).set(0)
        m.max_steps.labels(**self.labels).set(self.max_steps)
        m.restart_count.labels(**self.labels).set(self.restart_count)
        m.peak_tflops.labels(**self.labels).set(self.peak_tflops)
        m.parameters.labels(**self.labels).set(self.num_params)
        m.trainable_parameters.labels(**self.labels).set(self.num_trainable)
        # Touch the counters and histograms so they export 0 before the first
        # step or save, not nothing: rate()/increase() need a sample before
        # the first increment, or that increment is never seen. Without it a
        # pod's first checkpoint save stays invisible until a second one.
        for series in (
            m.tokens,
            m.trained_tokens,
            m.data_wait,
            m.rank_wait,
            m.rank_lateness,
            m.step_duration,
            m.checkpoint_save,
            m.tracker_points_dropped,
        ):
            series.labels(**self.labels)
        self.gpu = GpuSampler.open(self.world.device)

    def set_waiting(self, since: float | None) -> None:
        """This rank waits for its peers at a step's start since ``since`` (Unix time); None: it does not."""
        if self.metrics is not None:
            self.metrics.peer_wait_started.labels(**self.labels).set(since or 0)

    def set_float8(self, converted: int, kept: int) -> None:
        """How many Linear layers run in float8 and how many float8 left in bf16 (both 0 unless float8)."""
        if self.metrics is not None:
            self.metrics.float8_linears.labels(**self.labels).set(converted)
            self.metrics.float8_kept_linears.labels(**self.labels).set(kept)

    def set_compiled(self, compiled: bool) -> None:
        """Whether inductor compiled the decoder layers, known after the first forward."""
        if self.metrics is not None:
            self.metrics.compiled.labels(**self.labels).set(1 if compiled else 0)

    def on_step(self, stats: StepStats) -> None:
        self._window.append(stats)
        self._interval.append(stats)
        self._steps_seen += 1
        self._track_steady_state(stats)
        rates = self._rates(self._window)
        tracked = self.is_logger and self.tracking is not None
        # (peak, reserved), read once for the endpoint and the trackers, and only if one wants it.
        memory = memory_bytes(self.world.device) if self.metrics is not None or tracked else (0, 0)
        if self.metrics is not None:
            self._export_step(stats, rates, memory)
        if not self.is_logger:
            return
        if tracked:
            self._track_step(stats, rates, memory)
        if self._bar is not None:
            self._bar.update(stats.step, rates.global_tokens_per_second, rates.eta(stats.step, self.max_steps))
        if self._should_log(stats.step):
            self._print(step_line(self._summarise(stats)))
            self._interval.clear()

    def on_eval(self, step: int, loss: float) -> None:
        # A preference loss is not a token cross-entropy: it has no perplexity.
        ppl = None if self.cfg.training.trains_preferences else math.exp(loss) if loss < 700 else math.inf
        if self.metrics is not None:
            self.metrics.eval_loss.labels(**self.labels).set(loss)
            if ppl is not None:
                self.metrics.eval_perplexity.labels(**self.labels).set(ppl)
        if self.tracking is not None:
            self.tracking.log(step, {contract.EVAL_LOSS: loss, contract.EVAL_PERPLEXITY: ppl})
        self._print(f"eval step {step} | loss {loss:.4f}" + ("" if ppl is None else f" | perplexity {ppl:.2f}"))

    def on_samples(self, step: int, rows: Sequence[tuple[str, str]]) -> None:
        """training.samples' completions: one log line each, and the trackers' text."""
        if self.tracking is not None:
            self.tracking.log_samples(step, rows)
        for prompt, completion in rows:
            self._print(f"sample step {step} | {prompt!r} -> {completion!r}")

    # The checkpointer logs saves and resumes itself; these only feed metrics.
    def on_checkpoint_saved(self, step: int, seconds: float, size_bytes: int | None = None) -> None:
        """``size_bytes``: the newest complete checkpoint's size, where known (rank 0)."""
        if self.metrics is not None:
            m = self.metrics
            m.checkpoint_save.labels(**self.labels).observe(seconds)
            m.checkpoint_last_step.labels(**self.labels).set(step)
            m.checkpoint_last_save.labels(**self.labels).set(time.time())
            if size_bytes is not None:
                m.checkpoint_size.labels(**self.labels).set(size_bytes)
        if self.tracking is not None:
            self.tracking.log(step, {contract.CHECKPOINT_SAVE_DURATION: seconds, contract.CHECKPOINT_SIZE: size_bytes})
            self.tracking.sync()  # what led up to the checkpoint is on disk with it

    def on_checkpoint_loaded(self, step: int, seconds: float, skipped: int = 0) -> None:
        if self.metrics is not None:
            self.metrics.checkpoint_load.labels(**self.labels).set(seconds)
            self.metrics.checkpoint_last_step.labels(**self.labels).set(step)
            self.metrics.checkpoint_skipped.labels(**self.labels).inc(skipped)

    def on_remote(self, committed_step: int | None, lag_steps: int, failures: int, uploaded_bytes: int) -> None:
        """The remote tier's progress (called from its upload thread, and after each save)."""
        if self.metrics is None:
            return
        m = self.metrics
        with self._remote_lock:
            if self.world.is_main:
                if committed_step is not None:
                    m.checkpoint_remote_step.labels(**self.labels).set(committed_step)
                m.checkpoint_remote_lag.labels(**self.labels).set(lag_steps)
            m.checkpoint_upload_failures.labels(**self.labels).inc(max(0, failures - self._remote_seen[0]))
            m.checkpoint_uploaded_bytes.labels(**self.labels).inc(max(0, uploaded_bytes - self._remote_seen[1]))
            self._remote_seen = (max(failures, self._remote_seen[0]), max(uploaded_bytes, self._remote_seen[1]))

    def linger(self) -> None:
        """Keep serving the final values for $FSDP_METRICS_LINGER_SECONDS after a completed run."""
        seconds = float(os.environ.get(LINGER_ENV, "0") or 0)
        if self.server is not None and seconds > 0:
            self._print(f"metrics: serving the final values for {seconds:g} s more", force=True)
            time.sleep(seconds)

    def close(self) -> None:
        if self.tracking is not None:
            self.tracking.close()
            self.tracking = None
        if self._bar is not None:
            self._bar.close()
        summary = self._summary()
        if summary is not None:
            self._print(summary_line(summary))
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None

    # --- derived numbers ---------------------------------------------------

    def _rates(self, steps: deque[StepStats] | list[StepStats]) -> _Rates:
        seconds = sum(s.step_seconds for s in steps)
        tokens = sum(s.tokens for s in steps)
        global_tps = tokens / seconds if seconds > 0 else 0.0
        # Per device, so over the world, not the data-parallel ranks: model-parallel peers split
        # one data-parallel rank's tokens between them, and MFU needs each device's share.
        per_device = global_tps / self.world.world_size
        tflops = per_device * self.flops_per_token / 1e12
        data = sum(s.data_seconds for s in steps)
        return _Rates(
            global_tokens_per_second=global_tps,
            tokens_per_second_per_device=per_device,
            tflops_per_device=tflops,
            mfu=mfu(tflops, self.peak_tflops),
            mfu_float8=mfu(tflops, self.float8_peak_tflops),
            seconds_per_step=seconds / len(steps) if steps else 0.0,
            data_share=data / seconds if seconds > 0 else 0.0,
        )

    def _track_steady_state(self, stats: StepStats) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        if self._steps_seen == self.SUMMARY_WARMUP_STEPS:
            self._steady_start, self._steady_cpu_start = now, cpu
        elif self._steps_seen > self.SUMMARY_WARMUP_STEPS:
            self._steady_end, self._steady_cpu_end = now, cpu
            self._steady_tokens += stats.tokens
            self._steady_steps.append(stats.step)

    def _summary(self) -> RunSummary | None:
        seconds = self._steady_end - self._steady_start
        if not self._steady_steps or seconds <= 0:
            return None
        global_tps = self._steady_tokens / seconds
        per_device = global_tps / self.world.world_size
        tflops = per_device * self.flops_per_token / 1e12
        return RunSummary(
            first_step=self._steady_steps[0],
            last_step=self._steady_steps[-1],
            seconds=seconds,
            cpu_seconds=self._steady_cpu_end - self._steady_cpu_start,
            global_tokens_per_second=global_tps,
            tokens_per_second_per_device=per_device,
            tflops_per_device=tflops,
            mfu=mfu(tflops, self.peak_tflops),
            mfu_float8=mfu(tflops, self.float8_peak_tflops),
            memory_peak_bytes=memory_bytes(self.world.device)[0],
        )

    def _should_log(self, step: int) -> bool:
        # The first step of a process shows at once where a (resumed) run starts.
        return step % self.cfg.training.log_interval_steps == 0 or step >= self.max_steps or self._steps_seen == 1

    def _summarise(self, last: StepStats) -> IntervalSummary:
        interval = self._rates(self._interval)
        recent = self._rates(self._window)
        return IntervalSummary(
            step=last.step,
            max_steps=self.max_steps,
            loss=last.loss,
            learning_rate=last.learning_rate,
            grad_norm=last.grad_norm,
            global_tokens_per_second=interval.global_tokens_per_second,
            tokens_per_second_per_device=interval.tokens_per_second_per_device,
            tflops_per_device=interval.tflops_per_device,
            mfu=interval.mfu,
            mfu_float8=interval.mfu_float8,
            memory_peak_bytes=memory_bytes(self.world.device)[0],
            data_share=interval.data_share,
            eta_seconds=recent.eta(last.step, self.max_steps),
            trained_share=_trained_share(self._interval),
            preference=None if last.preference is None else (last.preference.accuracy, last.preference.margin),
        )

    def _export_step(self, stats: StepStats, rates: _Rates, memory: tuple[int, int]) -> None:
        m, lb = self.metrics, self.labels
        assert m is not None
        m.step.labels(**lb).set(stats.step)
        m.loss.labels(**lb).set(stats.loss)
        m.learning_rate.labels(**lb).set(stats.learning_rate)
        m.grad_norm.labels(**lb).set(stats.grad_norm)
        # This device's share of the job's tokens (over the world), so that a sum over ranks is the job's.
        m.tokens.labels(**lb).inc(stats.tokens / self.world.world_size)
        m.trained_tokens.labels(**lb).inc(stats.trained / self.world.world_size)
        m.tokens_per_second.labels(**lb).set(rates.tokens_per_second_per_device)
        m.global_tokens_per_second.labels(**lb).set(rates.global_tokens_per_second)
        m.tflops.labels(**lb).set(rates.tflops_per_device)
        if rates.mfu is not None:
            m.mfu.labels(**lb).set(rates.mfu)
        if rates.mfu_float8 is not None:
            m.mfu_float8.labels(**lb).set(rates.mfu_float8)
        m.step_duration.labels(**lb).observe(stats.step_seconds)
        m.data_wait.labels(**lb).inc(max(0.0, stats.data_seconds))
        m.rank_wait.labels(**lb).inc(max(0.0, stats.wait_seconds))
        m.rank_lateness.labels(**lb).inc(max(0.0, stats.lateness_seconds))
        peak, reserved = memory
        m.memory_peak.labels(**lb).set(peak)
        m.memory_reserved.labels(**lb).set(reserved)
        if stats.preference is not None:
            pref = stats.preference
            m.reward_chosen.labels(**lb).set(pref.reward_chosen)
            m.reward_rejected.labels(**lb).set(pref.reward_rejected)
            m.reward_margin.labels(**lb).set(pref.margin)
            m.preference_accuracy.labels(**lb).set(pref.accuracy)
        # Job-level figures, per layer: one copy per node (its local rank 0) keeps the series few.
        if stats.router is not None and self.world.local_rank == 0:
            for load in stats.router.layers:
                at = {**lb, contract.LABEL_MOE_LAYER: load.layer}
                m.moe_load_max.labels(**at).set(load.max_ratio)
                m.moe_load_min.labels(**at).set(load.min_ratio)
                m.moe_unused.labels(**at).set(load.unused_ratio)
                m.moe_aux_loss.labels(**at).set(load.aux_loss)
        m.last_step_timestamp.labels(**lb).set(time.time())
        self._export_gpu()

    def _track_step(self, stats: StepStats, rates: _Rates, memory: tuple[int, int]) -> None:
        """Rank 0's step for the trackers: the job-level series the Prometheus endpoint exports."""
        assert self.tracking is not None
        peak, reserved = memory
        self.tracking.log(
            stats.step,
            {
                contract.LOSS: stats.loss,
                contract.LEARNING_RATE: stats.learning_rate,
                contract.GRAD_NORM: stats.grad_norm,
                contract.GLOBAL_TOKENS_PER_SECOND: rates.global_tokens_per_second,
                contract.TFLOPS: rates.tflops_per_device,
                contract.MFU: rates.mfu,
                contract.MFU_FLOAT8: rates.mfu_float8,
                contract.STEP_DURATION: stats.step_seconds,
                contract.MEMORY_PEAK: peak,
                contract.MEMORY_RESERVED: reserved,
                **_preference_points(stats),
                **_router_points(stats),
            },
        )
        if self.metrics is not None:  # the runs' addresses, for the status, once each is open
            for tracker, url in self.tracking.run_urls().items():
                if self._runs_exported.get(tracker) != url:
                    labels = {contract.LABEL_TRACKER: tracker, contract.LABEL_RUN_URL: url}
                    self.metrics.tracker_run.labels(**self.labels, **labels).set(1)
                    self._runs_exported[tracker] = url

    def _count_dropped(self, points: int) -> None:
        if self.metrics is not None:
            self.metrics.tracker_points_dropped.labels(**self.labels).inc(points)

    def _export_gpu(self) -> None:
        now = time.monotonic()
        if self.gpu is None or self.metrics is None or now - self._last_gpu_sample < self.GPU_SAMPLE_SECONDS:
            return
        self._last_gpu_sample = now
        sample = self.gpu.sample()
        if sample is None:
            return
        m, lb = self.metrics, {**self.labels, contract.LABEL_GPU: str(self.gpu.gpu)}
        m.gpu_utilization.labels(**lb).set(sample.utilization_ratio)
        m.gpu_memory_used.labels(**lb).set(sample.memory_used_bytes)
        m.gpu_memory_total.labels(**lb).set(sample.memory_total_bytes)
        m.gpu_power.labels(**lb).set(sample.power_watts)
        m.gpu_temperature.labels(**lb).set(sample.temperature_celsius)

    def _print(self, text: str, *, force: bool = False) -> None:
        if not (self.is_logger or force):
            return
        if self._bar is not None:
            self._bar.print_above(text)
        else:
            print(text, file=self.stream, flush=True)


def _router_points(stats: StepStats) -> dict[Metric, float]:
    """A tracker point per router figure: the worst layer's (the mean for the loss); Prometheus has each layer."""
    router = stats.router
    if router is None:
        return {}
    return {
        contract.MOE_EXPERT_LOAD_MAX: router.worst_max_ratio,
        contract.MOE_EXPERT_LOAD_MIN: router.worst_min_ratio,
        contract.MOE_EXPERTS_UNUSED: router.worst_unused_ratio,
        contract.MOE_ROUTER_AUX_LOSS: router.mean_aux_loss,
    }


def _preference_points(stats: StepStats) -> dict[Metric, float]:
    pref = stats.preference
    if pref is None:
        return {}
    return {
        contract.REWARD_CHOSEN: pref.reward_chosen,
        contract.REWARD_REJECTED: pref.reward_rejected,
        contract.REWARD_MARGIN: pref.margin,
        contract.PREFERENCE_ACCURACY: pref.accuracy,
    }


def _trained_share(steps: list[StepStats]) -> float | None:
    """Trained / processed tokens; None when every token is trained (nothing worth a word)."""
    tokens = sum(s.tokens for s in steps)
    trained = sum(s.trained for s in steps)
    return trained / tokens if tokens and trained != tokens else None


@dataclass(frozen=True, slots=True)
class _Rates:
    """Throughput over a run of steps."""

    global_tokens_per_second: float
    tokens_per_second_per_device: float
    tflops_per_device: float
    mfu: float | None
    mfu_float8: float | None
    seconds_per_step: float
    data_share: float

    def eta(self, step: int, max_steps: int) -> float:
        return max(0, max_steps - step) * self.seconds_per_step
