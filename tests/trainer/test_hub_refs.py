"""The Hugging Face hub code paths, exercised on local files only (HF_HUB_OFFLINE=1).

``data.dataset`` goes through ``datasets.load_dataset(id, config, split=...)``
exactly as a hub id would; a local dataset directory takes the same call.
Hub ids that are not local fail fast and clearly when offline, before any
process group. Which references count as local paths: ``model/hub.py``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from fsdp_api.spec import DataSpec
from fsdp_trainer.build import prepare
from fsdp_trainer.config import load_config
from fsdp_trainer.data.loader import TrainData, validation_batches
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.model.hub import local_path
from transformers import AutoTokenizer

from tests.trainer.harness import SEQ_LEN, base_config, cpu_world


@pytest.fixture
def dataset_dir(tmp_path: Path, inputs: dict[str, Path]) -> Path:
    """A dataset repository layout: one file per split."""
    lines = inputs["aligned"].read_text().splitlines()
    root = tmp_path / "my-dataset"
    root.mkdir()
    (root / "train.jsonl").write_text("\n".join(lines[:100]) + "\n")
    (root / "validation.jsonl").write_text("\n".join(lines[100:120]) + "\n")
    return root


@pytest.mark.parametrize("streaming", [False, True])
def test_dataset_splits_through_load_dataset(dataset_dir: Path, inputs: dict[str, Path], streaming: bool) -> None:
    tokenizer = AutoTokenizer.from_pretrained(inputs["tokenizer"])
    spec = DataSpec(dataset=str(dataset_dir), split="train", validation_split="validation", streaming=streaming)
    data = TrainData(spec, tokenizer, seq_len=SEQ_LEN, micro_batch_size=4, rank=0, world_size=1, seed=0)
    train_rows = {tuple(r) for _ in range(25) for r in data.next_batch().labels.tolist()}
    val = validation_batches(spec, tokenizer, seq_len=SEQ_LEN, micro_batch_size=4, eval_steps=5, rank=0, world_size=1)
    val_rows = {tuple(r) for b in val for r in b.labels.tolist()}
    # With a validation split nothing of the training split is held out: all 100 documents train.
    assert len(train_rows) == 100
    assert len(val_rows) == 20 and not train_rows & val_rows
    texts = [json.loads(x)["text"] for x in (dataset_dir / "validation.jsonl").read_text().splitlines()]
    assert {tokenizer.decode(torch.tensor(r), skip_special_tokens=True) for r in val_rows} == set(texts)


def _prepare(tmp_path: Path, config: dict) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    prepare(load_config(path), cpu_world())


def test_hub_ids_fail_clearly_when_offline(tmp_path: Path, inputs: dict[str, Path]) -> None:
    config = base_config(tmp_path, inputs["aligned"], inputs["tokenizer"])
    config["model"] = {"pretrained": "example-org/no-such-model"}
    with pytest.raises(ConfigError) as info:
        _prepare(tmp_path, config)
    (line,) = info.value.lines
    assert line.startswith("model.pretrained: cannot fetch example-org/no-such-model from the Hugging Face hub")

    config = base_config(tmp_path, inputs["aligned"], inputs["tokenizer"])
    config["data"]["tokenizer"] = "example-org/no-such-tokenizer"
    with pytest.raises(ConfigError) as info:
        _prepare(tmp_path, config)
    assert info.value.lines[0].startswith("data.tokenizer: cannot load a tokenizer from example-org/no-such-tokenizer")


def test_missing_local_dataset_directory(tmp_path: Path, inputs: dict[str, Path]) -> None:
    config = base_config(tmp_path, inputs["aligned"], inputs["tokenizer"])
    config["data"] = {"dataset": str(tmp_path / "gone"), "tokenizer": str(inputs["tokenizer"])}
    with pytest.raises(ConfigError) as info:
        _prepare(tmp_path, config)
    assert info.value.lines == [
        f"data.dataset: {tmp_path / 'gone'} does not exist (a local dataset directory or a hub id)"
    ]


def test_local_paths_and_hub_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert local_path("meta-llama/Llama-3.2-1B") is None
    assert local_path("./meta-llama/Llama-3.2-1B") == Path("./meta-llama/Llama-3.2-1B")
    assert local_path("/models/llama") == Path("/models/llama")
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert local_path("org/model") == Path("org/model")  # an existing directory wins


@pytest.fixture
def silent_proxy() -> Iterator[str]:
    """A proxy that accepts connections and never answers, as a firewall that swallows them does."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


def test_hub_ids_without_a_network_fail_once_in_one_line_per_field(
    tmp_path: Path, inputs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, silent_proxy: str
) -> None:
    """Issue 24: without HF_HUB_OFFLINE and with no answer from the hub, the hub client waited
    over 3 minutes without a word (huggingface_hub 2.4, measured until killed). Now one bounded probe."""
    from fsdp_trainer.model import hub

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, silent_proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setattr(hub, "HUB_PROBE_SECONDS", 1.0)
    config = base_config(tmp_path, inputs["aligned"], inputs["tokenizer"])
    config["model"] = {"pretrained": "example-org/some-model"}
    config["data"]["tokenizer"] = "example-org/some-tokenizer"
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        _prepare(tmp_path, config)
    assert time.monotonic() - started < 30
    assert info.value.lines == [
        f"{field}: cannot fetch example-org/some-{what}: the Hugging Face hub (https://huggingface.co) did not "
        "answer within 1 s (timed out); give a local path (a volume), or fill HF_HOME beforehand and set "
        "HF_HUB_OFFLINE=1"
        for field, what in (("model.pretrained", "model"), ("data.tokenizer", "tokenizer"))
    ]
    # A name that does not resolve fails the same way, at once; local paths never touch the network.
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var)
    assert hub.hub_unreachable(timeout=5) is not None
    local = base_config(tmp_path, inputs["aligned"], inputs["tokenizer"])
    _prepare(tmp_path, local)
