"""What happened to the rows of the supervised formats: the run record's fields and the closing log line."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from ..metrics.stats import StepStats
from .loader import row_counts

log = logging.getLogger(__name__)


def step_rows(stats: StepStats, data_state: dict[str, Any]) -> dict[str, object]:
    """Trace fields of a step with packed rows: trained tokens, this rank's rows so far, the pairs' stats."""
    record: dict[str, object] = {"trained_tokens": stats.trained_tokens, "rows": row_counts(data_state)}
    if stats.preference is not None:
        record["preference"] = asdict(stats.preference)
    return record


def log_rows(data_state: dict[str, Any], rank: int, seq_len: int) -> None:
    """Every rank's line of its rows read, cut, skipped and untrained (nothing for plain text)."""
    counts = row_counts(data_state)
    if counts:
        # A warning when rows were cut or skipped: every rank's line shows, not only rank 0's.
        log.log(
            logging.WARNING if counts["truncated"] or counts["dropped"] else logging.INFO,
            "rank %d rows: %d read, %d truncated and %d dropped (longer than seqLen + 1 = %d tokens), "
            "%d with nothing to train on",
            rank,
            counts["rows"],
            counts["truncated"],
            counts["dropped"],
            seq_len + 1,
            counts["untrained"],
        )
