"""Resolving ``data.path`` (a file, a directory or a glob) into typed files.

Torch-free and datasets-free so the config checks can run it before any heavy
import; ``sources.open_dataset`` hands the result to ``datasets.load_dataset``.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# File suffix -> the datasets builder that reads it.
BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".txt": "text",
}


@dataclass(frozen=True)
class DataFiles:
    builder: str
    files: tuple[str, ...]


class DataFilesError(ValueError):
    pass


def resolve(path: str) -> DataFiles:
    """The sorted files ``path`` names and the builder for them.

    Sorted so every rank and every restart sees the same document order. All
    files must share one format: mixing them would silently drop a column.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        candidates = sorted(str(f) for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))
    elif any(ch in path for ch in "*?["):
        candidates = sorted(f for f in glob.glob(str(p), recursive=True) if Path(f).is_file())
    elif p.is_file():
        candidates = [str(p)]
    else:
        raise DataFilesError(f"{path} does not exist")
    files = [f for f in candidates if Path(f).suffix.lower() in BUILDERS]
    if not files:
        kinds = ", ".join(sorted(BUILDERS))
        raise DataFilesError(f"no {kinds} files in {path}")
    builders = {BUILDERS[Path(f).suffix.lower()] for f in files}
    if len(builders) > 1:
        raise DataFilesError(f"{path} mixes file formats ({', '.join(sorted(builders))}); use one format")
    return DataFiles(builder=builders.pop(), files=tuple(files))


# Rows read at most when probing for text: a real dataset has text in its first
# row; only an (almost) blank one is read this far, and then the loader decides.
PROBE_ROWS = 100_000


def check_has_text(found: DataFiles, text_field: str, max_rows: int = PROBE_ROWS) -> str | None:
    """Why the files cannot feed training (empty, no text, no such field), or None.

    Run by the config checks, before the process group and the model exist, so
    a bad data path fails in seconds with one line naming the files, not after
    the model is built. Reads only up to the first row with text.
    """
    empty = check_not_empty(found)
    if empty:
        return empty
    count, fields = 0, set[str]()
    for row in rows(found):
        if count >= max_rows:
            return None  # undecided: the loader checks the rest
        count += 1
        if not isinstance(row, dict):
            return None  # not JSON Lines (e.g. one JSON array): left to the datasets reader
        fields |= row.keys()
        value = row.get(text_field)
        if isinstance(value, str) and value.strip():
            return None
    if count and text_field not in fields:
        return f"no row has a field {text_field!r} (fields: {', '.join(sorted(fields))}); set data.textField"
    return f"none of the {count} rows has any text in field {text_field!r}"


def check_not_empty(found: DataFiles) -> str | None:
    """Why the files cannot feed training when they are all empty, or None."""
    if all(Path(f).stat().st_size == 0 for f in found.files):
        return f"every file is empty ({', '.join(found.files[:3])}{' ...' if len(found.files) > 3 else ''})"
    return None


def rows(found: DataFiles) -> Iterator[Any]:
    """The files' rows as dicts (a txt line as ``{"text": line}``); None for a line that is not JSON."""
    if found.builder == "parquet":
        return _parquet_rows(found.files)
    return _line_rows(found.files, as_json=found.builder == "json")


def _line_rows(paths: tuple[str, ...], *, as_json: bool) -> Iterator[Any]:
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                if not as_json:
                    yield {"text": line}
                    continue
                try:
                    yield json.loads(line)
                except ValueError:
                    yield None  # not JSON Lines: undecided
                    return


def _parquet_rows(paths: tuple[str, ...]) -> Iterator[Any]:
    import pyarrow.parquet as pq  # comes with datasets; only needed for parquet

    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            yield from batch.to_pylist()


def count_documents(found: DataFiles, at_most: int) -> int | None:
    """The documents the files hold, counted up to ``at_most`` (a count of ``at_most`` means "that many or more").

    What ``sources.open_dataset`` makes of them: a row of JSON Lines or parquet,
    a paragraph of plain text (``sample_by="paragraph"``). None for a file read
    whole as one JSON document (an array), which only a parse would count.
    Reads only as far as the count needs, so a large dataset costs nothing.
    """
    if found.builder == "parquet":
        import pyarrow.parquet as pq

        return min(at_most, sum(pq.ParquetFile(p).metadata.num_rows for p in found.files))
    count = 0
    for path in found.files:
        with open(path, "rb") as f:
            if found.builder == "json" and f.read(4096).lstrip()[:1] != b"{":
                return None
            f.seek(0)
            in_paragraph = False
            for line in f:
                blank = not line.strip()
                if found.builder == "json":
                    count += not blank
                else:  # a paragraph starts at a non-blank line after a blank one (or the file's start)
                    count += not blank and not in_paragraph
                    in_paragraph = not blank
                if count >= at_most:
                    return at_most
    return count
