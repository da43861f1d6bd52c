"""Packing: documents -> tokens -> fixed-length windows, with no padding.

Each document is tokenized as ``[bos] text [eos]`` and appended to a token
stream that is cut into windows of ``seqLen + 1`` tokens (inputs are the first
seqLen, labels the last seqLen), so every label is a real token and no padding
is ever needed. A window's sample id names the document and token offset of
its first token, which the resume tests compare. (That is ``data.format: text``;
the supervised formats pack whole rows instead: ``sft.py``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

# The label of a position the loss skips (prompt, padding): cross_entropy's default ignore_index.
IGNORE_INDEX = -100


@dataclass
class Batch:
    inputs: torch.Tensor  # [micro_batch, seq_len] int64
    labels: torch.Tensor  # [micro_batch, seq_len] int64, IGNORE_INDEX where not trained
    sample_ids: list[str]  # "<document key>@<token offset>" of each window's first token
    # Per-document positions of packed rows (restarting at 0); None: one token
    # stream, every position attends to all before it (data.format text).
    position_ids: torch.Tensor | None = None
    # Labels that are not IGNORE_INDEX, counted where the batch is made (no
    # device sync later); None: all of them.
    trained_tokens: int | None = None

    @property
    def num_tokens(self) -> int:
        return self.labels.numel()

    @property
    def num_trained(self) -> int:
        return self.num_tokens if self.trained_tokens is None else self.trained_tokens

    def to(self, device: torch.device) -> Batch:
        if device.type != "cuda":
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            # From pinned memory the copy is asynchronous: it overlaps the forward.
            return t.pin_memory().to(device, non_blocking=True)

        positions = None if self.position_ids is None else move(self.position_ids)
        return Batch(move(self.inputs), move(self.labels), self.sample_ids, positions, self.trained_tokens)


@dataclass
class _Segment:
    key: str
    start: int  # token offset of tokens[0] within its document
    tokens: list[int]


@dataclass
class Packer:
    """Concatenates documents and cuts windows of ``window`` tokens."""

    window: int
    segments: list[_Segment] = field(default_factory=list)

    @property
    def buffered(self) -> int:
        return sum(len(s.tokens) for s in self.segments)

    def add(self, key: str, tokens: list[int]) -> None:
        if tokens:
            self.segments.append(_Segment(key, 0, tokens))

    def take(self) -> tuple[list[int], str]:
        first = self.segments[0]
        sample_id = f"{first.key}@{first.start}"
        out: list[int] = []
        while len(out) < self.window:
            seg = self.segments[0]
            need = self.window - len(out)
            out.extend(seg.tokens[:need])
            if need >= len(seg.tokens):
                self.segments.pop(0)
            else:
                self.segments[0] = _Segment(seg.key, seg.start + need, seg.tokens[need:])
        return out, sample_id

    def state_dict(self) -> list[dict[str, Any]]:
        return [
            {"key": s.key, "start": s.start, "tokens": torch.tensor(s.tokens, dtype=torch.int32)} for s in self.segments
        ]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self.segments = [_Segment(s["key"], int(s["start"]), s["tokens"].tolist()) for s in state]


def encode(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """``[bos] text [eos]`` per document (bos only if the tokenizer has one)."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id]
    return [bos + doc + eos for doc in ids]


def stack_windows(windows: list[list[int]], ids: list[str]) -> Batch:
    t = torch.tensor(windows, dtype=torch.long)
    return Batch(inputs=t[:, :-1].contiguous(), labels=t[:, 1:].contiguous(), sample_ids=ids)
