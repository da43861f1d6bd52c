"""Figures measured by the end-to-end tests (phase times, steps/s), reported at the end of the session.

tests/e2e/conftest.py prints them and writes ``runs/e2e-timings.json``, the
figures docs/e2e.md quotes.
"""

from __future__ import annotations

from typing import Any

TIMINGS: dict[str, Any] = {}


def record(name: str, value: float | int | str) -> None:
    """Keep one measured figure for the end-of-session report."""
    TIMINGS[name] = round(value, 2) if isinstance(value, float) else value
