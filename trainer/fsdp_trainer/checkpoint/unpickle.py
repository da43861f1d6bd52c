"""Reading checkpoint files as data: nothing in a checkpoint may run code in the reader.

Whoever can write the checkpoint volume must not be able to run code in every
rank (resume) or in ``export``. Three kinds of file are pickles:

- each rank's own state file: torch's weights-only unpickler plus numpy's RNG
  array (``load_weights_only``);
- DCP's ``.metadata``, which DCP itself reads with plain ``pickle.load``: read
  here with an unpickler that knows only DCP's own metadata classes
  (``SafeReader``);
- DCP's non-tensor items (``train.step``, the optimizer's hyper-parameters),
  which DCP's default planner reads with ``weights_only=False``: read
  weights-only here (``SafeLoadPlanner``).

A file that names anything else is refused with UnsafeCheckpointError (the run
stops: it is an attack, not damage); bytes that are no pickle at all are damage
(ValueError), and resume falls back to an older checkpoint.
"""

from __future__ import annotations

import enum
import io
import pickle
from collections.abc import Iterable
from pathlib import Path, PosixPath, PurePosixPath
from typing import IO, Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from ..errors import UnsafeCheckpointError, first_line

REFUSED = "Checkpoint files are data; whoever can write the checkpoint volume could otherwise run code here"

# What torch's weights-only unpickler says when a file tries to import or call
# something (torch/_weights_only_unpickler.py: "unsupported GLOBAL", "Unsupported
# global: GLOBAL", "Trying to call reduce for unrecognized function", "Can only
# create new object", "Can only build"). Any other unpickling error (an unknown
# opcode, a short string) is damage, not an attack.
_CODE_MARKERS = ("GLOBAL", "call reduce", "create new object", "Can only build")


def load_weights_only(source: Path | IO[bytes], where: str, safe_globals: Iterable[Any] = ()) -> Any:
    """``torch.load`` with ``weights_only`` (and ``safe_globals`` besides).

    UnsafeCheckpointError when the file tries to run or build code; ValueError
    when it is merely damaged. ``where`` names it in both.
    """
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(source, weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [line for line in str(e).strip().splitlines() if line.strip()]
        detail = next((line.strip() for line in lines if any(m in line for m in _CODE_MARKERS)), None)
        # Not torch's advice that follows ("Please use add_safe_globals"): allow-listing it is the attack.
        detail = detail.split(" Please use")[0].strip() if detail is not None else None
        if detail is None:
            # torch wraps the unpickler's own words in advice: take the line after "WeightsUnpickler error:".
            marker = next((i for i, line in enumerate(lines) if "WeightsUnpickler error" in line), None)
            found = lines[marker + 1].strip() if marker is not None and marker + 1 < len(lines) else type(e).__name__
            raise ValueError(f"{where}: damaged ({found})") from None
        raise UnsafeCheckpointError(
            f"{where}: refusing to load it: it holds more than tensors, numbers and strings ({detail}). {REFUSED}"
        ) from None
    except Exception as e:
        # Bytes that are no pickle at all fail inside torch.load's own parsing before
        # the unpickler judges them (an IndexError, a KeyError, a UnicodeDecodeError,
        # "Invalid magic number", a zip without its central directory): damage too.
        raise ValueError(f"{where}: damaged ({first_line(e)})") from None


# Every global a DCP .metadata pickle names (found by recording find_class while
# reading checkpoints of torch 2.11 and 2.15): DCP's own dataclasses and enums,
# torch.Size, the dtypes and layouts, and the checkpoint's path.
_METADATA_CLASSES = {
    (dcp_metadata.__name__, name)
    for name in (
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    (_StorageInfo.__module__, _StorageInfo.__name__),
    ("torch", "Size"),
    # Maps a layout's name ("torch.strided") to the layout: a lookup, nothing else.
    ("torch.serialization", "_get_layout"),
    ("pathlib", PosixPath.__name__),
    ("pathlib", PurePosixPath.__name__),
    ("collections", "OrderedDict"),
}


def _enum_member(cls: Any, name: str) -> Any:
    """What ``builtins.getattr`` may do in DCP metadata: name a member of one of DCP's enums.

    Some Python versions pickle an enum member as ``getattr(EnumClass, "NAME")``
    (the trainer image's does, for ``_MEM_FORMAT_ENCODING``). A real ``getattr``
    would reach any attribute of an allowed class (``PosixPath.unlink``), so only
    this lookup is given.
    """
    allowed = isinstance(cls, type) and issubclass(cls, enum.Enum)
    allowed = allowed and (cls.__module__, cls.__qualname__) in _METADATA_CLASSES
    if not allowed or not isinstance(name, str) or name not in cls.__members__:
        raise UnsafeCheckpointError(
            f"refusing to load it: it calls getattr({getattr(cls, '__name__', type(cls).__name__)}, {name!r}), "
            f"which DCP metadata never does. {REFUSED}"
        )
    return cls[name]


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout)):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"{self.where}: refusing to load it: it names {module}.{name}, which DCP metadata never holds. {REFUSED}"
        )


def read_metadata_file(stream: IO[bytes], where: str) -> dcp_metadata.Metadata:
    """A DCP ``.metadata`` pickle, its globals restricted to DCP's metadata classes."""
    try:
        metadata = _MetadataUnpickler(stream, where).load()
    except UnsafeCheckpointError as e:
        text = str(e)
        raise (e if text.startswith(where) else UnsafeCheckpointError(f"{where}: {text}")) from None
    except Exception as e:  # truncated or garbage: EOF, unpickling, value and type errors
        raise ValueError(f"{where}: damaged ({first_line(e)})") from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise ValueError(f"{where}: damaged (a {type(metadata).__name__}, not DCP metadata)")
    return metadata


class SafeReader(dcp.FileSystemReader):
    """DCP's file system reader, its ``.metadata`` read by ``read_metadata_file``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        # torch >= 2.13 may keep one metadata file per rank; older versions have one.
        locate = getattr(self, "_get_metadata_path", None)
        path = locate(kwargs.get("rank")) if locate is not None else Path(self.path) / ".metadata"
        with self.fs.create_stream(path, "rb") as stream:
            # torch types the stream io.IOBase (which has no read()); it is the file opened "rb".
            metadata = read_metadata_file(cast(IO[bytes], stream), str(path))
        storage_meta: dcp_metadata.StorageMeta | None = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = dcp_metadata.StorageMeta()
        storage_meta.load_id = getattr(self, "load_id", None)
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, its non-tensor items unpickled weights-only."""

    def __init__(self, where: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.where = where

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        loaded = load_weights_only(value, f"{self.where} (item {fqn})")
        # Where the parent puts the value (torch's DefaultLoadPlanner.load_bytes), minus its unpickling.
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def saved_metadata(path: Path) -> dcp_metadata.Metadata:
    """The DCP metadata of the checkpoint at ``path``, read as data."""
    return SafeReader(str(path)).read_metadata()


def load(state: dict[str, Any], path: Path, **kwargs: Any) -> None:
    """``dcp.load`` of ``path`` into ``state``, no file of it unpickled with code allowed.

    UnsafeCheckpointError as itself, not inside DCP's CheckpointException: the
    caller stops on it rather than falling back to an older checkpoint.
    """
    # DCP turns an error while reading the metadata into the text of an AssertionError: read it here first.
    saved_metadata(path)
    try:
        dcp.load(state, storage_reader=SafeReader(str(path)), planner=SafeLoadPlanner(str(path)), **kwargs)
    except CheckpointException as e:
        unsafe = next((exc for exc, _ in e.failures.values() if isinstance(exc, UnsafeCheckpointError)), None)
        if unsafe is not None:
            raise unsafe from None
        raise
