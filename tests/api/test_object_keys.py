"""Object-store URIs and keys: what may be requested, and where a key may land on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fsdp_api.object_keys import UnsafeKey, local_path, parse_s3_uri, s3_uri_problem

GOOD_URIS = {
    "s3://bucket": ("bucket", ""),
    "s3://bucket/": ("bucket", ""),
    "s3://my.bucket-1/models/qwen3/": ("my.bucket-1", "models/qwen3"),
    "s3://bkt/a/.hidden/..dots": ("bkt", "a/.hidden/..dots"),
}
BAD_URIS = {
    "gs://bucket/x": "is not s3://bucket[/prefix]",
    "s3://ab/x": "the bucket is not an S3 bucket name",
    "s3://Bucket/x": "the bucket is not an S3 bucket name",
    "s3://-bucket/x": "the bucket is not an S3 bucket name",
    "s3://a..b/x": "the bucket has two adjacent dots",
    "s3://192.168.5.4/x": "the bucket is formatted as an IP address",
    "s3://bucket//": "the prefix has an empty, '.' or '..' segment",
    "s3://bucket/a//b": "the prefix has an empty, '.' or '..' segment",
    "s3://bucket/../other": "the prefix has an empty, '.' or '..' segment",
    "s3://bucket/a/./b": "the prefix has an empty, '.' or '..' segment",
    "s3://bucket/a/..": "the prefix has an empty, '.' or '..' segment",
    "s3://bucket/a\x00b": "the prefix has a control character",
    "s3://bucket/a\\b": "the prefix has a backslash",
    "s3://bucket/data/*.jsonl": "the prefix has a glob character: S3 has no globs",
}


@pytest.mark.parametrize("uri", sorted(GOOD_URIS))
def test_a_good_s3_uri_parses_into_bucket_and_prefix(uri: str) -> None:
    assert s3_uri_problem(uri) is None
    assert parse_s3_uri(uri) == GOOD_URIS[uri]


@pytest.mark.parametrize("uri", sorted(BAD_URIS))
def test_a_bad_s3_uri_is_refused_with_its_reason(uri: str) -> None:
    assert BAD_URIS[uri] in (s3_uri_problem(uri) or "")
    with pytest.raises(ValueError, match=r"^'(s3|gs)://"):
        parse_s3_uri(uri)


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("../../../../x", "has an empty, '.' or '..' segment"),
        ("a/../../x", "has an empty, '.' or '..' segment"),
        ("/etc/passwd", "is absolute"),
        ("a//b", "has an empty, '.' or '..' segment"),
        ("./a", "has an empty, '.' or '..' segment"),
        ("", "key is empty"),
        ("a\nb", "has a control character"),
    ],
)
def test_a_key_that_leaves_the_directory_is_refused_and_nothing_is_created(
    tmp_path: Path, key: str, reason: str
) -> None:
    root = tmp_path / "download"
    with pytest.raises(UnsafeKey, match=reason.replace(".", r"\.")):
        local_path(root, key)
    assert not root.exists() and sorted(os.listdir(tmp_path)) == []


def test_a_symlink_inside_the_directory_cannot_lead_out(tmp_path: Path) -> None:
    root = tmp_path / "download"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(UnsafeKey, match="leads outside"):
        local_path(root, "link/x")


def test_a_plain_key_lands_under_the_directory(tmp_path: Path) -> None:
    assert local_path(tmp_path, "step-00000004/.parts/rank-0.json") == tmp_path / "step-00000004/.parts/rank-0.json"
    assert local_path(tmp_path, "..data/x") == tmp_path / "..data" / "x"  # dots inside a name are no segment
