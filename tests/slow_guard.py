"""A pytest plugin for the unit tier (``make test-unit``): a test that takes long without the ``slow`` marker fails.

The unit tier is what a developer runs between edits, so it stays at a few
minutes only while every test in it is quick; a test that grows past that
limit without saying so (the ``slow`` marker) fails with one line naming its
cost, rather than slowing the tier unnoticed.

What is measured is the CPU time the test's call spends, in this process and
in the children it waited for (a ``torchrun``, a compiler), not the wall
clock: on a machine shared with other jobs (CI's, at a load of 5-10) the wall
clock of a quick test stretches several times over, its CPU time hardly. A
test that mostly waits (a sleep standing in for an event) spends little CPU,
so the wall clock has a limit too, far enough above the CPU one that load
alone does not reach it.

Limits: ``FSDP_SLOW_CPU_SECONDS`` (5) and ``FSDP_SLOW_WALL_SECONDS`` (60).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Generator

import pytest

EXEMPT_MARKERS = ("slow", "integration", "e2e", "cluster")


def _limit(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise pytest.UsageError(f"{name}={raw!r} is not a number of seconds") from None


def _cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    if any(item.get_closest_marker(name) for name in EXEMPT_MARKERS):
        return (yield)
    cpu_limit = _limit("FSDP_SLOW_CPU_SECONDS", 5.0)
    wall_limit = _limit("FSDP_SLOW_WALL_SECONDS", 60.0)
    cpu0, wall0 = _cpu_seconds(), time.monotonic()
    result = yield  # a failing test raises here: its own failure says more
    cpu, wall = _cpu_seconds() - cpu0, time.monotonic() - wall0
    if cpu > cpu_limit or wall > wall_limit:
        pytest.fail(
            f"took {cpu:.1f} s of CPU and {wall:.1f} s of wall time, over the unit tier's "
            f"{cpu_limit:g} s of CPU or {wall_limit:g} s of wall time: mark it slow "
            "(@pytest.mark.slow) or make it quicker",
            pytrace=False,
        )
    return result
