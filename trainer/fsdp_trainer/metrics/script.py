"""Metrics for a training script of your own (``spec.command``), in the names the built-in trainer uses.

The operator copies ``fsdp_train_step`` and ``fsdp_train_loss`` (and the
throughput and last checkpoint, when reported) from the rank-0 pod's
endpoint into the FSDPTraining's status, times steps for the stall check,
and the bundle's dashboard and alerts query the same series. A script that
reports through this class gets all of that::

    from fsdp_trainer.metrics.script import ScriptMetrics

    metrics = ScriptMetrics(max_steps=1000)          # on every rank, after torchrun started it
    for step in range(1, 1001):
        ...                                          # forward, backward, optimizer step
        metrics.step(step, loss=mean_loss, tokens=tokens_this_rank, seconds=step_seconds)
        if step % 100 == 0:
            ...                                      # save a checkpoint
            metrics.checkpoint_saved(step, seconds=save_seconds)
    metrics.close()

Every local rank writes its own series (``node_rank``/``local_rank``
labels) to files the pod shares; local rank 0 serves them all on
``$FSDP_METRICS_PORT``, which the renderer sets (docs/your-own-script.md).
Without that variable (metrics.enabled: false, or a run outside a pod)
nothing is served and every call still works. The script's image needs
this project's trainer package (``pip install fsdp-k8s[trainer]``, or the
trainer image as its base).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from fsdp_api.contract import (
    ENV_JOB_NAME,
    ENV_METRICS_ADDR,
    ENV_METRICS_LINGER_SECONDS,
    ENV_METRICS_PORT,
    rank_label_values,
)

from ..parallel.distributed import world_from_env
from .prometheus import MetricsServer, TrainerMetrics, open_pod_endpoint


class ScriptMetrics:
    """One rank's metrics in the shared names (fsdp_api.contract); see the module docstring."""

    def __init__(self, max_steps: int | None = None, *, env: Mapping[str, str] = os.environ) -> None:
        # torchrun's variables, read as the built-in trainer reads them.
        world = world_from_env(env, use_cuda=False)
        self.local_rank = world.local_rank
        self.world_size = max(1, world.world_size)
        self.labels = rank_label_values(env.get(ENV_JOB_NAME) or "local", world.node_rank, self.local_rank)
        self._linger = float(env.get(ENV_METRICS_LINGER_SECONDS) or 0)
        self.server: MetricsServer | None = None
        self.metrics: TrainerMetrics | None = None
        port = env.get(ENV_METRICS_PORT)
        if not port:
            return
        self.server, line = open_pod_endpoint(self.local_rank, int(port), env.get(ENV_METRICS_ADDR) or "0.0.0.0")
        if line is not None:
            print(line, flush=True)
        self.metrics = m = TrainerMetrics()
        lb = self.labels
        if max_steps is not None:
            m.max_steps.labels(**lb).set(max_steps)
        m.restart_count.labels(**lb).set(int(env.get("TORCHELASTIC_RESTART_COUNT") or 0))
        # Exported as 0 before the first increment, so rate() sees that increment.
        for series in (m.tokens, m.step_duration, m.checkpoint_save):
            series.labels(**lb)

    def step(self, step: int, *, loss: float, tokens: int | None = None, seconds: float | None = None) -> None:
        """After optimizer step ``step`` (counted from 1).

        ``loss``: the step's loss, ideally averaged over all ranks (the status
        shows rank 0's); ``tokens``: tokens this rank processed in the step;
        ``seconds``: the step's wall time (tokens/s, the step-time histogram
        and the stall check's fallback come from it).
        """
        m, lb = self.metrics, self.labels
        if m is None:
            return
        m.step.labels(**lb).set(step)
        m.loss.labels(**lb).set(loss)
        m.last_step_timestamp.labels(**lb).set(time.time())
        if seconds is not None:
            m.step_duration.labels(**lb).observe(seconds)
        if tokens is not None:
            m.tokens.labels(**lb).inc(tokens)
            if seconds:
                m.tokens_per_second.labels(**lb).set(tokens / seconds)
                # Every rank does the same work per step: the job's rate is this rank's times the world.
                m.global_tokens_per_second.labels(**lb).set(tokens * self.world_size / seconds)

    def checkpoint_saved(self, step: int, *, seconds: float | None = None, size_bytes: int | None = None) -> None:
        """After a checkpoint of ``step`` is complete on disk."""
        m, lb = self.metrics, self.labels
        if m is None:
            return
        m.checkpoint_last_step.labels(**lb).set(step)
        m.checkpoint_last_save.labels(**lb).set(time.time())
        if seconds is not None:
            m.checkpoint_save.labels(**lb).observe(seconds)
        if size_bytes is not None:
            m.checkpoint_size.labels(**lb).set(size_bytes)

    def checkpoint_loaded(self, step: int, *, seconds: float | None = None) -> None:
        """After resuming from the checkpoint of ``step``."""
        m, lb = self.metrics, self.labels
        if m is None:
            return
        m.checkpoint_last_step.labels(**lb).set(step)
        if seconds is not None:
            m.checkpoint_load.labels(**lb).set(seconds)

    def close(self) -> None:
        """At the end of a completed run: keep serving ``$FSDP_METRICS_LINGER_SECONDS``, then stop."""
        if self.server is None:
            return
        if self._linger > 0:
            time.sleep(self._linger)
        self.server.stop()
        self.server = None
