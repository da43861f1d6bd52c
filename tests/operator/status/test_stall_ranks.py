"""The Stalled message's clause on where each rank stands: the rank the others wait for, with its pod and node.

End to end: tests/e2e/test_stall.py::test_a_hung_rank_is_flagged_stalled_restarted_and_resumes.
"""

from __future__ import annotations

from fsdp_operator.controller.stall.ranks import (
    RankState,
    culprit_node,
    rank_states,
    ranks_clause,
    where_ranks_are,
)

EXPOSITION = """\
# TYPE fsdp_train_step gauge
fsdp_train_step{job_name="j",node_rank="1",local_rank="0"} 18
fsdp_train_step{job_name="j",node_rank="1",local_rank="1"} 18
# TYPE fsdp_train_peer_wait_started_timestamp_seconds gauge
fsdp_train_peer_wait_started_timestamp_seconds{job_name="j",node_rank="1",local_rank="0"} 0
fsdp_train_peer_wait_started_timestamp_seconds{job_name="j",node_rank="1",local_rank="1"} 1000.5
"""


def rank(node_rank: int, step: int, since: float | None, pod: str = "", node: str = "") -> RankState:
    return RankState(node_rank, 0, step, since, pod or f"j-worker-{node_rank}", node or f"gpu-{node_rank}")


def test_each_ranks_step_and_wait_are_read_with_its_pod_and_node() -> None:
    assert rank_states(EXPOSITION, "j-worker-1", "gpu-1") == [
        RankState(1, 0, 18, None, "j-worker-1", "gpu-1"),
        RankState(1, 1, 18, 1000.5, "j-worker-1", "gpu-1"),
    ]


def test_the_rank_that_does_not_wait_is_the_one_named() -> None:
    ranks = [rank(0, 18, 1000.0), rank(1, 18, None), rank(2, 18, 1002.0)]
    assert where_ranks_are(ranks, now=1040.0) == (
        "node rank 1, local rank 0 (pod j-worker-1 on gpu-1) is not waiting for its peers (last finished step 18); "
        "2 rank(s) wait for it at the next step's start, for up to 40 s"
    )


def test_a_rank_behind_is_named_when_every_rank_is_busy() -> None:
    # A hang inside a collective: nobody is at our barrier; the rank a step behind is the lead.
    ranks = [rank(0, 18, None), rank(1, 17, None), rank(2, 18, None)]
    assert where_ranks_are(ranks, now=0) == (
        "node rank 1, local rank 0 (pod j-worker-1 on gpu-1) last finished step 17; the other rank(s) step 18"
    )
    assert where_ranks_are([rank(0, 18, None), rank(1, 18, None)], now=0) == "every rank (2) last finished step 18"


def test_pods_that_did_not_answer_are_counted_and_nothing_read_is_said_plainly() -> None:
    reads = {"j-worker-0": [rank(0, 18, 1000.0)], "j-worker-1": None}
    assert ranks_clause(reads, now=1010.0) == (
        "every rank (1) last finished step 18, all waiting for their peers at the next step's start; "
        "1 pod(s) did not answer"
    )
    assert ranks_clause({"j-worker-0": None}, now=0) == "no rank's metrics could be read"
    assert ranks_clause({}, now=0) == ""


def test_the_node_blamed_is_the_one_of_the_rank_the_others_wait_for() -> None:
    reads = {"j-worker-0": [rank(0, 18, 1000.0)], "j-worker-1": [rank(1, 18, None)], "j-worker-2": [rank(2, 18, 1.0)]}
    assert culprit_node(reads) == "gpu-1"
    # Every rank busy in a collective: the one a step behind.
    assert culprit_node({"a": [rank(0, 18, None)], "b": [rank(1, 17, None)]}) == "gpu-1"


def test_no_node_is_blamed_when_the_culprits_spread_nobody_lags_or_a_pod_did_not_answer() -> None:
    two = {"a": [rank(0, 18, 1000.0)], "b": [rank(1, 18, None)], "c": [rank(2, 18, None)]}
    assert culprit_node(two) is None  # ranks on gpu-1 and gpu-2 hold the others up: no one node
    assert culprit_node({"a": [rank(0, 18, None)], "b": [rank(1, 18, None)]}) is None  # all level, none waiting
    unread = {"a": [rank(0, 18, 1000.0)], "b": [rank(1, 18, None)], "c": None}
    assert culprit_node(unread) is None  # the silent pod may be the one the others wait for
    # Two ranks of one node both stuck: that node.
    same = {"a": [rank(0, 18, 1000.0)], "b": [rank(1, 18, None, node="gpu-1"), rank(2, 18, None, node="gpu-1")]}
    assert culprit_node(same) == "gpu-1"
