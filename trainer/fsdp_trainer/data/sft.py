"""Packing for supervised fine-tuning (``data.format`` chat and prompt-completion).

A row becomes one ``Document``: its tokens and, per token, whether the loss
trains on predicting it (assistant turns, the completion). Whole documents are
packed, in order, into sequences of ``seqLen`` (input, label) pairs: a
document of n tokens fills n - 1 positions, and when the next one does not
fit the sequence is closed with padding. A row is never split across two
sequences, so every trained token sees its whole prompt; only a row longer
than one sequence is cut (or dropped) per ``data.overlong``, and counted.

Each sequence carries per-document position ids that restart at 0; the train
loop turns them into attention that never crosses a document boundary
(``attention.py``). Padding is one more such "document": label IGNORE_INDEX,
attended by nothing else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from .document import Document
from .packing import IGNORE_INDEX, Batch

__all__ = ["Document", "DocumentPacker", "RowCounts", "stack_sequences"]

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    key: str
    doc: Document

    @property
    def positions(self) -> int:
        return self.doc.positions


@dataclass
class RowCounts:
    """Rows this rank has read, and what happened to those not packed whole."""

    rows: int = 0
    truncated: int = 0  # longer than seqLen + 1 tokens, cut (overlong: truncate)
    dropped: int = 0  # longer than seqLen + 1 tokens, skipped (overlong: drop)
    untrained: int = 0  # no token to train on (no assistant turn; or cut before it)

    def as_dict(self) -> dict[str, int]:
        return {"rows": self.rows, "truncated": self.truncated, "dropped": self.dropped, "untrained": self.untrained}


@dataclass
class DocumentPacker:
    """Whole documents, in order, into padded sequences of ``seq_len`` positions."""

    seq_len: int
    overlong: Literal["truncate", "drop"]
    pad_id: int
    where: str = ""  # names the rank in log lines
    pending: list[_Pending] = field(default_factory=list)
    counts: RowCounts = field(default_factory=RowCounts)

    def add(self, key: str, doc: Document) -> None:
        self.counts.rows += 1
        if doc.positions > self.seq_len:
            if self.overlong == "drop":
                self.counts.dropped += 1
                self._report("dropped", self.counts.dropped, key, len(doc.tokens))
                return
            self.counts.truncated += 1
            self._report("truncated", self.counts.truncated, key, len(doc.tokens))
            doc = self._truncated(doc)
        if not all(any(part.trained[1:]) for part in doc.parts()):
            # Nothing to learn from it (for a pair: from one of its answers); packing it would only spend compute.
            self.counts.untrained += 1
            return
        self.pending.append(_Pending(key, doc))

    def _truncated(self, doc: Document) -> Document:
        """Each sequence cut to its first share of the ``seq_len`` positions (one sequence: seqLen + 1 tokens)."""
        parts = doc.parts()
        limit = self.seq_len // len(parts) + 1
        return Document.joined([Document(p.tokens[:limit], p.trained[:limit]) for p in parts])

    def _report(self, action: str, count: int, key: str, length: int) -> None:
        # Every power of two: never silent, never a line per row.
        if count & (count - 1) == 0:
            log.warning(
                "%s%s %d row(s) longer than seqLen + 1 = %d tokens so far (data.overlong); latest: %s, %d tokens",
                self.where,
                action,
                count,
                self.seq_len + 1,
                key,
                length,
            )

    def ready(self) -> bool:
        """Whether the next sequence is complete: it is full, or the next document does not fit."""
        used = 0
        for p in self.pending:
            used += p.positions
            if used >= self.seq_len:
                return True
        return False

    def take(self) -> tuple[list[int], list[int], list[int], str]:
        """The next sequence (inputs, labels, position ids, sample id); padded if not full."""
        taken: list[_Pending] = []
        used = 0
        while self.pending and used + self.pending[0].positions <= self.seq_len:
            p = self.pending.pop(0)
            taken.append(p)
            used += p.positions
        if not taken:
            raise RuntimeError("no document to take")
        inputs: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for part in (part for p in taken for part in p.doc.parts()):
            tokens, trained = part.tokens, part.trained
            inputs += tokens[:-1]
            labels += [t if keep else IGNORE_INDEX for t, keep in zip(tokens[1:], trained[1:], strict=True)]
            positions += range(part.positions)
        pad = self.seq_len - len(inputs)
        inputs += [self.pad_id] * pad
        labels += [IGNORE_INDEX] * pad
        positions += range(pad)
        return inputs, labels, positions, "+".join(p.key for p in taken)

    def state_dict(self) -> dict[str, Any]:
        return {
            "pending": [
                {
                    "key": p.key,
                    "tokens": torch.tensor(p.doc.tokens, dtype=torch.int32),
                    "trained": torch.tensor(p.doc.trained, dtype=torch.bool),
                    "splits": torch.tensor(p.doc.splits, dtype=torch.int64),
                }
                for p in self.pending
            ],
            "counts": self.counts.as_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = [
            _Pending(s["key"], Document(s["tokens"].tolist(), s["trained"].tolist(), _splits(s)))
            for s in state["pending"]
        ]
        self.counts = RowCounts(**{k: int(v) for k, v in state["counts"].items()})


def _splits(saved: dict[str, Any]) -> tuple[int, ...]:
    # Checkpoints written before preference pairs existed have no splits: one sequence per document.
    splits = saved.get("splits")
    return () if splits is None else tuple(int(x) for x in splits.tolist())


def stack_sequences(sequences: list[tuple[list[int], list[int], list[int], str]]) -> Batch:
    inputs = torch.tensor([s[0] for s in sequences], dtype=torch.long)
    labels = torch.tensor([s[1] for s in sequences], dtype=torch.long)
    positions = torch.tensor([s[2] for s in sequences], dtype=torch.long)
    return Batch(
        inputs=inputs,
        labels=labels,
        sample_ids=[s[3] for s in sequences],
        position_ids=positions,
        trained_tokens=int((labels != IGNORE_INDEX).sum()),
    )
