"""``Document``: one row's tokens and which of them the loss trains.

Torch-free, so the format classes (``formats/``) that make documents import
nothing heavy; ``sft.py`` packs them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Document:
    """One row's tokens; ``trained[i]``: the loss counts the prediction of ``tokens[i]``."""

    tokens: list[int]
    trained: list[bool]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.trained):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.trained)} trained flags")
