"""Object stores by URI scheme: one registry, so a second service is one module and one line.

``open_store("s3://bucket/prefix")`` gives the store of that location. The
schemes the spec accepts (``checkpoint.remote``, ``model.pretrained``,
``data.path``) are ``fsdp_api.object_keys.STORE_SCHEMES``; the registry below
holds exactly those (a test checks it), and nothing outside this package
imports boto3 or names S3.
"""

from __future__ import annotations

from typing import TypeGuard

from fsdp_api.object_keys import STORE_SCHEMES

from .base import ObjectInfo, ObjectStore, StoreError
from .s3 import S3Store
from .transfer import delete_prefix, upload_tree

STORES: dict[str, type[ObjectStore]] = {S3Store.scheme: S3Store}


def scheme_of(ref: str | None) -> str | None:
    """The scheme of a ``scheme://`` reference; None for a path or a hub id."""
    head, sep, _ = (ref or "").partition("://")
    return head if sep else None


def is_remote(ref: str | None) -> TypeGuard[str]:
    """Whether ``ref`` names a location in one of the stores (rather than a path or a hub id)."""
    return scheme_of(ref) in STORES


def open_store(uri: str) -> ObjectStore:
    """The store at ``uri``; ValueError saying what is wrong with it (an unknown scheme, a bad bucket)."""
    scheme = scheme_of(uri)
    if scheme not in STORES:
        known = ", ".join(f"{s}://" for s in STORE_SCHEMES)
        raise ValueError(f"{uri!r}: is not a location of a store the trainer reads ({known})")
    return STORES[scheme].parse(uri)


__all__ = [
    "STORES",
    "ObjectInfo",
    "ObjectStore",
    "StoreError",
    "delete_prefix",
    "is_remote",
    "open_store",
    "scheme_of",
    "upload_tree",
]
