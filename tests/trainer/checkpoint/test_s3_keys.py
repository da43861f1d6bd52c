"""Object keys from a bucket never become paths outside the download directory (a real S3 server, boto3).

S3 stores keys verbatim, and a remote step's manifest is itself an object: a
writer of the bucket names the keys. Both download paths (a committed step of
the remote tier, and model/data inputs under s3://) refuse such keys before
anything is requested or written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsdp_localcluster.s3 import S3Server
from fsdp_trainer.checkpoint.remote_store import MANIFEST, download_step, fetch_newer, sha256
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.remote_inputs import fetch
from fsdp_trainer.storage import ObjectInfo, StoreError, open_store

pytestmark = pytest.mark.slow  # a versitygw server for the module


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    server.create_bucket("keys")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Server:
    for name, value in {**s3.env(), "HF_HOME": str(tmp_path / "hf-home")}.items():
        monkeypatch.setenv(name, value)
    return s3


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("key", ["../../../../escaped", "/tmp/escaped-absolute", "a//b", "./a"])
def test_a_committed_step_whose_manifest_names_a_key_outside_is_refused_before_any_write(
    tmp_path: Path, s3_env: S3Server, key: str
) -> None:
    payload = tmp_path / "payload"
    payload.write_bytes(b"x" * 100)
    client = s3_env.client()
    prefix = f"run-{abs(hash(key))}"
    client.upload_file(str(payload), "keys", f"{prefix}/step-00000004/rank-0.distcp")
    manifest = {"objects": [{"key": "rank-0.distcp", "size": 100, "sha256": sha256(payload)}]}
    manifest["objects"].append({"key": key, "size": 100, "sha256": "0" * 64})
    client.put_object(Bucket="keys", Key=f"{prefix}/step-00000004/{MANIFEST}", Body=json.dumps(manifest).encode())
    root = tmp_path / "deep" / "er" / "still" / "checkpoints"
    root.mkdir(parents=True)

    with pytest.raises(StoreError) as refused:
        fetch_newer(f"s3://keys/{prefix}", root)
    assert str(refused.value).startswith(f"s3://keys/{prefix}/step-00000004/{MANIFEST}: key {key!r} ")
    assert "the manifest of step 4 is refused and nothing of it is downloaded" in str(refused.value)
    assert files_under(tmp_path) == ["payload"]
    assert not Path("/tmp/escaped-absolute").exists()
    # The step that is refused is not taken for a damaged download either: nothing was requested.
    with pytest.raises(StoreError):
        download_step(open_store(f"s3://keys/{prefix}"), 4, manifest, root)
    assert files_under(tmp_path) == ["payload"]


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("models/m/../../../../escaped", "key '../../../../escaped' has an empty, '.' or '..' segment"),
        ("models/m//etc/escaped", "key '/etc/escaped' is absolute"),
    ],
)
def test_an_input_prefix_listing_a_key_that_leaves_it_is_refused_in_one_line(
    tmp_path: Path, s3_env: S3Server, monkeypatch: pytest.MonkeyPatch, key: str, reason: str
) -> None:
    """AWS S3 lists such keys verbatim; versitygw's file backend normalises them on write, so the listing adds one."""
    import fsdp_trainer.remote_inputs as remote_inputs

    s3_env.client().put_object(Bucket="keys", Key="models/m/config.json", Body=b"{}")
    listed = remote_inputs._objects

    def with_planted_key(store):  # type: ignore[no-untyped-def]
        single, objects = listed(store)
        return single, [*objects, ObjectInfo(key, 1, '"x"')]

    monkeypatch.setattr(remote_inputs, "_objects", with_planted_key)
    with pytest.raises(ConfigError) as refused:
        fetch("s3://keys/models/m", "model.pretrained")
    assert refused.value.lines == [
        f"model.pretrained: s3://keys/models/m: object {key!r} refused, nothing fetched: {reason}"
    ]
    hf_home = tmp_path / "hf-home"
    assert not hf_home.exists() or files_under(hf_home) == [], "not even the good object is fetched"
    assert not (tmp_path / "escaped").exists()


def test_an_input_uri_that_is_no_s3_location_is_one_config_line(s3_env: S3Server) -> None:
    with pytest.raises(ConfigError) as refused:
        fetch("s3://a..b/models/m", "model.pretrained")
    assert refused.value.lines == [
        "model.pretrained: 's3://a..b/models/m': the bucket has two adjacent dots, which S3 bucket names never have"
    ]


def test_a_plain_prefix_still_downloads_under_the_cache(tmp_path: Path, s3_env: S3Server) -> None:
    client = s3_env.client()
    client.put_object(Bucket="keys", Key="data/ok/part-0.jsonl", Body=b'{"text": "a"}\n')
    client.put_object(Bucket="keys", Key="data/ok/sub/part-1.jsonl", Body=b'{"text": "b"}\n')
    local = fetch("s3://keys/data/ok", "data.path")
    assert local == tmp_path / "hf-home" / "s3" / "keys" / "data" / "ok"
    assert files_under(local) == ["part-0.jsonl", os.path.join("sub", "part-1.jsonl")]
