"""Reading a run that was killed and resumed: its trace per attempt, and the steps that count."""

from __future__ import annotations

from typing import Any

from tests.trainer.harness import RunResult


def split_attempts(run: RunResult, rank: int) -> list[list[dict[str, Any]]]:
    """The trace split at each (re)start of the trainer."""
    out: list[list[dict[str, Any]]] = []
    for record in run.trace(rank):
        if record["event"] == "start":
            out.append([])
        out[-1].append(record)
    return out


def effective_steps(run: RunResult, rank: int) -> list[dict[str, Any]]:
    """Step records that count: each attempt's steps up to where the next attempt resumed."""
    attempts = split_attempts(run, rank)
    steps: list[dict[str, Any]] = []
    for i, attempt in enumerate(attempts):
        resume_at = attempts[i + 1][0]["step"] if i + 1 < len(attempts) else None
        steps += [r for r in attempt if r["event"] == "step" and (resume_at is None or r["step"] <= resume_at)]
    return steps
