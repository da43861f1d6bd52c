"""What a ``data.format`` is to the trainer, and the registry of them.

A format answers every question the trainer asks about its rows: which
columns a document is read from (and which settings name them), what the
config checks look for in local files, what the tokenizer must offer, and how
a document becomes tokens. The loader, the config checks and the train loop
ask the format object; they never compare format names.

Two families exist. A plain text stream (``packs_documents = False``) is
tokenized whole and cut into windows; every token is trained. The row
formats (``RowFormat``) turn each row into one ``Document`` (tokens + which
are trained) and pack whole rows into padded sequences whose attention stays
within a row.

Torch-free and transformers-free: the config checks use it before any heavy
import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from .. import files, scan
from ..document import Document

if TYPE_CHECKING:
    from fsdp_api.spec import DataSpec
    from transformers import PreTrainedTokenizerBase

# Rows ``(key, value)`` -> one document each.
Encoder = Callable[[list[tuple[str, Any]]], list[Document]]


class DataFormat:
    """One ``data.format``: subclass, set the class attributes, and ``register`` it."""

    name: ClassVar[str]
    # The settings that name the columns a document is read from, in ``fields``' order.
    settings: ClassVar[tuple[str, ...]]
    # Whole rows -> Documents packed into padded sequences (attention kept within a row);
    # False: a plain text stream cut into windows, every token trained.
    packs_documents: ClassVar[bool]

    def fields(self, spec: DataSpec) -> tuple[str, ...]:
        """The columns a document is read from."""
        raise NotImplementedError

    def optional_fields(self, spec: DataSpec) -> tuple[str, ...]:
        """Those of ``fields`` a dataset may lack (the format reads None there)."""
        return ()

    def check_files(self, spec: DataSpec, found: files.DataFiles) -> list[str]:
        """The config checks' errors for the local files ``spec.path`` resolved to."""
        raise NotImplementedError

    def check_tokenizer(self, tokenizer: PreTrainedTokenizerBase, ref: str, field: str) -> str | None:
        """Why ``tokenizer`` (loaded from ``ref``, set by ``field``) cannot encode this format, or None."""
        return None

    def encoder(self, spec: DataSpec, tokenizer: PreTrainedTokenizerBase) -> Encoder:
        """Rows -> documents (row formats only)."""
        raise ValueError(f"data.format {self.name} has no row encoder: its documents are plain text")


FORMATS: dict[str, DataFormat] = {}


def register(cls: type[DataFormat]) -> type[DataFormat]:
    """Class decorator: ``data.format: <cls.name>`` means ``cls``."""
    if cls.name in FORMATS:
        raise ValueError(f"data.format {cls.name} is registered twice")
    FORMATS[cls.name] = cls()
    return cls


def data_format(name: str) -> DataFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"data.format {name} is not one of {', '.join(sorted(FORMATS))}") from None


def snippet(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def string_field_problem(row: Any, name: str) -> str | None:
    """Why ``row[name]`` is not the string a row format reads there, or None."""
    value = row.get(name) if isinstance(row, dict) else None
    return None if isinstance(value, str) else f"field {name!r} must be a string, got {snippet(value)}"


class RowFormat(DataFormat):
    """A format whose rows are read from named columns, one ``Document`` per row."""

    packs_documents = True

    def row_problem(self, spec: DataSpec, row: dict[str, Any]) -> str | None:
        """Why the encoder would refuse this row (the config check reads the files with it), or None."""
        for name in self.fields(spec):
            problem = string_field_problem(row, name)
            if problem:
                return problem
        return None

    def row_trains(self, spec: DataSpec, row: dict[str, Any]) -> bool:
        """Whether a valid row has anything to train on."""
        return True

    # What a row must hold for row_trains, in the config check's words.
    trains_what: ClassVar[str] = "a field to train on"

    def shape_problem(self, spec: DataSpec, row: dict[str, Any], number: int) -> str | None:
        """Why the first row with every field filled holds the wrong shapes (row ``number``), or None."""
        for name in self.fields(spec):
            if not isinstance(row[name], str):
                return f"row {number}: field {name!r} is not a string ({type(row[name]).__name__})"
        return None

    def check_files(self, spec: DataSpec, found: files.DataFiles) -> list[str]:
        if found.builder == "text":
            return [
                f"data.format: {self.name} reads rows with named fields (json, jsonl or parquet); "
                f"{spec.path} holds txt files, which are plain text"
            ]
        problem = self.check_has_fields(spec, found)
        if problem is None:
            problem = self.check_rows(spec, found)
        return [f"data.path: {spec.path}: {problem}"] if problem else []

    def check_rows(self, spec: DataSpec, found: files.DataFiles) -> str | None:
        """Every row (up to scan's bound) is one the encoder takes, and some row trains something."""
        result = scan.scan(found, lambda row: self.row_problem(spec, row), lambda row: self.row_trains(spec, row))
        if result.first_problem is not None:
            return result.message()
        if result.rows and not result.training_rows:
            return f"none of the {result.rows} rows read has {self.trains_what}: nothing would be trained"
        return None

    def check_has_fields(self, spec: DataSpec, found: files.DataFiles, max_rows: int = files.PROBE_ROWS) -> str | None:
        """``files.check_has_text`` for row formats: some row has every field the format reads.

        The first row that has them all must also hold the right shapes: a
        wrong column name that happens to exist fails here, not at the first step.
        """
        optional = self.optional_fields(spec)
        named = [(f, setting) for f, setting in zip(self.fields(spec), self.settings, strict=True) if f not in optional]
        fields = tuple(f for f, _ in named)
        empty = files.check_not_empty(found)
        if empty:
            return empty
        count, seen = 0, set[str]()
        for row in files.rows(found):
            if count >= max_rows:
                return None
            count += 1
            if not isinstance(row, dict):
                return None
            seen |= row.keys()
            if all(row.get(f) not in (None, "", []) for f in fields):
                return self.shape_problem(spec, row, count)
        for name, setting in named:
            if count and name not in seen:
                return f"no row has a field {name!r} (fields: {', '.join(sorted(seen))}); set {setting}"
        return f"none of the {count} rows has every field data.format {self.name} reads ({', '.join(fields)}) filled"
