"""The trainer's Prometheus metrics: one scrape endpoint per pod for all local ranks.

torchrun starts one process per GPU, but a pod exposes one metrics port. So
every local rank writes its samples to memory-mapped files in a directory
shared by the pod (prometheus_client's multiprocess mode) and local rank 0
serves the merged view. Each series carries ``local_rank``, so nothing is
summed across ranks by accident.

The directory is per torchrun *agent* (its pid and start time) and per
*restart generation* (``TORCHELASTIC_RESTART_COUNT``): a worker group that
torchrun restarts, or a restarted container whose /tmp emptyDir survived,
writes to a fresh directory, so files of dead workers never leak into the
scrape (their counters would add up, their gauges freeze at their last
values). The new local rank 0 deletes the directories of earlier generations
and of agents that are gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from fsdp_api import contract
from fsdp_api.contract import Metric
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, metrics_core, start_http_server, values
from prometheus_client.multiprocess import MultiProcessCollector

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Where the per-agent directories go; default: the system temp dir (/tmp, an
# emptyDir in the pod).
BASE_DIR_ENV = contract.ENV_METRICS_DIR

RANK_LABELS = contract.RANK_LABELS
GPU_LABELS = contract.GPU_LABELS

# From a tiny CPU model (tens of ms) to a 70B step on many nodes (minutes).
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
CHECKPOINT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


def process_start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, from /proc), or None if it is gone.

    With the pid it names one process instance: a restarted container reuses
    pids, and its /tmp emptyDir keeps the files of the previous instance.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may contain spaces, so count after ')'.
    return stat.rpartition(")")[2].split()[19]


def _agent_key(pid: int) -> str:
    started = process_start_time(pid)
    if started is None and sys.platform != "linux":
        started = "0"  # no /proc: the pid alone
    return f"{pid}-{started}"


def multiproc_dir(env: Mapping[str, str] = os.environ) -> Path:
    """This worker's directory: the same for all local ranks of one torchrun agent and restart."""
    base = Path(env.get(BASE_DIR_ENV) or tempfile.gettempdir()) / "fsdp-trainer-metrics"
    # torchrun's workers are children of the agent; the agent's identity
    # separates concurrent runs that share a run id (a fixed rdzv id) and a
    # restarted container from its predecessor.
    agent = f"{env.get('TORCHELASTIC_RUN_ID', 'none')}.{_agent_key(os.getppid())}"
    return base / agent / f"restart-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def enable_multiprocess(path: Path, env: MutableMapping[str, str] = os.environ) -> None:
    """Make every metric created from now on write to ``path``.

    prometheus_client picks its value class when first imported, which may
    happen before the trainer runs (any import of prometheus_client in the
    process). Swapping the class here makes the mode independent of import
    order; metrics created before this call keep their in-memory values.
    """
    path.mkdir(parents=True, exist_ok=True)
    env[MULTIPROC_ENV] = str(path)
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()


def remove_stale_generations(current: Path) -> list[Path]:
    """Delete the directories of this agent's earlier restarts; local rank 0 calls this."""
    removed = []
    for sibling in current.parent.glob("restart-*"):
        if sibling != current:
            shutil.rmtree(sibling, ignore_errors=True)
            removed.append(sibling)
    return removed


def remove_dead_agents(current: Path) -> list[Path]:
    """Delete the directories of torchrun agents that are gone (earlier runs, a restarted container)."""
    removed = []
    agent_dir = current.parent
    for sibling in agent_dir.parent.iterdir():
        pid, _, started = sibling.name.rpartition(".")[2].partition("-")
        if sibling == agent_dir or not pid.isdigit():
            continue
        if started != "0" and process_start_time(int(pid)) != started:
            shutil.rmtree(sibling, ignore_errors=True)
            removed.append(sibling)
    return removed


@dataclass
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def scrape_order(files: list[str]) -> list[str]:
    """Counter and histogram files first, gauge files last.

    A scrape reads the files one after the other while the ranks keep
    training, and the train loop sets the step gauge before it counts the
    step's tokens and duration. Reading the gauges last keeps every scrape
    consistent the way a reader expects: the tokens and step count never run
    ahead of ``fsdp_train_step``. (glob's order is the directory's, on ext4 a
    hash of the names, which hold pids: it changed from run to run.)
    """
    return sorted(files, key=lambda f: (Path(f).name.startswith("gauge_"), f))


# prometheus_client's value files begin with a 4-byte used-length and 4 bytes of padding; a
# process that has just opened its file has not written them yet.
_VALUE_FILE_HEADER = 8


def ready_files(paths: list[Path]) -> list[str]:
    """The value files a scrape can read now: a rank's file created a moment ago (still empty) waits.

    A scrape lists the directory while the ranks start; reading a file before
    its header is written failed the whole scrape with a struct.error traceback.
    Its values are none yet, so leaving it for the next scrape loses nothing.
    """
    ready = []
    for path in paths:
        try:
            if path.stat().st_size >= _VALUE_FILE_HEADER:
                ready.append(str(path))
        except FileNotFoundError:  # a finished process's file removed meanwhile
            continue
    return ready


class _OrderedCollector(MultiProcessCollector):
    """MultiProcessCollector reading the files in ``scrape_order``."""

    def __init__(self, registry: CollectorRegistry, path: Path) -> None:
        super().__init__(registry, path=str(path))
        self._files_dir = path

    def collect(self) -> Iterable[metrics_core.Metric]:
        return self.merge(scrape_order(ready_files(list(self._files_dir.glob("*.db")))), accumulate=True)


def serve(port: int, path: Path, addr: str = "0.0.0.0") -> MetricsServer:
    """Serve the merged samples of every process writing to ``path``."""
    registry = CollectorRegistry()
    _OrderedCollector(registry, path)
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread)


def open_pod_endpoint(local_rank: int, port: int, addr: str) -> tuple[MetricsServer | None, str | None]:
    """Switch this process to the pod's shared metrics files; local rank 0 also serves them on ``port``.

    Returns (the server or None, a line to print on rank 0's log). Not being
    able to serve (the port taken) is a warning, not an error: losing the
    endpoint must not lose the training run.
    """
    path = multiproc_dir()
    enable_multiprocess(path)
    if local_rank != 0:
        return None, None
    for stale in remove_stale_generations(path) + remove_dead_agents(path):
        log.info("removed stale metrics files: %s", stale)
    try:
        server = serve(port, path=path, addr=addr)
    except OSError as e:
        log.warning("cannot serve metrics on %s:%d (%s); training continues without them", addr, port, e)
        return None, None
    shown = "127.0.0.1" if addr in ("0.0.0.0", "") else addr
    return server, f"metrics: serving http://{shown}:{server.port}/metrics"


# Series with labels beyond the rank's.
_LABELS = {
    contract.TRAINER_INFO.name: contract.INFO_LABELS,
    contract.TRACKER_RUN.name: contract.TRACKER_RUN_LABELS,
    **{m.name: contract.MOE_LAYER_LABELS for m in contract.MOE_LAYER_METRICS},
}


def _create(metric: Metric) -> Gauge | Counter | Histogram:
    labels = _LABELS.get(metric.name, RANK_LABELS)
    if metric.gpu_only:
        labels = GPU_LABELS
    if metric.type == "counter":
        return Counter(metric.name, metric.help, labels, registry=None)
    if metric.type == "histogram":
        buckets = CHECKPOINT_BUCKETS if metric is contract.CHECKPOINT_SAVE_DURATION else STEP_BUCKETS
        return Histogram(metric.name, metric.help, labels, registry=None, buckets=buckets)
    # livemostrecent: one writer per label set (the rank), no pid label added.
    return Gauge(metric.name, metric.help, labels, registry=None, multiprocess_mode="livemostrecent")


# Typed views of ``_create`` for TrainerMetrics: the contract says which kind each metric is.
def _gauge(metric: Metric) -> Gauge:
    series = _create(metric)
    assert isinstance(series, Gauge), f"{metric.name} is a {metric.type}"
    return series


def _counter(metric: Metric) -> Counter:
    series = _create(metric)
    assert isinstance(series, Counter), f"{metric.name} is a {metric.type}"
    return series


def _histogram(metric: Metric) -> Histogram:
    series = _create(metric)
    assert isinstance(series, Histogram), f"{metric.name} is a {metric.type}"
    return series


class TrainerMetrics:
    """The metric objects of the shared contract (fsdp_api.contract; docs/metrics.md).

    Created unregistered: in multiprocess mode the values live in the files,
    and the endpoint reads them through ``MultiProcessCollector``.
    """

    def __init__(self) -> None:
        c = contract
        self.info = _gauge(c.TRAINER_INFO)
        self.step = _gauge(c.STEP)
        self.max_steps = _gauge(c.MAX_STEPS)
        self.loss = _gauge(c.LOSS)
        self.learning_rate = _gauge(c.LEARNING_RATE)
        self.grad_norm = _gauge(c.GRAD_NORM)
        self.tokens = _counter(c.TOKENS)
        self.trained_tokens = _counter(c.TRAINED_TOKENS)
        self.tokens_per_second = _gauge(c.TOKENS_PER_SECOND)
        self.global_tokens_per_second = _gauge(c.GLOBAL_TOKENS_PER_SECOND)
        self.tflops = _gauge(c.TFLOPS)
        self.mfu = _gauge(c.MFU)
        self.mfu_float8 = _gauge(c.MFU_FLOAT8)
        self.peak_tflops = _gauge(c.PEAK_TFLOPS)
        self.step_duration = _histogram(c.STEP_DURATION)
        self.data_wait = _counter(c.DATA_WAIT)
        self.rank_wait = _counter(c.RANK_WAIT)
        self.rank_lateness = _counter(c.RANK_LATENESS)
        self.peer_wait_started = _gauge(c.PEER_WAIT_STARTED)
        self.memory_peak = _gauge(c.MEMORY_PEAK)
        self.memory_reserved = _gauge(c.MEMORY_RESERVED)
        self.reward_chosen = _gauge(c.REWARD_CHOSEN)
        self.reward_rejected = _gauge(c.REWARD_REJECTED)
        self.reward_margin = _gauge(c.REWARD_MARGIN)
        self.preference_accuracy = _gauge(c.PREFERENCE_ACCURACY)
        self.moe_load_max = _gauge(c.MOE_EXPERT_LOAD_MAX)
        self.moe_load_min = _gauge(c.MOE_EXPERT_LOAD_MIN)
        self.moe_unused = _gauge(c.MOE_EXPERTS_UNUSED)
        self.moe_aux_loss = _gauge(c.MOE_ROUTER_AUX_LOSS)
        self.eval_loss = _gauge(c.EVAL_LOSS)
        self.eval_perplexity = _gauge(c.EVAL_PERPLEXITY)
        self.checkpoint_save = _histogram(c.CHECKPOINT_SAVE_DURATION)
        self.checkpoint_load = _gauge(c.CHECKPOINT_LOAD_DURATION)
        self.checkpoint_skipped = _counter(c.CHECKPOINT_SKIPPED)
        self.checkpoint_last_step = _gauge(c.CHECKPOINT_LAST_STEP)
        self.checkpoint_last_save = _gauge(c.CHECKPOINT_LAST_SAVE)
        self.checkpoint_size = _gauge(c.CHECKPOINT_SIZE)
        self.checkpoint_remote_step = _gauge(c.CHECKPOINT_REMOTE_LAST_STEP)
        self.checkpoint_remote_lag = _gauge(c.CHECKPOINT_REMOTE_LAG)
        self.checkpoint_upload_failures = _counter(c.CHECKPOINT_UPLOAD_FAILURES)
        self.checkpoint_uploaded_bytes = _counter(c.CHECKPOINT_UPLOADED_BYTES)
        self.parameters = _gauge(c.MODEL_PARAMETERS)
        self.trainable_parameters = _gauge(c.MODEL_TRAINABLE_PARAMETERS)
        self.last_step_timestamp = _gauge(c.LAST_STEP_TIMESTAMP)
        self.restart_count = _gauge(c.RESTART_COUNT)
        self.compiled = _gauge(c.COMPILED)
        self.float8_linears = _gauge(c.FLOAT8_LINEARS)
        self.float8_kept_linears = _gauge(c.FLOAT8_KEPT_LINEARS)
        self.tracker_points_dropped = _counter(c.TRACKER_POINTS_DROPPED)
        self.tracker_run = _gauge(c.TRACKER_RUN)
        self.gpu_utilization = _gauge(c.GPU_UTILIZATION)
        self.gpu_memory_used = _gauge(c.GPU_MEMORY_USED)
        self.gpu_memory_total = _gauge(c.GPU_MEMORY_TOTAL)
        self.gpu_power = _gauge(c.GPU_POWER)
        self.gpu_temperature = _gauge(c.GPU_TEMPERATURE)
