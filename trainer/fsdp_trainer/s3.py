"""S3 locations and the client the remote checkpoint tier uses.

boto3 (AWS's SDK for Python) rather than s3torchconnector: the remote tier
copies files the local tier has already committed, which is plain object
I/O, and boto3's default credential chain covers EKS Pod Identity (from
boto3 1.34.41, the EKS user guide's "pod-id-minimum-sdk" page) and IRSA. It
reads ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for S3-compatible stores
as every AWS SDK does. With such an endpoint, path-style addressing is used:
the stores that need an endpoint rarely serve virtual-hosted bucket names.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdp_api.object_keys import parse_s3_uri

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # no leading or trailing slash; "" for the bucket's root

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        return cls(*parse_s3_uri(uri))  # ValueError saying what is wrong with it

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class S3Error(RuntimeError):
    """An S3 call failed; the message names the location, the operation and the AWS error code."""


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


def upload_tree(local: Path, loc: S3Location) -> int:
    """Upload every file under ``local`` to ``loc`` (its relative paths as keys); the bytes sent.

    Refuses (S3Error) when ``loc`` already holds objects: an upload never overwrites.
    """
    from concurrent.futures import ThreadPoolExecutor

    s3 = client()
    prefix = loc.key() + "/" if loc.prefix else ""
    try:
        taken = s3.list_objects_v2(Bucket=loc.bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0)
    except Exception as e:
        raise describe(e, str(loc), "ListObjectsV2") from None
    if taken:
        raise S3Error(f"{loc} already holds objects; an upload never overwrites: give a new prefix")
    files = sorted(p for p in local.rglob("*") if p.is_file())

    def put(path: Path) -> int:
        key = prefix + path.relative_to(local).as_posix()
        try:
            s3.upload_file(str(path), loc.bucket, key)
        except Exception as e:
            raise describe(e, f"s3://{loc.bucket}/{key}", "PutObject") from None
        return path.stat().st_size

    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(put, files))


# Answers that mean "not now" (an overloaded or restarting store), after botocore's own retries.
TRANSIENT_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling", "ThrottlingException"}
)


def transient(e: BaseException) -> bool:
    """Whether ``e`` from botocore says the store cannot serve now (HTTP 5xx, 429, a throttling code)."""
    from botocore.exceptions import ClientError

    if not isinstance(e, ClientError):
        return False
    status = (e.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0
    return status >= 500 or status == 429 or (e.response.get("Error") or {}).get("Code") in TRANSIENT_CODES


def describe(e: BaseException, where: str, operation: str) -> S3Error:
    """``e`` from botocore as one line: ``s3://bucket/key: PutObject: AccessDenied (Access Denied)``."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(e, ClientError):
        error = e.response.get("Error", {})
        code = error.get("Code") or "error"
        if code == "404":  # HEAD requests carry no body, so no error code of their own
            code = "NotFound"
        message = error.get("Message") or ""
        detail = f"{code} ({message})" if message and message != code else code
        return S3Error(f"{where}: {e.operation_name or operation}: {detail}")
    if isinstance(e, BotoCoreError):
        return S3Error(f"{where}: {operation}: {type(e).__name__} ({e})")
    return S3Error(f"{where}: {operation}: {type(e).__name__} ({e})")
