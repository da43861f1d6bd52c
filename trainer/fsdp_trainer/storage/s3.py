"""The S3 store (``s3://bucket/prefix``), through boto3: the only module that speaks S3.

boto3 (AWS's SDK for Python) rather than s3torchconnector: the remote tier
copies files the local tier has already committed, which is plain object
I/O, and boto3's default credential chain covers EKS Pod Identity (from
boto3 1.34.41, the EKS user guide's "pod-id-minimum-sdk" page) and IRSA. It
reads ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for S3-compatible stores
as every AWS SDK does. With such an endpoint, path-style addressing is used:
the stores that need an endpoint rarely serve virtual-hosted bucket names.
"""

from __future__ import annotations

import builtins
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fsdp_api.object_keys import parse_s3_uri

from .base import ObjectInfo, ObjectStore, StoreError

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# Answers that mean "not now" (an overloaded or restarting store), after botocore's own retries.
TRANSIENT_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling", "ThrottlingException"}
)
_MISSING = ("404", "NoSuchKey", "NotFound")
# DeleteObjects takes at most this many keys per request.
_DELETE_BATCH = 1000

T = TypeVar("T")


def client() -> Any:
    """An S3 client from the default credential chain and the standard endpoint variables."""
    import boto3
    from botocore.config import Config

    # botocore logs every endpoint and credential lookup at INFO: not what a training log is for.
    logging.getLogger("botocore").setLevel(logging.WARNING)
    path_style = any(os.environ.get(v) for v in ENDPOINT_VARIABLES)
    config = Config(
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        s3={"addressing_style": "path"} if path_style else {},
    )
    # A session of its own: boto3's default session keeps the credentials it first found.
    return boto3.session.Session().client("s3", config=config)


def transient(e: BaseException) -> bool:
    """Whether ``e`` from botocore says the store cannot serve now (HTTP 5xx, 429, a throttling code)."""
    from botocore.exceptions import ClientError

    if not isinstance(e, ClientError):
        return False
    status = (e.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0
    return status >= 500 or status == 429 or (e.response.get("Error") or {}).get("Code") in TRANSIENT_CODES


def describe(e: BaseException, where: str, operation: str) -> StoreError:
    """``e`` from botocore as one line: ``s3://bucket/key: PutObject: AccessDenied (Access Denied)``."""
    from botocore.exceptions import ClientError

    if isinstance(e, ClientError):
        error = e.response.get("Error", {})
        code = error.get("Code") or "error"
        if code == "404":  # HEAD requests carry no body, so no error code of their own
            code = "NotFound"
        message = error.get("Message") or ""
        detail = f"{code} ({message})" if message and message != code else code
        return StoreError(f"{where}: {e.operation_name or operation}: {detail}", transient=transient(e))
    return StoreError(f"{where}: {operation}: {type(e).__name__} ({e})")


def _missing(e: BaseException) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(e, ClientError) and e.response.get("Error", {}).get("Code") in _MISSING


class S3Store(ObjectStore):
    scheme = "s3"

    @classmethod
    def parse(cls, uri: str) -> S3Store:
        return cls(*parse_s3_uri(uri))  # ValueError saying what is wrong with it

    def __init__(self, bucket: str, prefix: str) -> None:
        super().__init__(bucket, prefix)
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self, where: str) -> Any:
        # One client per store, made on first use (the check's probe reports a failure to make one);
        # boto3's clients are thread-safe, so the transfer pools share it.
        with self._lock:
            if self._client is None:
                try:
                    self._client = client()
                except Exception as e:
                    raise describe(e, where, "client") from None
            return self._client

    def _call(self, where: str, operation: str, call: Callable[[Any], T]) -> T:
        s3 = self._s3(where)
        try:
            return call(s3)
        except Exception as e:
            raise describe(e, where, operation) from None

    def list(self, prefix: str, *, limit: int | None = None) -> list[ObjectInfo]:
        def page_through(s3: Any) -> list[ObjectInfo]:
            found: list[ObjectInfo] = []
            if limit is not None:
                pages = [s3.list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=limit)]
            else:
                pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                found += [ObjectInfo(o["Key"], int(o["Size"]), o.get("ETag", "")) for o in page.get("Contents", [])]
            return found[:limit] if limit is not None else found

        return self._call(self.where(prefix.rstrip("/")), "ListObjectsV2", page_through)

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        def page_through(s3: Any) -> list[str]:
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/")
            return [c["Prefix"][len(prefix) :].rstrip("/") for page in pages for c in page.get("CommonPrefixes", [])]

        return self._call(self.where(prefix.rstrip("/")), "ListObjectsV2", page_through)

    def head(self, key: str) -> ObjectInfo | None:
        s3 = self._s3(self.where(key))
        try:
            found = s3.head_object(Bucket=self.bucket, Key=key)
        except Exception as e:
            if _missing(e):
                return None
            raise describe(e, self.where(key), "HeadObject") from None
        return ObjectInfo(key, int(found["ContentLength"]), found.get("ETag", ""))

    def get(self, key: str) -> bytes | None:
        s3 = self._s3(self.where(key))
        try:
            return s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as e:
            if _missing(e):
                return None
            raise describe(e, self.where(key), "GetObject") from None

    def download(self, key: str, path: Path) -> None:
        self._call(self.where(key), "GetObject", lambda s3: s3.download_file(self.bucket, key, str(path)))

    def put(self, key: str, data: bytes) -> None:
        self._call(self.where(key), "PutObject", lambda s3: s3.put_object(Bucket=self.bucket, Key=key, Body=data))

    def upload(self, path: Path, key: str) -> None:
        self._call(self.where(key), "PutObject", lambda s3: s3.upload_file(str(path), self.bucket, key))

    def delete(self, keys: builtins.list[str]) -> None:
        for i in range(0, len(keys), _DELETE_BATCH):
            self._delete_batch(keys[i : i + _DELETE_BATCH])

    def _delete_batch(self, batch: builtins.list[str]) -> None:
        if len(batch) == 1:
            (key,) = batch
            self._call(self.where(key), "DeleteObject", lambda s3: s3.delete_object(Bucket=self.bucket, Key=key))
            return
        objects = {"Objects": [{"Key": k} for k in batch], "Quiet": True}
        self._call(
            self.where(batch[0]), "DeleteObjects", lambda s3: s3.delete_objects(Bucket=self.bucket, Delete=objects)
        )
