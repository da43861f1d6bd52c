"""The object-store interface the trainer's remote paths use: one protocol, one error type.

The remote checkpoint tier, the S3 inputs (``model.pretrained``, ``data.path``),
``fsdp-train export --output`` and ``generate --checkpoint`` read and write
objects through an ``ObjectStore`` opened on a URI (``storage.open_store``);
none of them knows which service answers. A store is one location: a bucket
(or container) and a prefix in it. Keys are whole keys in the bucket, built by
``key``; ``where`` names one in messages the way the user wrote the URI.
torchtitan's checkpointer keeps its storage behind a protocol the same way
(``CheckpointStorage``, components/checkpointer/base.py).
"""

from __future__ import annotations

import builtins
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path


class StoreError(RuntimeError):
    """A call on a store failed: one line naming the location, the operation and the service's error.

    ``transient``: the store answered that it cannot serve now (HTTP 5xx, 429, a
    throttling code) after the client's own retries; a later call may succeed.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str  # the store's version tag of the bytes: equal tags, equal bytes


class ObjectStore(ABC):
    """One location of an object store: ``scheme://bucket[/prefix]``."""

    scheme: str

    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")  # "" for the bucket's root

    @classmethod
    @abstractmethod
    def parse(cls, uri: str) -> ObjectStore:
        """The store at ``uri``; ValueError saying what is wrong with it."""

    def key(self, *parts: str) -> str:
        """The whole key of ``parts`` under this location's prefix."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p)

    def dir_key(self, *parts: str) -> str:
        """``key(*parts)`` as a prefix that lists what lies under it ("" for the bucket's root)."""
        whole = self.key(*parts)
        return whole + "/" if whole else ""

    def where(self, key: str) -> str:
        """``key`` as a URI, for messages."""
        return f"{self.scheme}://{self.bucket}/{key}" if key else f"{self.scheme}://{self.bucket}"

    def at(self, prefix: str) -> ObjectStore:
        """The same store at another prefix of the same bucket."""
        return type(self)(self.bucket, prefix)

    def __str__(self) -> str:
        return self.where(self.prefix)

    @abstractmethod
    def list(self, prefix: str, *, limit: int | None = None) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, at any depth (the first ``limit`` of them)."""

    @abstractmethod
    def list_dirs(self, prefix: str) -> builtins.list[str]:
        """The names one level below ``prefix`` (a ``dir_key``) that hold objects."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """The object ``key``; None when there is none."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The bytes of ``key``; None when there is no such object."""

    @abstractmethod
    def download(self, key: str, path: Path) -> None:
        """Write the object ``key`` to the file ``path``."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def upload(self, path: Path, key: str) -> None:
        """Store the file ``path`` as ``key``."""

    @abstractmethod
    def delete(self, keys: builtins.list[str]) -> None:
        """Delete the objects ``keys`` (a missing one is no error)."""

    def probe(self) -> tuple[builtins.list[str], builtins.list[str]]:
        """What ``fsdp-train check`` asks of a store: list it, write and delete an object; (errors, warnings).

        A wrong bucket, address or credentials stay wrong: an error. A store that
        answers it cannot serve now may be back before the first upload, which
        retries too: a warning.
        """
        key = self.key(f".fsdp-probe-{uuid.uuid4().hex[:12]}")
        try:
            self.list(self.key(), limit=1)
            self.put(key, b"")
            self.delete([key])
        except StoreError as e:
            if e.transient:
                return [], [f"{e} now: training starts, and its uploads retry"]
            return [str(e)], []
        return [], []
