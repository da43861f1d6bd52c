"""The object-store registry and interface (``fsdp_trainer.storage``), without a server.

The real-S3 behaviour (versitygw on loopback, boto3) is in ``checkpoint/test_remote_tier.py``
and ``checkpoint/test_s3_keys.py``; here the registry, the naming of keys and the probe's rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_api.object_keys import STORE_SCHEMES
from fsdp_trainer.storage import STORES, ObjectInfo, ObjectStore, StoreError, is_remote, open_store, scheme_of
from fsdp_trainer.storage.s3 import S3Store


def test_the_registry_holds_exactly_the_schemes_the_spec_accepts() -> None:
    assert sorted(STORES) == sorted(STORE_SCHEMES)
    assert all(STORES[s].scheme == s for s in STORES)


@pytest.mark.parametrize(
    ("ref", "scheme", "remote"),
    [
        ("s3://bucket/prefix", "s3", True),
        ("gs://bucket/prefix", "gs", False),
        ("/data/models/m", None, False),
        ("meta-llama/Llama-3.2-1B", None, False),
        (None, None, False),
    ],
)
def test_a_reference_is_remote_only_for_a_registered_scheme(ref: str | None, scheme: str | None, remote: bool) -> None:
    assert (scheme_of(ref), is_remote(ref)) == (scheme, remote)


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("gs://bucket/run", "'gs://bucket/run': is not a location of a store the trainer reads (s3://)"),
        ("s3://a..b/run", "'s3://a..b/run': the bucket has two adjacent dots, which S3 bucket names never have"),
    ],
)
def test_opening_a_store_the_trainer_cannot_read_says_why_in_one_line(uri: str, problem: str) -> None:
    with pytest.raises(ValueError) as refused:
        open_store(uri)
    assert str(refused.value) == problem


def test_keys_are_whole_keys_under_the_prefix_and_messages_name_them_as_uris() -> None:
    store = open_store("s3://bucket/runs/one/")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, str(store)) == ("bucket", "runs/one", "s3://bucket/runs/one")
    assert store.key("step-00000004", "MANIFEST.json") == "runs/one/step-00000004/MANIFEST.json"
    assert store.dir_key("step-00000004") == "runs/one/step-00000004/"
    assert store.where(store.key("x")) == "s3://bucket/runs/one/x"
    parent = store.at("runs")
    assert (type(parent), str(parent)) == (S3Store, "s3://bucket/runs")
    root = open_store("s3://bucket")
    assert (root.key(), root.dir_key(), str(root), root.key("a")) == ("", "", "s3://bucket", "a")


class _AnsweringStore(ObjectStore):
    """A store whose calls all fail with ``error`` (or succeed when None), recording what was asked."""

    scheme = "mem"

    def __init__(self, error: StoreError | None) -> None:
        super().__init__("bucket", "run")
        self.error, self.calls = error, []

    @classmethod
    def parse(cls, uri: str) -> ObjectStore:
        raise NotImplementedError

    def _answer(self, *call: object) -> None:
        self.calls.append(call)
        if self.error is not None:
            raise self.error

    def list(self, prefix: str, *, limit: int | None = None) -> list[ObjectInfo]:
        self._answer("list", prefix, limit)
        return []

    def list_dirs(self, prefix: str) -> list[str]:
        return []

    def head(self, key: str) -> ObjectInfo | None:
        return None

    def get(self, key: str) -> bytes | None:
        return None

    def download(self, key: str, path: Path) -> None: ...

    def put(self, key: str, data: bytes) -> None:
        self._answer("put", key, data)

    def upload(self, path: Path, key: str) -> None: ...

    def delete(self, keys: list[str]) -> None:
        self._answer("delete", *keys)


def test_the_probe_lists_writes_and_deletes_one_object_and_a_store_that_cannot_serve_now_is_a_warning() -> None:
    fine = _AnsweringStore(None)
    assert fine.probe() == ([], [])
    (listed, put, deleted) = fine.calls
    assert listed == ("list", "run", 1)
    assert put[1].startswith("run/.fsdp-probe-") and put[2] == b""
    assert deleted == ("delete", put[1])

    busy = StoreError("mem://bucket/run: ListObjects: SlowDown", transient=True)
    assert _AnsweringStore(busy).probe() == ([], [f"{busy} now: training starts, and its uploads retry"])
    denied = StoreError("mem://bucket/run: ListObjects: AccessDenied")
    assert _AnsweringStore(denied).probe() == ([str(denied)], [])
