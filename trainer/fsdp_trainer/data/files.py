"""Resolving ``data.path`` (a file, a directory or a glob) into typed files.

Torch-free and datasets-free so the config checks can run it before any heavy
import; ``sources.open_dataset`` hands the result to ``datasets.load_dataset``.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

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
