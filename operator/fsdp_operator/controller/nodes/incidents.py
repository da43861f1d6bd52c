"""Repeated trouble on one node across restarts: trainer failures and stalls, counted per node in the status.

A restart moves a training past one bad step, but with a bad node under it
the restarted pod often fails or stalls again there: a container restart
(restartPolicy OnFailure) stays on its node, and a re-created pod may land on
it again. Two kinds of incident are counted per node, in
``status.nodeIncidents`` so that they outlive the pods and the operator:

- **a failure**: the trainer container of the training's pod on the node
  ended in an error (its ``state``/``lastState.terminated``), counted once by
  its ``finishedAt``. Not counted: a clean end, a stop on SIGTERM, a config
  the trainer refused (the spec's fault, not the node's), an OOM kill (the
  memory plan's), and failures on two nodes within ``SHARED_SECONDS`` (the
  job's own: a crash every rank shares, or peers lost together);
- **a stall**: a stall whose stuck or lagging rank ran on the node (the
  Stalled message's rank, stall/ranks.py).

A node with ``REPEATED`` incidents or more is a suspect while it hosts the
training's pods (node_health.py), with the counts as its evidence; an
excluded node's count starts over.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fsdp_api.contract import CONFIG_ERROR_EXIT_CODE, STOPPED_EXIT_CODE, TRAINER_CONTAINERS

from ..bodies import PodView

log = logging.getLogger(__name__)

Json = Mapping[str, Any]

# Incidents on one node that make it a suspect: one failure or stall happens to any node.
REPEATED = 2
# Nodes kept in the status, newest last: a training moving over many nodes forgets the oldest.
MAX_NODES = 64
# Failures on two nodes this close together are the job's, not a node's.
SHARED_SECONDS = 120
# Exit codes that say nothing against the node (see the module's docstring).
NOT_THE_NODES = frozenset({0, STOPPED_EXIT_CODE, CONFIG_ERROR_EXIT_CODE})
NOT_THE_NODES_REASONS = frozenset({"OOMKilled", "Completed"})


@dataclass(frozen=True)
class Failure:
    node: str
    pod: str
    exit_code: int
    reason: str
    finished_at: str  # RFC 3339, as the kubelet wrote it

    def words(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        return f"the trainer container of pod {self.pod} exited {self.exit_code}{why} at {self.finished_at}"


def failures_of(pod: Json) -> list[Failure]:
    """The trainer container's terminations that count against the pod's node (current and last state)."""
    view = PodView.of(pod)
    if not view.node_name:
        return []
    out = []
    for cs in view.containers_named(TRAINER_CONTAINERS):
        for state in (cs.state, cs.last_state):
            term = state.terminated
            if term is None:
                continue
            code, reason, finished = term.exit_code, term.reason, term.finished_at
            if code is None or not finished or code in NOT_THE_NODES or reason in NOT_THE_NODES_REASONS:
                continue
            out.append(Failure(view.node_name, view.name, code, reason, finished))
    return out


def _at(rfc3339: str) -> datetime:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))


def new_failures(pods: Iterable[Json], incidents: Sequence[Json]) -> tuple[list[Failure], list[Failure]]:
    """Failures not seen yet, oldest first: those of one node, and those shared with another node's.

    A failure within ``SHARED_SECONDS`` of one on another node (new, or the
    newest counted there) is the job's: a crash every rank shares, or peers
    lost together. It is marked seen and not counted.
    """
    seen = {str(i["node"]): i.get("lastFailureAt") or "" for i in incidents}
    # RFC 3339 in UTC at the kubelet's one precision orders as text.
    found = sorted(
        {f for pod in pods for f in failures_of(pod) if f.finished_at > seen.get(f.node, "")},
        key=lambda f: f.finished_at,
    )
    times = [(f.node, _at(f.finished_at)) for f in found] + [(n, _at(t)) for n, t in seen.items() if t]

    def shared(f: Failure) -> bool:
        at = _at(f.finished_at)
        return any(n != f.node and abs((t - at).total_seconds()) <= SHARED_SECONDS for n, t in times)

    own = [f for f in found if not shared(f)]
    return own, [f for f in found if f not in own]


def _entry(incidents: Sequence[Json], node: str) -> dict[str, Any]:
    old = next((i for i in incidents if i["node"] == node), None)
    return dict(old) if old is not None else {"node": node, "failures": 0, "stalls": 0}


def _put(incidents: Sequence[Json], entry: dict[str, Any]) -> list[dict[str, Any]]:
    rest = [dict(i) for i in incidents if i["node"] != entry["node"]]
    return [*rest, entry][-MAX_NODES:]


def with_failures(
    incidents: Sequence[Json], own: Iterable[Failure], shared: Iterable[Failure], now: str
) -> list[dict[str, Any]]:
    """The incidents with ``own`` failures counted (one each) and ``shared`` ones marked seen."""
    out = [dict(i) for i in incidents]
    counted = set(own)
    for f in sorted([*counted, *shared], key=lambda f: f.finished_at):
        counts = f in counted
        entry = _entry(out, f.node)
        words = f.words() if counts else f"{f.words()}, with pods on other nodes (not counted: the job's failure)"
        entry |= {
            "failures": int(entry.get("failures") or 0) + int(counts),
            "lastFailureAt": f.finished_at,
            "last": words[:1024],
            "time": now,
        }
        out = _put(out, entry)
    return out


def with_stall(incidents: Sequence[Json], node: str, words: str, now: str) -> list[dict[str, Any]]:
    """The incidents with one stall counted against ``node``."""
    entry = _entry(incidents, node)
    entry |= {"stalls": int(entry.get("stalls") or 0) + 1, "last": words[:1024], "time": now}
    return _put(incidents, entry)


def without(incidents: Sequence[Json], nodes: Iterable[str]) -> list[dict[str, Any]]:
    """The incidents less those of ``nodes`` (excluded: a replacement or a lifted taint starts over)."""
    gone = set(nodes)
    return [dict(i) for i in incidents if i["node"] not in gone]


def repeated(incidents: Iterable[Json]) -> dict[str, list[str]]:
    """Per node with ``REPEATED`` incidents or more: its evidence, one line."""
    out = {}
    for i in incidents:
        failures, stalls = int(i.get("failures") or 0), int(i.get("stalls") or 0)
        if failures + stalls < REPEATED:
            continue
        counts = [
            *([f"{failures} trainer failure(s)"] if failures else []),
            *([f"{stalls} stall(s) with its rank the one behind"] if stalls else []),
        ]
        out[str(i["node"])] = [f"{' and '.join(counts)} across restarts (the last: {i.get('last', '')})"]
    return out
