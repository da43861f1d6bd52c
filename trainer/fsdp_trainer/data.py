"""Training and validation data: documents -> tokens -> fixed-length packed windows.

Documents come from a Hugging Face dataset (hub id, optionally streamed),
local json/jsonl/parquet/txt files, or the embedded corpus. Each document is
tokenized as ``[bos] text [eos]`` and appended to a token stream that is cut
into windows of ``seqLen + 1`` tokens (inputs are the first seqLen, labels the
last seqLen), so every label is a real token and no padding is ever needed.

Sharding. Each rank reads a disjoint set of documents. For map-style datasets
the document order of an epoch is a permutation seeded by (seed, epoch),
computed identically on every rank, and rank r takes positions r, r+W, r+2W...
of it. That order does not depend on the world size, so W ranks with micro
batch b see exactly the documents one process with micro batch W*b sees, which
is what the parity tests rely on. Streamed datasets are split with
``datasets.distributed.split_dataset_by_node`` and read in stored order.

Validation. With ``data.validationSplit`` that split is used. Otherwise a
deterministic 2% of the documents is held out and never trained on: chosen by
a hash of the document index (map-style) or of the text (streaming), so it
depends on neither the seed nor the world size.

Resume. ``state_dict()`` is the position after the last batch handed out: the
epoch, the next document position (or the streamed dataset's own state) and
the tokens already read but not yet used. Loading it continues with exactly the
next window, so a resumed run neither repeats nor skips a sample.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from fsdp_api.spec import DataSpec
from transformers import PreTrainedTokenizerBase

from . import datafiles

log = logging.getLogger(__name__)

HOLDOUT_PER_MILLE = 20
# Documents tokenized per call: the fast tokenizer batches (and releases the GIL).
TOKENIZE_CHUNK = 64
_HOLDOUT_SALT = 0x9E3779B97F4A7C15


@dataclass
class Batch:
    inputs: torch.Tensor  # [micro_batch, seq_len] int64
    labels: torch.Tensor  # [micro_batch, seq_len] int64
    sample_ids: list[str]  # "<document key>@<token offset>" of each window's first token

    @property
    def num_tokens(self) -> int:
        return self.labels.numel()

    def to(self, device: torch.device) -> Batch:
        if device.type != "cuda":
            return self
        # From pinned memory the copy is asynchronous: it overlaps the forward.
        return Batch(
            self.inputs.pin_memory().to(device, non_blocking=True),
            self.labels.pin_memory().to(device, non_blocking=True),
            self.sample_ids,
        )


# --- opening datasets -------------------------------------------------------


def open_dataset(spec: DataSpec, split: str | None = None) -> Any:
    """A ``datasets.Dataset`` (or ``IterableDataset`` when streaming) with the text column."""
    import datasets

    split = split or spec.split
    if spec.path:
        files = datafiles.resolve(spec.path)
        # One document per paragraph for plain text: one per line breaks prose
        # apart, one per file could leave a rank with nothing to read.
        extra = {"sample_by": "paragraph"} if files.builder == "text" else {}
        return datasets.load_dataset(
            files.builder, data_files=list(files.files), split="train", streaming=spec.streaming, **extra
        )
    if spec.dataset:
        return datasets.load_dataset(spec.dataset, spec.config, split=split, streaming=spec.streaming)
    from .corpus import embedded_documents

    return datasets.Dataset.from_dict({spec.text_field: embedded_documents()})


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a well-spread hash of each uint64."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(_HOLDOUT_SALT)).astype(np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def holdout_mask(num_docs: int) -> np.ndarray:
    """Which document indices are held out for validation (about 2%, at least one)."""
    keys = _mix64(np.arange(num_docs, dtype=np.uint64)) % np.uint64(1000)
    mask = keys < HOLDOUT_PER_MILLE
    if num_docs > 1 and not mask.any():
        mask[int(np.argmin(keys))] = True
    return mask


def is_holdout_text(text: str) -> bool:
    digest = hashlib.sha1(text.encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[:8], "little") % 1000 < HOLDOUT_PER_MILLE


# --- packing ----------------------------------------------------------------


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


def _stack(windows: list[list[int]], ids: list[str]) -> Batch:
    t = torch.tensor(windows, dtype=torch.long)
    return Batch(inputs=t[:, :-1].contiguous(), labels=t[:, 1:].contiguous(), sample_ids=ids)


# --- document streams ---------------------------------------------------------


class _MapDocuments:
    """This rank's documents of a map-style dataset, epoch after epoch, resumable."""

    def __init__(self, ds: Any, text_field: str, rank: int, world_size: int, seed: int, holdout: bool) -> None:
        self.ds, self.text_field = ds, text_field
        self.rank, self.world_size, self.seed = rank, world_size, seed
        mask = holdout_mask(len(ds)) if holdout else np.zeros(len(ds), dtype=bool)
        self.train_indices = np.flatnonzero(~mask)
        if len(self.train_indices) == 0:
            raise ValueError("the dataset has no training documents")
        self.epoch = 0
        self.next = 0  # position in this rank's slice of the epoch's order
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.train_indices)
        return perm[self.rank :: self.world_size]

    def next_chunk(self, n: int) -> list[tuple[str, str]]:
        if self.next >= len(self._order):
            self.epoch += 1
            self.next = 0
            self._order = self._epoch_order(self.epoch)
            if len(self._order) == 0:
                raise ValueError(f"rank {self.rank} has no documents: fewer training documents than ranks")
        idx = self._order[self.next : self.next + n]
        self.next += len(idx)
        texts = self.ds[idx.tolist()][self.text_field]
        return [(f"e{self.epoch}/d{i}", t) for i, t in zip(idx.tolist(), texts, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "map", "epoch": self.epoch, "next": self.next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.next = int(state["epoch"]), int(state["next"])
        self._order = self._epoch_order(self.epoch)


class _StreamDocuments:
    """This rank's documents of a streamed dataset (``split_dataset_by_node``), resumable."""

    def __init__(self, ds: Any, text_field: str, rank: int, world_size: int, holdout: bool) -> None:
        from datasets.distributed import split_dataset_by_node

        self.ds = split_dataset_by_node(ds, rank=rank, world_size=world_size)
        self.text_field, self.rank, self.holdout = text_field, rank, holdout
        self.epoch = 0
        self.count = 0
        self._it: Iterator[dict[str, Any]] | None = None

    def _next_doc(self) -> dict[str, Any]:
        for _ in range(2):
            if self._it is None:
                self._it = iter(self.ds)
            try:
                return next(self._it)
            except StopIteration:
                self.epoch += 1
                self.ds.set_epoch(self.epoch)
                self._it = None
        raise ValueError(f"rank {self.rank} has no documents in the streamed dataset")

    def next_chunk(self, n: int) -> list[tuple[str, str]]:
        out = []
        while len(out) < n:
            text = self._next_doc()[self.text_field]
            if self.holdout and is_holdout_text(text):
                continue
            out.append((f"r{self.rank}/s{self.count}", text))
            self.count += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "stream", "epoch": self.epoch, "count": self.count, "dataset": self.ds.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.count = int(state["epoch"]), int(state["count"])
        self.ds.set_epoch(self.epoch)
        self.ds.load_state_dict(state["dataset"])
        self._it = None


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
        dataset: Any = None,
    ) -> None:
        ds = open_dataset(spec) if dataset is None else dataset
        holdout = spec.validation_split is None
        self.rank, self.world_size = rank, world_size
        self.micro_batch_size = micro_batch_size
        self.tokenizer = tokenizer
        if _is_iterable(ds):
            self.docs: _MapDocuments | _StreamDocuments = _StreamDocuments(
                ds, spec.text_field, rank, world_size, holdout
            )
        else:
            self.docs = _MapDocuments(ds, spec.text_field, rank, world_size, seed, holdout)
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
        return _stack(windows, ids)

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
            if isinstance(self.docs, _MapDocuments):
                self.docs.load_state_dict({"epoch": epoch, "next": 0})
            else:
                self.docs.epoch = epoch
                self.docs.ds.set_epoch(epoch)
            return
        self.docs.load_state_dict(state["docs"])
        self.packer.load_state_dict(state["buffer"])


def _is_iterable(ds: Any) -> bool:
    import datasets

    return isinstance(ds, datasets.IterableDataset)


# --- validation -------------------------------------------------------------


def _validation_texts(spec: DataSpec, dataset: Any = None) -> Iterator[str]:
    """Validation documents in stored order: the validation split, or the held-out ones."""
    if spec.validation_split:
        ds = open_dataset(spec, spec.validation_split)
        yield from (row[spec.text_field] for row in ds)
        return
    ds = open_dataset(spec) if dataset is None else dataset
    if _is_iterable(ds):
        yield from (row[spec.text_field] for row in ds if is_holdout_text(row[spec.text_field]))
        return
    for i in np.flatnonzero(holdout_mask(len(ds))).tolist():
        yield ds[i][spec.text_field]


def validation_batches(
    spec: DataSpec,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seq_len: int,
    micro_batch_size: int,
    eval_steps: int,
    rank: int,
    world_size: int,
    dataset: Any = None,
) -> list[Batch]:
    """This rank's fixed validation batches (the same at every evaluation).

    Windows are dealt round-robin to ranks; every rank gets the same number of
    batches (possibly fewer than evalSteps on a small held-out slice) so the
    evaluation's collectives line up.
    """
    wanted = eval_steps * micro_batch_size * world_size
    packer = Packer(window=seq_len + 1)
    windows: list[tuple[list[int], str]] = []
    texts = _validation_texts(spec, dataset)
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
        batches.append(_stack([w for w, _ in part], [s for _, s in part]))
    return batches


# --- background prefetch ----------------------------------------------------


class PrefetchedData:
    """Produces the next batches on a background thread while the step runs.

    On a GPU the step's host sync (the loss for the metrics) leaves the device
    idle while the next batch is tokenized; producing it ahead hides that.
    Each batch travels with the data position *after* it, and
    ``state_dict()`` returns the position after the last batch handed out, so
    checkpoints stay exact whatever the thread has read ahead. The thread is
    the only user of the tokenizer once started (fast tokenizers must not be
    shared between threads), so anything else that tokenizes (validation)
    runs before the first ``next_batch``.
    """

    def __init__(self, inner: TrainData, depth: int = 2) -> None:
        import queue
        import threading

        self.inner = inner
        self._queue: queue.Queue[tuple[Batch, dict[str, Any]] | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._threading = threading
        self._state: dict[str, Any] | None = None

    def _produce(self) -> None:
        import queue

        try:
            while not self._stop.is_set():
                item: tuple[Batch, dict[str, Any]] | BaseException = (
                    self.inner.next_batch(),
                    self.inner.state_dict(),
                )
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the consumer, which re-raises it
            self._queue.put(e)

    def next_batch(self) -> Batch:
        if self._thread is None:
            self._thread = self._threading.Thread(target=self._produce, name="data-prefetch", daemon=True)
            self._thread.start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        batch, self._state = item
        return batch

    def state_dict(self) -> dict[str, Any]:
        return self._state if self._state is not None else self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._thread is not None:
            raise RuntimeError("load the data position before the first batch")
        self.inner.load_state_dict(state)
        self._state = None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
