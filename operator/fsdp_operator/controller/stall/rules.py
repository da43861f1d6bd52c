"""When is a running training stalled? Pure functions over the steps the operator has seen.

The operator reads the trainer's step from its metrics on every scrape tick.
A ``StepClock`` per training remembers the last step and when it changed
(the operator's own monotonic clock: no clock skew with the nodes), and the
recent time per step. A training is stalled when its step has not changed
for longer than the allowance:

- ``stepTimeFactor`` x the recent step time, and at least ``minSeconds``;
- plus ``checkpointSeconds`` when the last step saves a checkpoint or runs
  validation (a slow save is alive, not stalled);
- ``startupSeconds`` instead, until the trainer reports a step after a
  start or restart (loading the model and the checkpoint, the first step).

The step time is the operator's own measure across scrapes; until it has
one, the trainer's mean step time (its step-duration histogram) stands in.

The clock lives in memory: an operator restart starts every clock afresh,
which can delay a detection but never causes a false one.

An endpoint the operator cannot read (a network policy, a namespace it may
not scrape, a blip) is not a stalled trainer: the clock keeps its last step,
and past the limit the verdict is "unknown", never "stalled", so no pod is
restarted for what the operator cannot see. A trainer hung inside its own
process is the trainer's watchdog's to catch (``trainerStepTimeoutSeconds``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fsdp_api.spec import StallSpec

# Weight of the newest sample in the recent step time: a few steps of history,
# quick to follow a real change of pace.
EMA_WEIGHT = 0.3


@dataclass(frozen=True)
class StepClock:
    step: int | None  # last step seen; None: none since the (re)start
    changed_at: float  # when it last changed, or when the clock (re)started
    seconds_per_step: float | None = None  # measured by the operator across scrapes
    reported: float | None = None  # the trainer's own mean step time, until the operator has measured one
    unreachable_since: float | None = None  # the endpoint has not answered since then
    unreachable: str = ""  # why, as the last failed read said


def start_clock(now: float) -> StepClock:
    return StepClock(step=None, changed_at=now)


@dataclass(frozen=True)
class StallRules:
    """A training's stall settings and the steps after which it saves or validates."""

    spec: StallSpec
    checkpoint_interval: int
    eval_interval: int = 0
    max_steps: int | None = None
    # A script of your own (spec.command): which steps save is unknown, so every
    # step gets the checkpoint allowance; and a script need not report steps at
    # all, so one that has reported none is never called stalled.
    own_script: bool = False

    def _multiple_in(self, every: int, first: int, last: int) -> bool:
        return every > 0 and last >= first and last // every >= -(-first // every)

    def boundary_in(self, first: int, last: int) -> bool:
        """Whether a step in [first, last] is followed by a checkpoint save or a validation."""
        first = max(first, 1)
        if self.own_script and last >= first:
            return True
        if self.max_steps is not None and last >= self.max_steps:
            return True
        return self._multiple_in(self.checkpoint_interval, first, last) or self._multiple_in(
            self.eval_interval, first, last
        )

    def boundary_at(self, step: int | None) -> bool:
        return step is not None and self.boundary_in(step, step)


def observe(
    clock: StepClock, step: int | None, now: float, rules: StallRules, reported: float | None = None
) -> StepClock:
    """The clock after one scrape that read ``step`` (None: the trainer reports no step).

    No step, or a step lower than before, means the trainer (re)started: the
    start-up allowance applies until it reports a step again. Any step it
    reports is past its warm-up (step 1 includes that), so the next interval
    is a fair sample, unless it spans a save or a validation. ``reported``:
    the trainer's own mean step time, used until the operator has a sample.
    """
    clock = replace(clock, unreachable_since=None, unreachable="")
    if reported is not None and reported > 0:
        clock = replace(clock, reported=reported)
    if step is None:
        return clock if clock.step is None else replace(clock, step=None, changed_at=now)
    if clock.step is None or step < clock.step:
        return replace(clock, step=step, changed_at=now)
    if step == clock.step:
        return clock
    if rules.boundary_in(clock.step, step - 1):
        return replace(clock, step=step, changed_at=now)
    sample = (now - clock.changed_at) / (step - clock.step)
    old = clock.seconds_per_step
    rate = sample if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * sample
    return replace(clock, step=step, changed_at=now, seconds_per_step=rate)


def observe_unreachable(clock: StepClock, now: float, why: str) -> StepClock:
    """The clock after a scrape that could not read the endpoint: its step unknown, not stopped."""
    return replace(clock, unreachable_since=clock.unreachable_since or now, unreachable=why)


def allowance(clock: StepClock, rules: StallRules) -> float:
    """Seconds without a new step before the training counts as stalled."""
    spec = rules.spec
    rate = clock.seconds_per_step if clock.seconds_per_step is not None else clock.reported
    if clock.step is None or rate is None:
        base = float(spec.startup_seconds)
    else:
        base = max(float(spec.min_seconds), spec.step_time_factor * rate)
    return base + (spec.checkpoint_seconds if rules.boundary_at(clock.step) else 0.0)


@dataclass(frozen=True)
class StallVerdict:
    stalled: bool
    seconds: float  # without a new step
    limit: float
    step: int | None
    note: str = ""  # what the operator did about it
    unreachable: str = ""  # set: past the limit, but the endpoint does not answer (why): unknown, not stalled
    ranks: str = ""  # where each rank stands (ranks.py), read when the stall is first seen

    def message(self) -> str:
        where = f"step {self.step}" if self.step is not None else "the start (no step reported yet)"
        if self.unreachable:
            text = (
                f"no new step seen since {where} for {self.seconds:.0f} s (limit {self.limit:.0f} s), but the "
                f"trainer's metrics cannot be read ({self.unreachable}): not called stalled, nothing restarted"
            )
        elif self.stalled:
            text = f"no new step since {where} for {self.seconds:.0f} s (limit {self.limit:.0f} s)"
            text += f"; {self.ranks}" if self.ranks else ""
        else:
            # No step number: the condition is written when it changes, not at every step.
            text = "progressing" if self.step is not None else "starting: no step reported yet"
        return f"{text}; {self.note}" if self.note else text


def verdict(clock: StepClock, rules: StallRules, now: float) -> StallVerdict:
    limit = allowance(clock, rules)
    seconds = max(0.0, now - clock.changed_at)
    silent_script = rules.own_script and clock.step is None
    past = seconds > limit and not silent_script
    if past and clock.unreachable_since is not None:
        return StallVerdict(False, seconds, limit, clock.step, unreachable=clock.unreachable)
    return StallVerdict(past, seconds, limit, clock.step)
