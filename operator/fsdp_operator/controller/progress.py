"""Step, loss and throughput for the status, read from the trainer's own metrics endpoint.

While a job runs, the operator's scrape loop asks the rank-0 pod for ``/metrics`` (the
same endpoint Prometheus scrapes, so the trainer needs nothing extra) and
copies four numbers into the status. It is cheap on purpose: one small GET
per running job per interval, a short timeout, and no status patch unless a
number changed. A failed scrape is not an error: the pod may be starting or
gone, and the next tick tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from fsdp_api.contract import (
    CHECKPOINT_LAST_STEP,
    CHECKPOINT_REMOTE_LAST_STEP,
    GLOBAL_TOKENS_PER_SECOND,
    JOB_COMPLETION_INDEX_LABEL,
    LABEL_LOCAL_RANK,
    LABEL_MOE_LAYER,
    LABEL_NODE_RANK,
    LABEL_RUN_URL,
    LABEL_TRACKER,
    LOSS,
    MAX_STEPS,
    MOE_EXPERT_LOAD_MAX,
    MOE_EXPERTS_UNUSED,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    ROUTER_COLLAPSED_UNUSED_RATIO,
    STEP,
    STEP_DURATION,
    TRACKER_RUN,
)
from fsdp_api.status import MAX_RUN_PAGE_LENGTH
from prometheus_client.parser import text_string_to_metric_families

from .bodies import PodView
from .kube import NETWORK_ERRORS

STEP_SERIES, LOSS_SERIES = STEP.name, LOSS.name
TOKENS_SERIES, CHECKPOINT_SERIES = GLOBAL_TOKENS_PER_SECOND.name, CHECKPOINT_LAST_STEP.name
REMOTE_SERIES = CHECKPOINT_REMOTE_LAST_STEP.name
# The step-duration histogram's sum and count give the trainer's mean step time (the stall check's fallback).
DURATION_SUM, DURATION_COUNT = f"{STEP_DURATION.name}_sum", f"{STEP_DURATION.name}_count"
# The steps the running trainer trains for: the spec's maxSteps until an edit of it reaches the pods.
MAX_STEPS_SERIES = MAX_STEPS.name
_WANTED = (
    STEP_SERIES,
    LOSS_SERIES,
    TOKENS_SERIES,
    CHECKPOINT_SERIES,
    REMOTE_SERIES,
    DURATION_SUM,
    DURATION_COUNT,
    MAX_STEPS_SERIES,
)

T = TypeVar("T")

SCRAPE_TIMEOUT_SECONDS = 3.0
# A trainer endpoint is a few KB; refuse to buffer something pathological.
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class TrainerProgress:
    step: int | None = None
    loss: float | None = None
    tokens_per_second: float | None = None
    checkpoint_last_step: int | None = None
    checkpoint_uploaded_step: int | None = None
    seconds_per_step: float | None = None  # the trainer's mean step time (not a status field)
    max_steps: int | None = None  # what the running trainer trains for (not a status field)
    tracker_runs: tuple[tuple[str, str], ...] = ()  # (tracker, the run's address)
    router: RouterLoad | None = None  # a mixture of experts' worst MoE layer
    node_rank: int | None = None  # the node rank of the pod that served these (not a status field)

    def status_fields(self) -> dict[str, Any]:
        """The status fields this progress sets (only the ones the trainer reported)."""
        out: dict[str, Any] = {}
        if self.step is not None:
            out["step"] = self.step
        if self.loss is not None:
            out["loss"] = round(self.loss, 6)
        if self.tokens_per_second is not None:
            out["tokensPerSecond"] = round(self.tokens_per_second, 1)
        checkpoint = {}
        if self.checkpoint_last_step is not None:
            checkpoint["lastStep"] = self.checkpoint_last_step
        if self.checkpoint_uploaded_step is not None:
            checkpoint["lastUploadedStep"] = self.checkpoint_uploaded_step
        if checkpoint:
            out["checkpoint"] = checkpoint
        if self.tracker_runs:
            out["trackerRuns"] = dict(self.tracker_runs)
        if self.router is not None:
            out["router"] = self.router.status()
        return out


@dataclass(frozen=True)
class RouterLoad:
    """One MoE layer's expert load, as the trainer exported it (job-level: every rank's tokens)."""

    layer: str
    max_load_ratio: float
    unused_experts_ratio: float

    def status(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "maxLoadRatio": round(self.max_load_ratio, 3),
            "unusedExpertsRatio": round(min(1.0, self.unused_experts_ratio), 3),
            "collapsed": self.unused_experts_ratio > ROUTER_COLLAPSED_UNUSED_RATIO,
        }


def worst_layer(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> RouterLoad | None:
    """The MoE layer with the most experts left without tokens, then the most uneven load; None: no MoE series.

    ``samples``: (name, labels, value); each layer's figures from the lowest rank that reports them.
    """
    best: dict[tuple[str, str], tuple[tuple[int, int], float]] = {}
    for name, labels, value in samples:
        layer = labels.get(LABEL_MOE_LAYER)
        if name not in (MOE_EXPERT_LOAD_MAX.name, MOE_EXPERTS_UNUSED.name) or not layer or not math.isfinite(value):
            continue
        key = _rank_key(labels)
        if (name, layer) not in best or key < best[(name, layer)][0]:
            best[(name, layer)] = (key, value)
    loads = [
        RouterLoad(layer, best[(MOE_EXPERT_LOAD_MAX.name, layer)][1], best[(MOE_EXPERTS_UNUSED.name, layer)][1])
        for name, layer in best
        if name == MOE_EXPERT_LOAD_MAX.name and (MOE_EXPERTS_UNUSED.name, layer) in best
    ]
    return max(loads, key=lambda r: (r.unused_experts_ratio, r.max_load_ratio), default=None)


def _rank_key(labels: Mapping[str, str]) -> tuple[int, int]:
    def num(key: str) -> int:
        try:
            return int(labels.get(key, "0"))
        except ValueError:
            return 1 << 30

    return num(LABEL_NODE_RANK), num(LABEL_LOCAL_RANK)


RankKey = tuple[int, int]  # (node_rank, local_rank)


def per_rank(text: str, names: Iterable[str]) -> dict[RankKey, dict[str, float]]:
    """The finite samples of ``names`` in an exposition, by rank (samples without valid rank labels are left out)."""
    wanted = set(names)
    seen: dict[RankKey, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in wanted or not math.isfinite(sample.value):
                continue
            try:
                key = (int(sample.labels[LABEL_NODE_RANK]), int(sample.labels[LABEL_LOCAL_RANK]))
            except (KeyError, ValueError):
                continue
            seen.setdefault(key, {})[sample.name] = sample.value
    return seen


def parse_trainer_metrics(text: str) -> TrainerProgress:
    """The four numbers from a Prometheus text exposition; each from the lowest rank reporting it.

    Global values (loss averaged over ranks, job throughput) are the same on
    every rank; taking rank 0's avoids mixing ranks that are a step apart.
    NaN/inf (a diverged loss, no throughput yet) are left out: the status
    schema stores numbers.
    """
    best: dict[str, tuple[tuple[int, int], float]] = {}
    runs: dict[str, str] = {}
    router: list[tuple[str, Mapping[str, str], float]] = []
    node_ranks: set[int] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if LABEL_MOE_LAYER in sample.labels:
                router.append((sample.name, sample.labels, sample.value))
                continue
            if sample.name == TRACKER_RUN.name and sample.value == 1:
                tracker, url = sample.labels.get(LABEL_TRACKER), sample.labels.get(LABEL_RUN_URL)
                if tracker and url and len(url) <= MAX_RUN_PAGE_LENGTH:
                    runs[tracker] = url  # rank 0 alone exports it
                continue
            if sample.name not in _WANTED or not math.isfinite(sample.value):
                continue
            key = _rank_key(sample.labels)
            if LABEL_NODE_RANK in sample.labels:
                node_ranks.add(key[0])
            if sample.name not in best or key < best[sample.name][0]:
                best[sample.name] = (key, sample.value)

    def value(name: str) -> float | None:
        return best[name][1] if name in best else None

    step, ckpt, tokens = value(STEP_SERIES), value(CHECKPOINT_SERIES), value(TOKENS_SERIES)
    uploaded = value(REMOTE_SERIES)
    total, count = value(DURATION_SUM), value(DURATION_COUNT)
    max_steps = value(MAX_STEPS_SERIES)
    return TrainerProgress(
        max_steps=int(max_steps) if max_steps is not None and max_steps >= 1 else None,
        seconds_per_step=total / count if total is not None and count and total >= 0 else None,
        step=int(step) if step is not None and step >= 0 else None,
        loss=value(LOSS_SERIES),
        tokens_per_second=tokens if (tokens or 0) >= 0 else None,
        checkpoint_last_step=int(ckpt) if ckpt is not None and ckpt >= 0 else None,
        checkpoint_uploaded_step=int(uploaded) if uploaded is not None and uploaded >= 0 else None,
        tracker_runs=tuple(sorted(runs.items())),
        router=worst_layer(router),
        node_rank=min(node_ranks, default=None),
    )


def rank0_pod(pods: Iterable[Mapping[str, Any]], *, running_only: bool = True) -> Mapping[str, Any] | None:
    """The running pod of index 0: the Master if any, else Worker 0 (node 0 of a TrainJob).

    It hosts the rendezvous; torchrun may give it any node rank, and every rank
    serves the step, loss and throughput series the operator reads.

    A pod being deleted does not count as running: after a stall restart its
    trainer still answers with the old step until it is gone, which would read
    as no progress. ``running_only=False`` also accepts a finished or
    terminating pod that still has its IP (the last read after the job ended:
    its endpoint may still answer).
    """
    candidates = []
    for pod in pods:
        view = PodView.of(pod)
        if (running_only and (view.phase != "Running" or view.deleting)) or not view.pod_ip:
            continue
        rtype = str(view.labels.get(REPLICA_TYPE_LABEL, "")).lower()
        candidates.append((0 if rtype == "master" else 1, _pod_index(pod), pod))
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c[0], c[1]))[2]


@dataclass(frozen=True)
class Unreadable:
    """A scrape that read nothing, and why (for the Stalled condition's message)."""

    reason: str


async def scrape(session: aiohttp.ClientSession, pod_ip: str, port: int) -> TrainerProgress | Unreadable:
    """GET the pod's metrics; Unreadable when they cannot be read right now."""
    text = await fetch_metrics(session, pod_ip, port)
    if isinstance(text, Unreadable):
        return text
    try:
        return parse_trainer_metrics(text)
    except ValueError as e:
        return Unreadable(f"{metrics_url(pod_ip, port)}: not Prometheus metrics ({e})")


async def node_rank_0_progress(
    session: aiohttp.ClientSession, pods: Iterable[Mapping[str, Any]], port: int
) -> TrainerProgress | None:
    """The figures of the pod whose trainer holds node rank 0 (its rank 0 alone exports the tracker runs).

    torchrun's c10d rendezvous numbers nodes by (host name, pid), not by pod
    index, so any running pod may hold it: each is asked in index order until
    one says node rank 0; None if none does now.
    """
    for pod in sorted(running_with_ip(pods), key=_pod_index):
        progress = await scrape(session, PodView.of(pod).pod_ip, port)
        if isinstance(progress, TrainerProgress) and progress.node_rank == 0:
            return progress
    return None


def _pod_index(pod: Mapping[str, Any]) -> int:
    """A PyTorchJob's replica index, or a TrainJob's completion index (unreadable: last)."""
    labels = PodView.of(pod).labels
    try:
        return int(labels.get(REPLICA_INDEX_LABEL) or labels.get(JOB_COMPLETION_INDEX_LABEL) or "0")
    except ValueError:
        return 1 << 30


def metrics_url(pod_ip: str, port: int) -> str:
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"http://{host}:{port}/metrics"


def running_with_ip(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods whose endpoint can be asked now: Running, with an address."""
    return [p for p in pods if (view := PodView.of(p)).phase == "Running" and view.pod_ip]


async def read_pods(
    session: aiohttp.ClientSession,
    pods: Iterable[Mapping[str, Any]],
    port: int,
    parse: Callable[[str, str, str], T],
    gate: asyncio.Semaphore | None = None,
) -> dict[str, T | None]:
    """Every running pod's exposition, parsed by ``parse(text, pod name, node name)``; None: unreadable.

    One GET per pod, all at once (at most ``gate``'s count in flight).
    """

    async def one(pod: Mapping[str, Any]) -> tuple[str, T | None]:
        view = PodView.of(pod)
        name = view.name
        async with gate or contextlib.nullcontext():
            text = await fetch_metrics(session, view.pod_ip, port)
        if isinstance(text, Unreadable):
            return name, None
        try:
            return name, parse(text, name, view.node_name)
        except ValueError:
            return name, None

    return dict(await asyncio.gather(*(one(p) for p in running_with_ip(pods))))


async def fetch_metrics(session: aiohttp.ClientSession, pod_ip: str, port: int) -> str | Unreadable:
    """The text of the pod's metrics endpoint; Unreadable when it cannot be read right now."""
    url = metrics_url(pod_ip, port)
    try:
        # No redirects: the operator only ever talks to the pod it chose.
        async with session.get(
            url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS), allow_redirects=False
        ) as rsp:
            if rsp.status != 200:
                return Unreadable(f"{url} answered HTTP {rsp.status}")
            raw = await rsp.content.read(MAX_BODY_BYTES)
    except TimeoutError:
        return Unreadable(f"{url} did not answer within {SCRAPE_TIMEOUT_SECONDS:g} s")
    except NETWORK_ERRORS as e:
        return Unreadable(f"{url}: {type(e).__name__}")
    return raw.decode("utf-8", errors="replace")
