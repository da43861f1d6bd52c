"""This rank's batches: training batches that resume exactly, and fixed validation batches.

Resume. ``state_dict()`` is the position after the last batch handed out: the
epoch, the next document position (or the streamed dataset's own state) and
the tokens already read but not yet used (for chat and prompt-completion: the
rows read but not yet packed, and the row counts). Loading it continues with
exactly the next window, so a resumed run neither repeats nor skips a sample.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fsdp_api.spec import DataSpec
from transformers import PreTrainedTokenizerBase

from .formats import Encoder, data_format
from .packing import Batch, Packer, encode, stack_windows
from .sft import DocumentPacker, RowCounts, stack_sequences
from .sources import MapDocuments, StreamDocuments, check_columns, is_iterable, open_dataset, validation_texts

log = logging.getLogger(__name__)

# Documents tokenized per call: the fast tokenizer batches (and releases the GIL).
TOKENIZE_CHUNK = 64

_Item = TypeVar("_Item")


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
        fmt = data_format(spec.format)
        fields = fmt.fields(spec)
        if fmt.packs_documents:
            check_columns(ds, fields, fmt.settings, fmt.optional_fields(spec))
        if is_iterable(ds):
            self.docs: MapDocuments | StreamDocuments = StreamDocuments(ds, fields, rank, world_size, holdout)
        else:
            self.docs = MapDocuments(ds, fields, rank, world_size, seed, holdout)
        self.encoder: Encoder | None = None
        self.packer: Packer | DocumentPacker = Packer(window=seq_len + 1)
        if fmt.packs_documents:
            self.encoder = fmt.encoder(spec, tokenizer)
            self.packer = sft_packer(spec, tokenizer, seq_len, where=f"rank {rank}: ")

    @property
    def row_counts(self) -> RowCounts | None:
        """What happened to the rows read so far (chat and prompt-completion only)."""
        return self.packer.counts if isinstance(self.packer, DocumentPacker) else None

    def next_batch(self) -> Batch:
        if isinstance(self.packer, DocumentPacker):
            return self._next_sequences(self.packer)
        windows: list[list[int]] = []
        ids: list[str] = []
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

    def _next_sequences(self, packer: DocumentPacker) -> Batch:
        assert self.encoder is not None
        sequences: list[tuple[list[int], list[int], list[int], str]] = []
        while len(sequences) < self.micro_batch_size:
            start_epoch, packed = self.docs.epoch, len(packer.pending)
            while not packer.ready():
                if self.docs.epoch > start_epoch + 1 and len(packer.pending) == packed:
                    counts = packer.counts
                    raise ValueError(
                        f"rank {self.rank}'s rows give nothing to train on: of {counts.rows} read, "
                        f"{counts.dropped} were longer than seqLen + 1 tokens and dropped, {counts.untrained} "
                        "had no assistant turn or completion left to train on"
                    )
                chunk = self.docs.next_chunk(TOKENIZE_CHUNK)
                for (key, _), doc in zip(chunk, self.encoder(chunk), strict=True):
                    packer.add(key, doc)
            sequences.append(packer.take())
        return stack_sequences(sequences)

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


def row_counts(state: dict[str, Any]) -> dict[str, int] | None:
    """The row counts in a ``TrainData.state_dict()`` (chat and prompt-completion), else None."""
    buffer = state.get("buffer")
    return {k: int(v) for k, v in buffer["counts"].items()} if isinstance(buffer, dict) else None


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
    items, stack = _validation_items(spec, tokenizer, seq_len, eval_steps * micro_batch_size * world_size)
    return _deal(items, stack, rank=rank, world_size=world_size, micro_batch_size=micro_batch_size)


def every_batch(
    spec: DataSpec, tokenizer: PreTrainedTokenizerBase, *, seq_len: int, batch_size: int, max_batches: int
) -> list[Batch]:
    """The validation rows' sequences in batches of ``batch_size``, the last one possibly shorter (fsdp-train eval)."""
    items, stack = _validation_items(spec, tokenizer, seq_len, max_batches * batch_size)
    return [stack(items[start : start + batch_size]) for start in range(0, len(items), batch_size)]


def _validation_items(
    spec: DataSpec, tokenizer: PreTrainedTokenizerBase, seq_len: int, wanted: int
) -> tuple[list[Any], Callable[[list[Any]], Batch]]:
    """Up to ``wanted`` sequences of the validation rows, as the format makes them, and how a batch stacks them."""
    if not data_format(spec.format).packs_documents:

        def stack(part: list[tuple[list[int], str]]) -> Batch:
            return stack_windows([w for w, _ in part], [s for _, s in part])

        return _validation_windows(spec, tokenizer, seq_len, wanted), stack
    return _validation_sequences(spec, tokenizer, seq_len, wanted), stack_sequences


def _deal(
    items: list[_Item], stack: Callable[[list[_Item]], Batch], *, rank: int, world_size: int, micro_batch_size: int
) -> list[Batch]:
    """This rank's batches of ``items``, dealt round-robin; every rank gets the same number."""
    per_rank = len(items) // world_size
    mine = items[rank::world_size][:per_rank]
    size = min(micro_batch_size, per_rank)
    if size == 0:
        return []
    return [stack(mine[start : start + size]) for start in range(0, per_rank - size + 1, size)]


def _validation_windows(
    spec: DataSpec, tokenizer: PreTrainedTokenizerBase, seq_len: int, wanted: int
) -> list[tuple[list[int], str]]:
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
    return windows


def _validation_sequences(
    spec: DataSpec, tokenizer: PreTrainedTokenizerBase, seq_len: int, wanted: int
) -> list[tuple[list[int], list[int], list[int], str]]:
    """Held-out rows packed like training rows; the last, partial sequence too."""
    fmt = data_format(spec.format)
    encoder = fmt.encoder(spec, tokenizer)
    packer = sft_packer(spec, tokenizer, seq_len, where="validation: ")
    sequences: list[tuple[list[int], list[int], list[int], str]] = []
    docs = validation_texts(spec, fmt.fields(spec))
    exhausted = False
    while len(sequences) < wanted and not exhausted:
        chunk = [(f"v{packer.counts.rows + i}", d) for i, d in enumerate(itertools.islice(docs, TOKENIZE_CHUNK))]
        exhausted = len(chunk) < TOKENIZE_CHUNK
        for (key, _), doc in zip(chunk, encoder(chunk) if chunk else [], strict=True):
            packer.add(key, doc)
        while (packer.ready() or (exhausted and packer.pending)) and len(sequences) < wanted:
            sequences.append(packer.take())
    return sequences


def sft_packer(spec: DataSpec, tokenizer: PreTrainedTokenizerBase, seq_len: int, where: str) -> DocumentPacker:
    # Padding is never attended nor trained; any id in the vocabulary would do.
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return DocumentPacker(seq_len=seq_len, overlong=spec.overlong, pad_id=pad, where=where)
