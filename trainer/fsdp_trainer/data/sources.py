"""Where documents come from, which ones are held out, and each rank's share of them.

Documents come from a Hugging Face dataset (hub id, optionally streamed),
local json/jsonl/parquet/txt files, or the embedded corpus. A document is the
value of its one column (the text; a chat's messages) or, read from several
columns (prompt-completion), a dict of them.

Sharding. Each rank reads a disjoint set of documents. For map-style datasets
the document order of an epoch is a permutation seeded by (seed, epoch),
computed identically on every rank, and rank r takes positions r, r+W, r+2W...
of it. That order does not depend on the world size, so W ranks with micro
batch b see exactly the documents one process with micro batch W*b sees, which
is what the parity tests rely on. Streamed datasets are split with
``datasets.distributed.split_dataset_by_node`` and read in stored order.

Validation. With ``data.validationSplit`` that split is used. Otherwise a
deterministic 2% of the documents is held out and never trained on: chosen by
a hash of the document index (map-style) or of its content (streaming), so
it depends on neither the seed nor the world size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
from fsdp_api.spec import DataSpec

from .files import resolve as resolve_files

HOLDOUT_PER_MILLE = 20
_HOLDOUT_SALT = 0x9E3779B97F4A7C15


def open_dataset(spec: DataSpec, split: str | None = None) -> Any:
    """A ``datasets.Dataset`` (or ``IterableDataset`` when streaming) with the text column."""
    import datasets

    split = split or spec.split
    if spec.path:
        files = resolve_files(spec.path)
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


def holdout_key(value: Any) -> str:
    """What the streamed hold-out hashes: the text itself, or the document as canonical JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def pick(row: dict[str, Any], fields: tuple[str, ...]) -> Any:
    """One row's document: its one column's value, or a dict of its columns (None for one it lacks)."""
    if len(fields) == 1:
        return row[fields[0]]
    return {f: row.get(f) for f in fields}


def _pick_columns(columns: dict[str, list[Any]], fields: tuple[str, ...]) -> list[Any]:
    if len(fields) == 1:
        return columns[fields[0]]
    rows = len(next(iter(columns.values()), []))
    # A column the dataset lacks (a format's optional one, see check_columns) reads as None.
    values = [columns.get(f, [None] * rows) for f in fields]
    return [dict(zip(fields, row, strict=True)) for row in zip(*values, strict=True)]


def check_columns(ds: Any, fields: tuple[str, ...], settings: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """A missing column fails at once, naming the columns there are, not as a KeyError mid-step.

    Streamed datasets may not know their columns before the first row; then the first row tells.
    ``optional`` columns may be absent: the format reads None there.
    """
    names = getattr(ds, "column_names", None)
    for name, setting in zip(fields, settings, strict=True):
        if names is not None and name not in names and name not in optional:
            raise ValueError(f"{setting}: the dataset has no column {name!r} (columns: {', '.join(names)})")


def is_iterable(ds: Any) -> bool:
    import datasets

    return isinstance(ds, datasets.IterableDataset)


# --- document streams ---------------------------------------------------------


class MapDocuments:
    """This rank's documents of a map-style dataset, epoch after epoch, resumable."""

    def __init__(self, ds: Any, fields: tuple[str, ...], rank: int, world_size: int, seed: int, holdout: bool) -> None:
        self.ds, self.fields = ds, fields
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

    def next_chunk(self, n: int) -> list[tuple[str, Any]]:
        if self.next >= len(self._order):
            self.epoch += 1
            self.next = 0
            self._order = self._epoch_order(self.epoch)
            if len(self._order) == 0:
                raise ValueError(f"rank {self.rank} has no documents: fewer training documents than ranks")
        idx = self._order[self.next : self.next + n]
        self.next += len(idx)
        docs = _pick_columns(self.ds[idx.tolist()], self.fields)
        return [(f"e{self.epoch}/d{i}", d) for i, d in zip(idx.tolist(), docs, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "map", "epoch": self.epoch, "next": self.next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.next = int(state["epoch"]), int(state["next"])
        self._order = self._epoch_order(self.epoch)


class StreamDocuments:
    """This rank's documents of a streamed dataset (``split_dataset_by_node``), resumable."""

    def __init__(self, ds: Any, fields: tuple[str, ...], rank: int, world_size: int, holdout: bool) -> None:
        from datasets.distributed import split_dataset_by_node

        self.ds = split_dataset_by_node(ds, rank=rank, world_size=world_size)
        self.fields, self.rank, self.holdout = fields, rank, holdout
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

    def next_chunk(self, n: int) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        while len(out) < n:
            doc = pick(self._next_doc(), self.fields)
            if self.holdout and is_holdout_text(holdout_key(doc)):
                continue
            out.append((f"r{self.rank}/s{self.count}", doc))
            self.count += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "stream", "epoch": self.epoch, "count": self.count, "dataset": self.ds.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.count = int(state["epoch"]), int(state["count"])
        self.ds.set_epoch(self.epoch)
        self.ds.load_state_dict(state["dataset"])
        self._it = None


# --- validation -------------------------------------------------------------


def validation_texts(spec: DataSpec, fields: tuple[str, ...] | None = None) -> Iterator[Any]:
    """Validation documents in stored order: the validation split, or the held-out ones."""
    fields = fields or (spec.text_field,)
    if spec.validation_split:
        ds = open_dataset(spec, spec.validation_split)
        yield from (pick(row, fields) for row in ds)
        return
    ds = open_dataset(spec)
    if is_iterable(ds):
        docs = (pick(row, fields) for row in ds)
        yield from (d for d in docs if is_holdout_text(holdout_key(d)))
        return
    for i in np.flatnonzero(holdout_mask(len(ds))).tolist():
        yield pick(ds[i], fields)
