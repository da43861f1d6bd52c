"""``Document``: one row's tokens and which of them the loss trains.

A row may hold several sequences that are trained side by side but never
attend to each other: a preference pair is its prompt + chosen answer, then
its prompt + rejected answer. ``splits`` marks where each sequence after the
first starts; the packer keeps them in the same packed sequence, each with
its own positions.

Torch-free, so the format classes (``formats/``) that make documents import
nothing heavy; ``sft.py`` packs them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass
class Document:
    """One row's tokens; ``trained[i]``: the loss counts the prediction of ``tokens[i]``."""

    tokens: list[int]
    trained: list[bool]
    splits: tuple[int, ...] = ()  # token offsets where a further, separately attended sequence starts

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.trained):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.trained)} trained flags")
        bounds = (0, *self.splits, len(self.tokens))
        if self.splits and any(b - a < 2 for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"every sequence of a document needs 2 tokens or more, splits {self.splits}")

    def parts(self) -> list[Document]:
        """The document's sequences, each a document of its own."""
        bounds = (0, *self.splits, len(self.tokens))
        return [Document(self.tokens[a:b], self.trained[a:b]) for a, b in itertools.pairwise(bounds)]

    @property
    def positions(self) -> int:
        """(input, label) pairs it fills: each sequence's last token is only a label."""
        return len(self.tokens) - 1 - len(self.splits)

    @classmethod
    def joined(cls, parts: list[Document]) -> Document:
        """Sequences side by side in one document (kept together when packed)."""
        tokens: list[int] = []
        trained: list[bool] = []
        splits: list[int] = []
        for part in parts:
            if tokens:
                splits.append(len(tokens))
            tokens += part.tokens
            trained += part.trained
        return cls(tokens, trained, tuple(splits))
