"""The one bounded wait of the local cluster, its users and its tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A bounded wait ran out; the message says what was awaited and what was seen last."""


def wait_for(check: Callable[[], T | None], timeout: float, what: str, *, interval: float = 0.5) -> T:
    """Poll ``check`` until it returns something truthy, and return that; raise WaitTimeout after ``timeout`` s.

    An exception from ``check`` counts as a falsy answer (a transient API error,
    or an ``assert`` that explains what is still missing); the last answer or
    exception is in the timeout's message.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            result = check()
            if result:
                return result
            last = result
        except Exception as e:
            last = e
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)
