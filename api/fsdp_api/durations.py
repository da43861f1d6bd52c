"""How a duration reads for people: the trainer's ETA in its log line and the status's time left."""

from __future__ import annotations

import math


def format_duration(seconds: float) -> str:
    """Compact h/m/s: 3h02m, 4m05s, 42s; ``?`` when unknown (negative, NaN, infinite)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
