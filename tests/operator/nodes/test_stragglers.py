"""Stragglers: the rank its peers keep waiting for, from two reads of every pod's counters.

End to end (a real trainer slowed on one rank, on the local cluster):
tests/e2e/test_stall.py::test_a_straggler_node_is_excluded_and_the_training_resumes_elsewhere.
"""

from __future__ import annotations

import pytest
from fsdp_operator.controller.nodes.health import node_health
from fsdp_operator.controller.nodes.stragglers import MARGIN, RankCounters, StragglerWatch, rank_counters

EXPOSITION = """\
# TYPE fsdp_train_rank_lateness_seconds counter
fsdp_train_rank_lateness_seconds_total{job_name="j",node_rank="1",local_rank="0"} 4.5
fsdp_train_rank_lateness_seconds_total{job_name="j",node_rank="1",local_rank="1"} 0.1
# TYPE fsdp_train_step_duration_seconds histogram
fsdp_train_step_duration_seconds_bucket{job_name="j",node_rank="1",local_rank="0",le="+Inf"} 10
fsdp_train_step_duration_seconds_sum{job_name="j",node_rank="1",local_rank="0"} 3.0
fsdp_train_step_duration_seconds_count{job_name="j",node_rank="1",local_rank="0"} 10
fsdp_train_step_duration_seconds_sum{job_name="j",node_rank="1",local_rank="1"} 7.5
fsdp_train_step_duration_seconds_count{job_name="j",node_rank="1",local_rank="1"} 10
# TYPE fsdp_train_loss gauge
fsdp_train_loss{job_name="j",node_rank="1",local_rank="0"} 2.5
"""


def test_a_pods_exposition_gives_each_ranks_lateness_and_step_time() -> None:
    ranks = rank_counters(EXPOSITION, "j-worker-1", "gpu-1")
    assert ranks == {
        (1, 0): RankCounters(4.5, 3.0, 10, "j-worker-1", "gpu-1"),
        (1, 1): RankCounters(0.1, 7.5, 10, "j-worker-1", "gpu-1"),
    }
    # A trainer from before the signal existed exports no lateness: no rank, no verdict.
    assert rank_counters(EXPOSITION.replace("rank_lateness", "other"), "p", "n") == {}


def reads(step: int, late: dict[tuple[int, int], float], slow_key=(1, 0), busy=0.3, wait=0.5) -> dict:
    """Cumulative counters after ``step`` steps: ``late[key]`` s of lateness per step; the others wait for it."""
    out = {}
    for key in ((0, 0), (0, 1), (1, 0), (1, 1)):
        per_step = late.get(key, 0.0)
        own_busy = busy if key == slow_key else busy + wait
        out[key] = RankCounters(per_step * step, own_busy * step, step, f"j-worker-{key[0]}", f"gpu-{key[0]}")
    return out


def test_a_rank_late_in_two_windows_in_a_row_names_its_node_and_pod() -> None:
    watch = StragglerWatch()
    slow = {(1, 0): 0.5}
    watch.update(reads(10, slow))  # the baseline
    assert not watch.judged  # one read says nothing yet, either way
    watch.update(reads(20, slow))
    assert watch.judged
    assert watch.evidence() == {}  # one window is not persistent
    watch.update(reads(30, slow))
    # The peers waited 0.5 s of each 0.8 s step (their own step time includes the wait).
    assert watch.evidence() == {
        "gpu-1": [
            "straggler: node rank 1, local rank 0 (pod j-worker-1) kept its peers waiting 62% of the step time "
            "(0.50 s per step), 2 checks in a row"
        ]
    }


def test_one_slow_window_a_window_too_short_and_a_restart_do_not_make_a_straggler() -> None:
    watch = StragglerWatch()
    watch.update(reads(10, {}))
    watch.update(reads(20, {(1, 0): 0.5}))  # rank 1/0 late across this window only (a slow save)...
    watch.update(reads(30, {(1, 0): 0.5 * 20 / 30}))  # ...and no more lateness after it
    assert watch.ranks[(1, 0)].flagged == 0 and watch.evidence() == {}
    # Two steps since the last read: the window grows until the next check instead of closing.
    base = watch.ranks[(1, 0)].base
    watch.update(reads(32, {(1, 0): 0.5 * 20 / 30}))
    assert watch.ranks[(1, 0)].base == base
    # A counter that went back is a new process (a restart): its window starts over, nothing is flagged.
    watch.update(reads(40, {(1, 0): 1.0}))
    watch.update(reads(3, {(1, 0): 1.0}))
    assert watch.ranks[(1, 0)].flagged == 0 and watch.ranks[(1, 0)].base.steps == 3


def test_the_margin_is_a_share_of_the_step_time() -> None:
    under, over = StragglerWatch(), StragglerWatch()
    for watch, wait in ((under, 0.9 * MARGIN), (over, 1.1 * MARGIN)):
        late = {(1, 0): wait}
        for step in (10, 20, 30):
            watch.update(reads(step, late, busy=1.0 - wait, wait=wait))
    assert under.evidence() == {}
    assert over.ranks[(1, 0)].share == pytest.approx(1.1 * MARGIN)
    assert list(over.evidence()) == ["gpu-1"]


def test_a_straggler_joins_the_node_conditions_in_the_verdict() -> None:
    pods = [
        {"metadata": {"name": "j-worker-0"}, "spec": {"nodeName": "gpu-0"}},
        {"metadata": {"name": "j-worker-1"}, "spec": {"nodeName": "gpu-1"}},
    ]
    late = {"gpu-1": ["straggler: node rank 1, local rank 0 (pod j-worker-1) kept its peers waiting 62%"]}
    health = node_health(pods, {}, late)
    assert health is not None and not health.healthy
    assert health.message() == (
        "node gpu-1 (pods j-worker-1): straggler: node rank 1, local rank 0 (pod j-worker-1) kept its peers waiting 62%"
    )
    # Without node access only the lateness was read, and the healthy message says so.
    only_lateness = node_health(pods, None, {})
    assert only_lateness is not None and only_lateness.message() == (
        "no rank keeps its peers waiting on the 2 node(s) of the training's pods"
    )
    both = node_health(pods, {}, {})
    assert both is not None and both.message() == (
        "no node condition reports a problem and no rank keeps its peers waiting on the 2 node(s) of the "
        "training's pods"
    )
    assert node_health(pods, None, None) is None  # nothing read, nothing said
