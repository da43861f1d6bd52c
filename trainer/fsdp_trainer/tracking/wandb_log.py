"""What an offline W&B run holds: its history steps, read from the run's transaction log.

An offline run is one ``run-<id>.wandb`` file per process: a 7-byte header
(``:W&B``, a magic number, a version), then W&B's records (protobuf
``Record`` messages of ``wandb.proto``) framed as LevelDB's log format: 32 KiB
blocks, each record in pieces with a 7-byte header (checksum, length, type).
The W&B client offers no reader for it, and a resumed offline process needs
to know which steps an earlier process of the same run already wrote
(wandb.py): those it skips.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

IDENT = b":W&B"
HEADER_BYTES = 7
BLOCK_BYTES = 32 * 1024
PIECE_HEADER_BYTES = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
STEP_KEY = "_step"


class LogReader:
    """Reads a run file as it grows: each call returns the records completed since the last one.

    The writer (W&B's service) appends; a piece cut short at the end is left
    for the next call, so a file being written is read without tearing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.position = 0  # the first byte not parsed yet
        self._pending = b""  # the pieces of a record whose last piece is not there yet

    def new_records(self) -> list[Any]:
        from wandb.proto import wandb_internal_pb2 as pb

        try:
            with self.path.open("rb") as f:
                f.seek(self.position)
                data = f.read()
        except FileNotFoundError:
            return []
        base, pos, found = self.position, 0, []
        if base == 0:
            if len(data) < HEADER_BYTES:
                return []
            if data[: len(IDENT)] != IDENT:
                raise ValueError(f"{self.path} is not a W&B run file")
            pos = HEADER_BYTES
        while pos + PIECE_HEADER_BYTES <= len(data):
            left = BLOCK_BYTES - (base + pos) % BLOCK_BYTES
            if left < PIECE_HEADER_BYTES:
                pos += left  # the block's tail is padding
                continue
            length = int.from_bytes(data[pos + 4 : pos + 6], "little")
            kind = data[pos + 6]
            body = data[pos + PIECE_HEADER_BYTES : pos + PIECE_HEADER_BYTES + length]
            if kind == 0 or len(body) < length:
                break  # not written yet (or zeros past the last record): the next call looks again
            pos += PIECE_HEADER_BYTES + length
            if kind in (FIRST, MIDDLE):
                self._pending = body if kind == FIRST else self._pending + body
                continue
            # wandb's protobuf modules build their classes at import (no stubs): mypy sees no Record.
            record = pb.Record()  # type: ignore[attr-defined]
            record.ParseFromString(self._pending + body if kind == LAST else body)
            self._pending = b""
            found.append(record)
        self.position = base + pos
        return found


def records(path: Path) -> list[Any]:
    """The file's ``Record`` messages in order, as far as they are complete."""
    return LogReader(path).new_records()


def steps(found: list[Any]) -> list[int]:
    """The history steps among ``found`` records."""
    return [row[STEP_KEY] for row in rows(found) if STEP_KEY in row]


def rows(found: list[Any]) -> list[dict[str, Any]]:
    out = []
    for record in found:
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            out.append(row)
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """Each history row the file holds: ``{"_step": 3, "train/loss": 2.1, ...}``."""
    return rows(records(path))


def run_files(root: Path, run_id: str) -> list[Path]:
    """Every offline file of run ``run_id`` under W&B's folder ``root``, oldest first.

    W&B names a process's folder ``offline-run-<YYYYmmdd_HHMMSS>-<id>``, the start
    to the second; a second process of the run that starts within the same second
    finds that folder taken and appends ``-1``, a third ``-2`` (``wandb_init``'s
    ``set_sync_dir_suffix``). Ordered by (start, suffix) as numbers: ``-10`` after ``-9``.
    """
    folder = re.compile(rf"offline-run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
    found = []
    for path in root.glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"):
        match = folder.fullmatch(path.parent.name)
        if match:  # not a longer id that merely starts with this one
            found.append(((match[1], int(match[2] or 0)), path))
    return [path for _, path in sorted(found)]


def last_step(root: Path, run_id: str) -> int:
    """The last step any earlier offline process of the run wrote; 0 for none."""
    return max((step for path in run_files(root, run_id) for step in steps(records(path))), default=0)
