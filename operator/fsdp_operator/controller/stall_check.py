"""The stall check of the pod loop: time each running training's steps, say when it stalls, restart if asked.

Called after every progress scrape of a running training (controller/scraper.py),
with what the scrape read. The decision is ``rules.py``'s; this module
keeps the clocks, writes the Stalled condition and, for ``onStall: restart``,
deletes the job's pods: the training operator re-creates them, and the
trainers resume from the last checkpoint. Deleting the pods (not the job)
keeps the job's identity and history, and needs no write on the job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import aiohttp
from fsdp_api.spec import CheckpointSpec, StallSpec
from pydantic import ValidationError

from .. import backends
from .bodies import MetricsView, ObjectMeta, by_type, conditions_of, live_pods, name_of, uid_of
from .kube import NETWORK_ERRORS, ApiError
from .nodes.incidents import with_stall
from .progress import TrainerProgress, Unreadable, read_pods
from .records import record_stall
from .stall.ranks import culprit_node, rank_states, ranks_clause
from .stall.rules import StallRules, observe, observe_unreachable, start_clock, verdict
from .state import Runtime
from .status.compute import STALLED, EventSpec, now_rfc3339, stall_state

log = logging.getLogger(__name__)

STALL_RESTART = "StallRestart"


def stall_rules(spec: Mapping[str, Any]) -> StallRules:
    """The training's stall settings, read leniently (a spec the API server stored is valid)."""
    try:
        stall = StallSpec.model_validate(spec.get("stall") or {})
    except ValidationError:
        stall = StallSpec()
    training = spec.get("training") or {}
    checkpoint = spec.get("checkpoint") or {}
    max_steps = training.get("maxSteps")
    return StallRules(
        spec=stall,
        checkpoint_interval=int(
            checkpoint.get("intervalSteps") or CheckpointSpec.model_fields["interval_steps"].default
        ),
        eval_interval=int(training.get("evalIntervalSteps") or 0),
        max_steps=max_steps if isinstance(max_steps, int) else None,
        own_script=spec.get("command") is not None,
    )


async def job_pods(rt: Runtime, training: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every pod of the training's job, as the API server lists them."""
    meta = training["metadata"]
    job_name = rt.previous_status(training).get("jobName") or meta["name"]
    job_label = backends.of_training(training).ref.job_label
    return await rt.client.list("v1", "Pod", meta["namespace"], f"{job_label}={job_name}")


async def restart_pods(rt: Runtime, training: Mapping[str, Any]) -> int:
    """Delete every pod of the training's job (its controller re-creates them); returns how many."""
    meta = training["metadata"]
    deleted = 0
    for pod in await job_pods(rt, training):
        pod_meta = ObjectMeta.of(pod)
        if pod_meta.deleting:
            continue
        await rt.client.delete("v1", "Pod", meta["namespace"], pod_meta.name, pod_meta.uid)
        deleted += 1
    return deleted


async def read_ranks(
    rt: Runtime, session: aiohttp.ClientSession, training: Mapping[str, Any]
) -> tuple[str, str | None]:
    """Where each rank of the training stands, from every running pod's endpoint (ranks.py), and the culprits' node."""
    pods = live_pods(await job_pods(rt, training))
    reads = await read_pods(session, pods, MetricsView.of(training).port, rank_states)
    return ranks_clause(reads, time.time()), culprit_node(reads)


async def check_stall(
    rt: Runtime,
    training: Mapping[str, Any],
    progress: TrainerProgress | Unreadable | None,
    now: float,
    session: aiohttp.ClientSession | None = None,
) -> bool:
    """Time one scrape of a running training; returns whether the Stalled condition changed.

    ``None``: no rank-0 pod is running, a (re)start. ``Unreadable``: the pod
    runs but its endpoint does not answer: its step is unknown, which is never
    called a stall (rules.py).
    """
    uid = uid_of(training)
    rules = stall_rules(training.get("spec") or {})
    clock = rt.step_clocks.get(uid) or start_clock(now)
    if isinstance(progress, Unreadable):
        clock = observe_unreachable(clock, now, progress.reason)
    else:
        step, reported = (progress.step, progress.seconds_per_step) if progress is not None else (None, None)
        clock = observe(clock, step, now, rules, reported)
    found = verdict(clock, rules, now)
    previous = by_type(conditions_of(rt.previous_status(training))).get(STALLED)
    newly = previous is None or previous.status != "True"
    incidents: list[dict[str, Any]] | None = None
    if found.stalled and newly and session is not None:
        try:
            clause, node = await read_ranks(rt, session, training)
            found = replace(found, ranks=clause)
            if node is not None:
                before = list(rt.previous_status(training).get("nodeIncidents") or [])
                incidents = with_stall(before, node, f"the stall after step {found.step}: {clause}", now_rfc3339())
        except (ApiError, *NETWORK_ERRORS) as e:
            log.debug("reading the ranks of %s failed: %s", name_of(training), e)
    restarts = int(rt.previous_status(training).get("stallRestarts") or 0)
    new_restarts: int | None = None
    events: list[EventSpec] = []
    if found.stalled and rules.spec.on_stall == "restart":
        if restarts < rules.spec.max_restarts:
            deleted = await restart_pods(rt, training)
            new_restarts = restarts + 1
            last = (rt.previous_status(training).get("checkpoint") or {}).get("lastStep")
            source = f"checkpoint step {last}" if last is not None else "their newest checkpoint"
            events.append(
                EventSpec(
                    "Warning",
                    STALL_RESTART,
                    f"{found.message()}: deleted {deleted} pods to resume from {source} "
                    f"(stall restart {new_restarts} of {rules.spec.max_restarts})",
                )
            )
            log.warning("%s: %s", name_of(training), events[-1].message)
            found = replace(found, note=f"restarted the pods ({new_restarts} of {rules.spec.max_restarts})")
            clock = start_clock(now)
        else:
            limit = rules.spec.max_restarts
            found = replace(found, note=f"not restarted: the limit of {limit} stall restarts is reached")
    rt.step_clocks[uid] = clock
    # Only a change of the condition (or a restart) is written: the check runs on
    # every scrape of every running training, and the clock itself stays in memory.
    unchanged = previous is not None and (previous.status, previous.reason) == stall_state(found)
    if not events and incidents is None and unchanged:
        return False
    return await record_stall(rt, training, found, restarts=new_restarts, events=events, incidents=incidents)
