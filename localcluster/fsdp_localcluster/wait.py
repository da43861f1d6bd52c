"""The bounded waits of the local cluster, its users and its tests: for a condition, and for a server to answer."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
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


def wait_until_answers(proc: subprocess.Popen[bytes], url: str, timeout: float, what: str, log: Path) -> None:
    """Until ``url`` answers 200 (a server's health page); RuntimeError with ``log``'s tail if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer within {timeout:g} s:\n{tail(log)}")


def tail(log: Path, lines: int = 30) -> str:
    """The last lines of a process's log file ("" when there is none)."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""
