"""The stall rules (controller/stall/rules.py) and the Stalled condition they produce, as numbers."""

from __future__ import annotations

import pytest
from fsdp_api.spec import StallSpec
from fsdp_operator.controller.stall import StallRules, StepClock, observe, observe_unreachable, start_clock, verdict
from fsdp_operator.controller.status.compute import Observations, compute_status, transition_events

from tests.operator.status_fixtures import facts

SPEC = StallSpec(step_time_factor=10, min_seconds=30, startup_seconds=600, checkpoint_seconds=120)
RULES = StallRules(spec=SPEC, checkpoint_interval=50, eval_interval=0, max_steps=1000)


def run_steps(times_and_steps: list[tuple[float, int | None]], rules: StallRules = RULES) -> StepClock:
    clock = start_clock(times_and_steps[0][0])
    for now, step in times_and_steps:
        clock = observe(clock, step, now, rules)
    return clock


def test_steady_steps_give_the_step_time_and_a_limit_of_factor_times_it() -> None:
    # First step seen at t=100 (warm-up excluded), then 2 s per step, scraped every 10 s.
    clock = run_steps([(0, None), (100, 1), (110, 6), (120, 11), (130, 16)])
    assert clock.seconds_per_step == pytest.approx(2.0)
    # 10 x 2 s = 20 s is below the floor: the floor (30 s) applies.
    assert verdict(clock, RULES, 130 + 30).stalled is False
    v = verdict(clock, RULES, 130 + 31)
    assert v.stalled and v.limit == 30 and v.step == 16
    assert v.message() == "no new step since step 16 for 31 s (limit 30 s)"


def test_slow_steps_scale_the_limit() -> None:
    clock = run_steps([(0, None), (100, 1), (200, 3), (300, 5)])  # 50 s per step
    assert clock.seconds_per_step == pytest.approx(50.0)
    assert verdict(clock, RULES, 300 + 499).stalled is False
    assert verdict(clock, RULES, 300 + 501).stalled is True


def test_start_up_has_its_own_allowance() -> None:
    clock = start_clock(0)
    assert verdict(clock, RULES, 599).stalled is False
    v = verdict(clock, RULES, 601)
    assert v.stalled and v.limit == 600
    assert v.message() == "no new step since the start (no step reported yet) for 601 s (limit 600 s)"
    # One step seen, no step time yet: still the start-up allowance.
    clock = observe(clock, 1, 100, RULES)
    assert verdict(clock, RULES, 100 + 599).stalled is False


def test_the_trainers_own_step_time_stands_in_until_the_operator_has_one() -> None:
    clock = observe(start_clock(0), 7, 100, RULES, reported=4.0)
    assert clock.seconds_per_step is None and clock.reported == 4.0
    assert verdict(clock, RULES, 100 + 40).stalled is False
    assert verdict(clock, RULES, 100 + 41).stalled is True  # 10 x 4 s
    measured = observe(clock, 12, 110, RULES, reported=4.0)
    assert verdict(measured, RULES, 110 + 31).stalled is True  # its own 2 s per step (floor 30 s) wins


def test_a_checkpoint_step_gets_the_save_allowance_and_gives_no_step_time() -> None:
    clock = run_steps([(0, None), (100, 40), (110, 45), (120, 50)])  # 2 s per step, step 50 saves
    assert verdict(clock, RULES, 120 + 30 + 120).stalled is False
    assert verdict(clock, RULES, 120 + 30 + 121).stalled is True
    # The save took 100 s: the interval across it is no step time.
    after = observe(clock, 51, 220, RULES)
    assert after.seconds_per_step == pytest.approx(2.0)
    assert verdict(after, RULES, 220 + 31).stalled is True


def test_a_script_of_your_own_gets_the_save_allowance_at_every_step_and_no_start_up_verdict() -> None:
    script = StallRules(spec=SPEC, checkpoint_interval=50, own_script=True)
    # A script that reports no step (it need not follow the metrics contract) is never called stalled.
    assert verdict(start_clock(0), script, 10_000).stalled is False
    assert verdict(start_clock(0), RULES, 10_000).stalled is True
    # Its saves are at steps the operator cannot know: every step gets checkpointSeconds on top.
    clock = observe(start_clock(0), 7, 100, script, reported=2.0)
    assert verdict(clock, script, 100 + 30 + 120).stalled is False
    v = verdict(clock, script, 100 + 30 + 121)
    assert v.stalled and v.limit == 150
    # Its step time then comes from its own histogram only (every interval may hold a save).
    assert observe(clock, 12, 110, script, reported=2.0).seconds_per_step is None


def test_stall_rules_know_a_script_of_your_own_from_the_spec() -> None:
    from fsdp_operator.controller.stall_check import stall_rules

    assert stall_rules({"command": ["/workspace/train.py"]}).own_script is True
    assert stall_rules({"model": {"preset": "tiny"}, "training": {"maxSteps": 5}}).own_script is False


def test_a_restart_is_seen_as_a_start() -> None:
    clock = run_steps([(0, None), (100, 10), (110, 15), (120, 20)])
    # The trainer restarted: no step for a while, then an older step (resumed from a checkpoint).
    gone = observe(clock, None, 130, RULES)
    assert gone.step is None and gone.changed_at == 130
    assert verdict(gone, RULES, 130 + 599).stalled is False
    back = observe(gone, 18, 300, RULES)
    assert back.step == 18 and back.seconds_per_step == pytest.approx(2.0)
    # A step reported after the restart is past the warm-up: the step time's limit applies again.
    assert verdict(back, RULES, 300 + 30).stalled is False
    assert verdict(back, RULES, 300 + 31).stalled is True
    moving = observe(back, 19, 310, RULES)
    # The first interval after the restart enters the average: 0.7 x 2 + 0.3 x 10.
    assert moving.seconds_per_step == pytest.approx(4.4)
    assert verdict(moving, RULES, 310 + 44).stalled is False
    assert verdict(moving, RULES, 310 + 45).stalled is True


def test_boundaries_include_validation_and_the_last_step() -> None:
    rules = StallRules(spec=SPEC, checkpoint_interval=100, eval_interval=30, max_steps=95)
    assert [s for s in range(1, 101) if rules.boundary_at(s)] == [30, 60, 90, 95, 96, 97, 98, 99, 100]
    assert rules.boundary_in(31, 59) is False and rules.boundary_in(31, 60) is True


# A two-node training with a claim: the facts the status needs, read as the operator reads them.
FACTS = facts(training={"maxSteps": 1000}, resources={"nodes": 2, "gpusPerNode": 1}, checkpoint={"claimName": "ckpt"})
RUNNING_JOB = {
    "metadata": {"name": "t", "annotations": {"training.fsdp.dev/generation": "1"}},
    "status": {"conditions": [{"type": "Running", "status": "True", "reason": "Running"}]},
}


def test_stalled_condition_message_and_events() -> None:
    clock = run_steps([(0, None), (100, 1), (110, 6), (120, 11)])
    stalled = verdict(clock, RULES, 200)
    before = compute_status(FACTS, RUNNING_JOB, None, Observations(now="2026-01-01T00:00:00Z")).model_dump(
        by_alias=True
    )
    status = compute_status(
        FACTS, RUNNING_JOB, before, Observations(stall=stalled, stall_restarts=1, now="2026-01-01T00:01:00Z")
    )
    cond = {c.type: c for c in status.conditions}["Stalled"]
    assert (cond.status, cond.reason) == ("True", "NoProgress")
    assert status.message == cond.message == "no new step since step 11 for 80 s (limit 30 s)"
    assert status.stall_restarts == 1
    events = transition_events(before, status)
    assert [(e.type, e.reason) for e in events] == [("Warning", "Stalled")]
    # Kept by a status write that does not know (a job event), cleared by progress.
    stored = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    again = compute_status(FACTS, RUNNING_JOB, stored, Observations(now="2026-01-01T00:02:00Z"))
    assert {c.type: c.status for c in again.conditions}["Stalled"] == "True" and again.stall_restarts == 1
    moving = verdict(observe(clock, 12, 300, RULES), RULES, 301)
    cleared = compute_status(FACTS, RUNNING_JOB, stored, Observations(stall=moving, now="2026-01-01T00:03:00Z"))
    assert {c.type: (c.status, c.reason) for c in cleared.conditions}["Stalled"] == ("False", "Progressing")
    assert [(e.type, e.reason) for e in transition_events(stored, cleared)] == [("Normal", "StallCleared")]
    # A finished job has no Stalled condition.
    done = {**RUNNING_JOB, "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}
    assert "Stalled" not in {c.type for c in compute_status(FACTS, done, stored).conditions}


def test_an_unreadable_endpoint_past_the_limit_is_unknown_not_stalled() -> None:
    clock = run_steps([(0, None), (100, 1), (110, 6), (120, 11)])  # 2 s per step: limit 30 s
    blind = observe_unreachable(observe_unreachable(clock, 130, "refused"), 140, "timed out")
    assert blind.unreachable_since == 130 and blind.unreachable == "timed out" and blind.step == 11
    v = verdict(blind, RULES, 200)
    assert not v.stalled and v.unreachable == "timed out" and v.limit == 30
    # Within the limit it is just progressing; a successful read forgets the blind spell.
    assert not verdict(blind, RULES, 140).unreachable
    seen = observe(blind, 11, 210, RULES)
    assert seen.unreachable_since is None and verdict(seen, RULES, 210).stalled
