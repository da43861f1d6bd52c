"""Reading local data files through before training: every row up to a bound, a sample beyond it.

The ranks read rows lazily, so a bad row after good ones (a line that is not
JSON, bytes that are not UTF-8, a field of the wrong type) used to stop every
rank mid-run with a traceback, again on every restart. The config check reads
the files first, once, before torchrun: the first ``SCAN_BYTES`` in full,
then ``SAMPLE_LINES`` lines at random offsets of the rest (a bad row there can
still reach the ranks; the line names the bound). Torch-free and
datasets-free, like ``files``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .files import DataFiles

# Bytes read in full, all files together; beyond them, lines are sampled.
SCAN_BYTES = 256 * 2**20
SAMPLE_LINES = 1000
# Parquet rows checked (their bytes are typed and UTF-8 already).
SCAN_PARQUET_ROWS = 1_000_000

# Why one row cannot be trained on (None: it can), and whether it trains anything.
RowProblem = Callable[[dict[str, Any]], str | None]
RowTrains = Callable[[dict[str, Any]], bool]


@dataclass
class ScanResult:
    first_problem: str | None = None  # "FILE line N: why"
    bad_rows: int = 0
    rows: int = 0
    training_rows: int = 0
    sampled: bool = False  # the bound was reached: part of the files was sampled, not read

    def message(self) -> str | None:
        if self.first_problem is None:
            return None
        more = f" ({self.bad_rows - 1} more bad rows in what was read)" if self.bad_rows > 1 else ""
        return self.first_problem + more


def scan(found: DataFiles, problem: RowProblem | None = None, trains: RowTrains | None = None) -> ScanResult:
    """Check every row the bound allows; the first bad one, counts, and whether any trains."""
    result = ScanResult()
    if found.builder == "parquet":
        _scan_parquet(found.files, problem, trains, result)
        return result
    budget = SCAN_BYTES
    as_json = found.builder == "json"
    rng = random.Random(0)
    for path in found.files:
        size = Path(path).stat().st_size
        with open(path, "rb") as f:
            if as_json:
                shape = _json_shape(f)
                if shape == "other":  # a CSV or text file named .json(l): datasets would fail on it in every rank
                    first = f.readline(80).decode("utf-8", "replace").rstrip("\r\n")
                    _bad(result, f"{path}: not JSON: neither JSON lines nor one JSON array (it starts {first!r})")
                    continue
                if shape != "lines":
                    continue  # one JSON document (an array), or empty: datasets reads it whole
            whole = size <= budget
            for where, raw in _lines(f, path, budget if not whole else size):
                _check_line(where, raw, as_json, problem, trains, result)
            budget -= min(size, budget)
            if not whole:
                result.sampled = True
                for where, raw in _sampled(f, path, size, SAMPLE_LINES // len(found.files) + 1, rng):
                    _check_line(where, raw, as_json, problem, trains, result)
    return result


def _json_shape(f: BinaryIO) -> str:
    """``lines`` (an object per line), ``array`` (one JSON document), ``empty``, or ``other`` (not JSON)."""
    head = f.read(4096).lstrip()
    f.seek(0)
    if not head:
        return "empty"
    return {b"{": "lines", b"[": "array"}.get(head[:1], "other")


def _lines(f: BinaryIO, path: str, limit: int) -> Iterator[tuple[str, bytes]]:
    read = 0
    for number, raw in enumerate(f, start=1):
        read += len(raw)
        yield f"{path} line {number}", raw
        if read >= limit:
            return


def _sampled(f: BinaryIO, path: str, size: int, count: int, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    start = f.tell()
    if start >= size:
        return
    for offset in sorted(rng.randrange(start, size) for _ in range(count)):
        f.seek(offset)
        f.readline()  # the rest of the line the offset fell in
        at = f.tell()
        raw = f.readline()
        if raw:
            yield f"{path} at byte {at}", raw


def _check_line(
    where: str, raw: bytes, as_json: bool, problem: RowProblem | None, trains: RowTrains | None, result: ScanResult
) -> None:
    if not raw.strip():
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _bad(result, f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
        return
    if not as_json:
        result.rows += 1
        result.training_rows += 1
        return
    try:
        row = json.loads(text.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        _bad(result, f"{where}: not JSON ({e.msg}: column {e.colno})")
        return
    if not isinstance(row, dict):
        _bad(result, f"{where}: not a JSON object (a {type(row).__name__})")
        return
    _check_row(where, row, problem, trains, result)


def _check_row(
    where: str, row: dict[str, Any], problem: RowProblem | None, trains: RowTrains | None, result: ScanResult
) -> None:
    result.rows += 1
    why = problem(row) if problem is not None else None
    if why is not None:
        _bad(result, f"{where}: {why}")
        return
    if trains is None or trains(row):
        result.training_rows += 1


def _bad(result: ScanResult, problem: str) -> None:
    result.bad_rows += 1
    if result.first_problem is None:
        result.first_problem = problem


def _scan_parquet(files: tuple[str, ...], problem: RowProblem | None, trains: RowTrains | None, r: ScanResult) -> None:
    import pyarrow.parquet as pq  # comes with datasets; only needed for parquet

    for path in files:
        number = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                number += 1
                _check_row(f"{path} row {number}", row, problem, trains, r)
                if r.rows >= SCAN_PARQUET_ROWS:
                    r.sampled = True
                    return
