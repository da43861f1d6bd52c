"""Where a stalled training stands, rank by rank: the Stalled message names the rank the others wait for.

When the stall check calls a training stalled, the operator reads every
running pod's endpoint once: each rank's last finished step
(``fsdp_train_step``) and whether it waits for its peers at the next step's
start, since when (``fsdp_train_peer_wait_started_timestamp_seconds``). A rank
stuck outside the collectives (a data loader, a dead filesystem, a save) is
the one that does not wait, or is a step behind, while the others wait for
it; the message names it with its pod and node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fsdp_api.contract import PEER_WAIT_STARTED, STEP

from ..progress import per_rank

# Ranks named one by one before the rest are counted.
NAMED = 3


@dataclass(frozen=True)
class RankState:
    node_rank: int
    local_rank: int
    step: int | None
    waiting_since: float | None  # Unix time; None: not waiting
    pod: str
    node: str

    def who(self) -> str:
        return f"node rank {self.node_rank}, local rank {self.local_rank} (pod {self.pod} on {self.node or '?'})"


def rank_states(text: str, pod: str, node: str) -> list[RankState]:
    """The ranks one pod's exposition reports."""
    seen = per_rank(text, (STEP.name, PEER_WAIT_STARTED.name))
    return [
        RankState(
            key[0],
            key[1],
            int(v[STEP.name]) if STEP.name in v else None,
            v.get(PEER_WAIT_STARTED.name) or None,
            pod,
            node,
        )
        for key, v in sorted(seen.items())
    ]


def _named(ranks: list[RankState], what: str) -> str:
    shown = "; ".join(f"{r.who()}{what.format(r=r)}" for r in ranks[:NAMED])
    return shown + (f"; and {len(ranks) - NAMED} more" if len(ranks) > NAMED else "")


def _split(ranks: list[RankState]) -> tuple[int | None, list[RankState], list[RankState], list[RankState]]:
    """The newest step, the ranks waiting for their peers, those not waiting, those behind the newest step."""
    top = max((r.step for r in ranks if r.step is not None), default=None)
    waiting = [r for r in ranks if r.waiting_since is not None]
    stuck = [r for r in ranks if r.waiting_since is None]
    behind = [r for r in ranks if top is not None and r.step is not None and r.step < top]
    return top, waiting, stuck, behind


def where_ranks_are(ranks: list[RankState], now: float, unread: int = 0) -> str:
    """One clause for the Stalled message."""
    if not ranks:
        return "no rank's metrics could be read"
    top, waiting, stuck, behind = _split(ranks)
    parts = []
    if waiting and stuck:
        parts.append(
            _named(stuck, " is not waiting for its peers (last finished step {r.step})")
            + f"; {len(waiting)} rank(s) wait for it at the next step's start, for up to "
            f"{now - min(r.waiting_since or now for r in waiting):.0f} s"
        )
    elif behind:
        parts.append(_named(behind, " last finished step {r.step}") + f"; the other rank(s) step {top}")
    else:
        parts.append(
            f"every rank ({len(ranks)}) last finished step {top}"
            + (", all waiting for their peers at the next step's start" if waiting and not stuck else "")
        )
    if unread:
        parts.append(f"{unread} pod(s) did not answer")
    return "; ".join(parts)


def culprits(ranks: list[RankState]) -> list[RankState]:
    """The ranks the clause blames: those not waiting while others wait, else those a step behind."""
    _, waiting, stuck, behind = _split(ranks)
    return stuck if waiting and stuck else behind


def culprit_node(reads: Mapping[str, list[RankState] | None]) -> str | None:
    """The one node every blamed rank runs on; None when none is blamed, they spread, or a pod was not read."""
    if any(found is None for found in reads.values()):
        return None  # the unread pod may hold the rank the others wait for
    nodes = {r.node for r in culprits([r for found in reads.values() if found for r in found])}
    return nodes.pop() if len(nodes) == 1 and "" not in nodes else None


def ranks_clause(reads: Mapping[str, list[RankState] | None], now: float) -> str:
    """From each pod's read (None: unreadable): the clause, or '' when there is nothing to say."""
    ranks = [r for found in reads.values() if found for r in found]
    unread = sum(1 for found in reads.values() if found is None)
    return where_ranks_are(ranks, now, unread) if reads else ""
