"""The rule that a path in the pod has no ``.`` or ``..`` segment, written once for every path field.

A path with such a segment names another directory than it reads as
(``/checkpoints/../data``), so a rule that compares paths (dir against a
mount, resumeFrom against dir) could be passed by one that means the same
directory. The pattern is the same for Python's ``re`` and CEL's ``matches``.
"""

from __future__ import annotations

import re

from ..rules import Rule

DOT_SEGMENT = r"(^|/)\.\.?(/|$)"
# As a CEL string literal inside single quotes: each backslash doubled.
DOT_SEGMENT_CEL = DOT_SEGMENT.replace("\\", "\\\\")


def no_dot_segments_rule(field: str, attr: str | None = None, *, also_takes_urls: bool = False) -> Rule:
    """``field`` (its spec name; ``attr``: the model's, when it differs) has no ``.`` or ``..`` segment.

    ``also_takes_urls``: the field takes an ``s3://`` URI too, which its own rule checks (one line per mistake).
    """
    attr = attr or field
    guard = f" || !self.{field}.startsWith('/')" if also_takes_urls else ""

    def check(m: object) -> bool:
        value = getattr(m, attr) or ""
        return (also_takes_urls and not value.startswith("/")) or re.search(DOT_SEGMENT, value) is None

    return Rule(
        # has(): the API server also checks the schema's default ({}) before it is filled.
        cel=f"!has(self.{field}){guard} || !self.{field}.matches('{DOT_SEGMENT_CEL}')",
        message=f"{field} must not contain . or .. segments",
        field_path=f".{field}",
        check=check,
    )
