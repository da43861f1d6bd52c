"""Cutting a batch into a context rank's part of every row (``parallelism.context``).

The rank keeps the tokens at ``parallel.context_parallel.chunk_positions``
(an early and a late chunk of each row), their labels, and their positions in
the row (per document in packed rows), which the model's rotary or learned
position embeddings read. The whole rows' document indices go with them:
the context-parallel attention masks keys of other documents with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..parallel.context_parallel import chunk_positions
from .attention import document_ids
from .packing import IGNORE_INDEX, Batch

__all__ = ["ContextBatch", "chunk_positions", "split_rows"]


@dataclass
class ContextBatch(Batch):
    """A rank's tokens of a batch, with the document index of every token of the whole rows."""

    row_documents: torch.Tensor | None = None  # [batch, seqLen]; None: one token stream

    def to(self, device: torch.device) -> ContextBatch:
        moved = super().to(device)
        documents = None if self.row_documents is None else self.row_documents.to(device)
        fields = (moved.inputs, moved.labels, moved.sample_ids, moved.position_ids, moved.trained_tokens)
        return ContextBatch(*fields, documents)

    def model_inputs(self) -> dict[str, object]:
        """What the model is called with besides the input ids: the tokens' positions in their rows."""
        return {"position_ids": self.position_ids, "use_cache": False}


def split_rows(batch: Batch, positions: torch.Tensor) -> ContextBatch:
    """The tokens of ``batch`` (host tensors) at ``positions`` of every row."""
    rows = batch.inputs.shape[0]
    labels = batch.labels[:, positions]
    if batch.position_ids is None:
        in_row, documents = positions.expand(rows, -1), None
    else:
        in_row, documents = batch.position_ids[:, positions], document_ids(batch.position_ids)
    trained = None if batch.trained_tokens is None else int((labels != IGNORE_INDEX).sum())
    return ContextBatch(batch.inputs[:, positions], labels, batch.sample_ids, in_row, trained, documents)
