"""This rank's batches: training batches that resume exactly, and fixed validation batches.

Resume. ``state_dict()`` is the position after the last batch handed out: the
epoch, the next document position (or the streamed dataset's own state) and
the tokens already read but not yet used. Loading it continues with exactly the
next window, so a resumed run neither repeats nor skips a sample.
"""

from __future__ import annotations

import logging
from typing import Any

from fsdp_api.spec import DataSpec
from transformers import PreTrainedTokenizerBase

from .packing import Batch, Packer, encode, stack_windows
from .sources import MapDocuments, StreamDocuments, is_iterable, open_dataset, validation_texts

log = logging.getLogger(__name__)

# Documents tokenized per call: the fast tokenizer batches (and releases the GIL).
TOKENIZE_CHUNK = 64


class TrainData:
    """This rank's stream of training batches."""

    def __init__(
        self,
        spec: DataSpec,
        tokenizer: PreTrainedTokenizerBase,
        *,
        seq_len: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        ds = open_dataset(spec)
        holdout = spec.validation_split is None
        self.rank, self.world_size = rank, world_size
        self.micro_batch_size = micro_batch_size
        self.tokenizer = tokenizer
        if is_iterable(ds):
            self.docs: MapDocuments | StreamDocuments = StreamDocuments(ds, spec.text_field, rank, world_size, holdout)
        else:
            self.docs = MapDocuments(ds, spec.text_field, rank, world_size, seed, holdout)
        self.packer = Packer(window=seq_len + 1)

    def next_batch(self) -> Batch:
        windows, ids = [], []
        while len(windows) < self.micro_batch_size:
            start_epoch = self.docs.epoch
            while self.packer.buffered < self.packer.window:
                if self.docs.epoch > start_epoch + 1:
                    raise ValueError(
                        f"rank {self.rank}'s documents hold fewer tokens than one sequence "
                        f"({self.packer.window} with the next-token label): add data or lower training.seqLen"
                    )
                chunk = self.docs.next_chunk(TOKENIZE_CHUNK)
                for (key, _), tokens in zip(chunk, encode(self.tokenizer, [t for _, t in chunk]), strict=True):
                    self.packer.add(key, tokens)
            w, sid = self.packer.take()
            windows.append(w)
            ids.append(sid)
        return stack_windows(windows, ids)

    def state_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "docs": self.docs.state_dict(),
            "buffer": self.packer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["world_size"]) != self.world_size or int(state["rank"]) != self.rank:
            # Another world size splits the documents differently; the exact
            # position cannot be mapped, so start the next epoch afresh rather
            # than repeat documents of the current one.
            epoch = int(state["docs"]["epoch"]) + 1
            log.warning(
                "data position saved with world size %s cannot be mapped to world size %d; continuing at epoch %d",
                state["world_size"],
                self.world_size,
                epoch,
            )
            if isinstance(self.docs, MapDocuments):
                self.docs.load_state_dict({"epoch": epoch, "next": 0})
            else:
                self.docs.epoch = epoch
                self.docs.ds.set_epoch(epoch)
            return
        self.docs.load_state_dict(state["docs"])
        self.packer.load_state_dict(state["buffer"])


def validation_batches(
    spec: DataSpec,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seq_len: int,
    micro_batch_size: int,
    eval_steps: int,
    rank: int,
    world_size: int,
) -> list[Batch]:
    """This rank's fixed validation batches (the same at every evaluation).

    Windows are dealt round-robin to ranks; every rank gets the same number of
    batches (possibly fewer than evalSteps on a small held-out slice) so the
    evaluation's collectives line up.
    """
    wanted = eval_steps * micro_batch_size * world_size
    packer = Packer(window=seq_len + 1)
    windows: list[tuple[list[int], str]] = []
    texts = validation_texts(spec)
    exhausted = False
    while len(windows) < wanted and not exhausted:
        chunk = [t for _, t in zip(range(TOKENIZE_CHUNK), texts, strict=False)]
        exhausted = len(chunk) < TOKENIZE_CHUNK
        for i, tokens in enumerate(encode(tokenizer, chunk) if chunk else []):
            packer.add(f"v{len(windows)}.{i}", tokens)
        while packer.buffered >= packer.window and len(windows) < wanted:
            windows.append(packer.take())
    per_rank = len(windows) // world_size
    mine = windows[rank::world_size][:per_rank]
    size = min(micro_batch_size, per_rank)
    if size == 0:
        return []
    batches = []
    for start in range(0, per_rank - size + 1, size):
        part = mine[start : start + size]
        batches.append(stack_windows([w for w, _ in part], [s for _, s in part]))
    return batches
