"""Data: local files through the Hugging Face ``datasets`` loaders, packing, rank
sharding, the validation hold-out and exact resume positions (in-process)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from fsdp_api.spec import DataSpec
from fsdp_trainer.data import files as datafiles
from fsdp_trainer.data.loader import TrainData, validation_batches
from fsdp_trainer.data.packing import Batch, Packer
from fsdp_trainer.data.prefetch import PrefetchedData
from fsdp_trainer.data.sources import holdout_mask, is_holdout_text
from transformers import AutoTokenizer

from tests.trainer.harness import SEQ_LEN

SEQ = 16


def _docs(sample_ids: list[str]) -> set[int]:
    return {int(re.match(r"e\d+/d(\d+)@", s).group(1)) for s in sample_ids}


@pytest.fixture(scope="module")
def tokenizer(inputs: dict[str, Path]):
    return AutoTokenizer.from_pretrained(inputs["tokenizer"])


def _data(spec: DataSpec, tokenizer, rank: int = 0, world: int = 1, mb: int = 2, seq: int = SEQ) -> TrainData:
    return TrainData(spec, tokenizer, seq_len=seq, micro_batch_size=mb, rank=rank, world_size=world, seed=3)


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def test_local_formats_load_through_datasets(tmp_path: Path, inputs: dict[str, Path], tokenizer) -> None:
    texts = _texts(inputs["ragged"])[:40]
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "a.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in texts[:20]))
    (tmp_path / "jsonl" / "b.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in texts[20:]))
    pq.write_table(pa.table({"text": texts}), tmp_path / "docs.parquet")
    (tmp_path / "docs.txt").write_text("\n\n".join(texts))  # paragraphs are documents
    cases = {
        "directory of jsonl, custom column": DataSpec(path=str(tmp_path / "jsonl"), text_field="body"),
        "glob": DataSpec(path=str(tmp_path / "jsonl" / "*.jsonl"), text_field="body"),
        "parquet": DataSpec(path=str(tmp_path / "docs.parquet")),
        "txt": DataSpec(path=str(tmp_path / "docs.txt")),
        "streamed jsonl": DataSpec(path=str(tmp_path / "jsonl"), text_field="body", streaming=True),
    }
    vocab = set(" ".join(texts).split())
    for name, spec in cases.items():
        data = _data(spec, tokenizer)
        batch = data.next_batch()
        assert batch.inputs.shape == (2, SEQ) and batch.labels.shape == (2, SEQ), name
        assert torch.equal(batch.inputs[:, 1:], batch.labels[:, :-1]), name
        words = set(tokenizer.decode(batch.inputs[0], skip_special_tokens=True).split())
        assert words and words <= vocab, name
        if name != "streamed jsonl":
            assert data.docs.train_indices.size >= 39, name  # every document read, at most one held out


def test_windows_are_the_concatenated_documents(inputs: dict[str, Path], tokenizer) -> None:
    data = _data(DataSpec(path=str(inputs["ragged"])), tokenizer, mb=1)
    texts = _texts(inputs["ragged"])
    batches = [data.next_batch() for _ in range(30)]
    stream = torch.cat([torch.cat([b.inputs[0], b.labels[0, -1:]]) for b in batches]).tolist()
    order = data.docs._epoch_order(0)
    expected: list[int] = []
    for i in order:
        expected += [tokenizer.bos_token_id, *tokenizer(texts[i], add_special_tokens=False)["input_ids"], 1]
        if len(expected) >= len(stream):
            break
    assert stream == expected[: len(stream)]
    # A window's id is the document and token offset where it starts.
    assert batches[0].sample_ids[0] == f"e0/d{order[0]}@0"


def test_ranks_read_disjoint_documents_and_never_the_held_out_ones(inputs: dict[str, Path], tokenizer) -> None:
    spec = DataSpec(path=str(inputs["ragged"]))
    assigned: dict[int, set[int]] = {}
    for rank in (0, 1):
        data = _data(spec, tokenizer, rank=rank, world=2, mb=4)
        assigned[rank] = set(data.docs._epoch_order(0).tolist())
        ids: list[str] = []
        while data.docs.epoch == 0:
            ids += data.next_batch().sample_ids
        # Every window a rank trains on starts in one of its own documents.
        assert _docs([s for s in ids if s.startswith("e0/")]) <= assigned[rank]
    held_out = set(torch.nonzero(torch.from_numpy(holdout_mask(400))).flatten().tolist())
    assert held_out and not assigned[0] & assigned[1]
    assert assigned[0] | assigned[1] == set(range(400)) - held_out


@pytest.mark.parametrize("streaming", [False, True])
def test_resumed_position_continues_with_the_next_window(inputs: dict[str, Path], tokenizer, streaming: bool) -> None:
    spec = DataSpec(path=str(inputs["ragged"]), streaming=streaming)
    straight = _data(spec, tokenizer, rank=1, world=2)
    want = [straight.next_batch() for _ in range(12)]

    first = _data(spec, tokenizer, rank=1, world=2)
    got: list[Batch] = [first.next_batch() for _ in range(7)]
    state = first.state_dict()
    assert state["buffer"], "the checkpoint falls mid-document"
    resumed = _data(spec, tokenizer, rank=1, world=2)
    resumed.load_state_dict(state)
    got += [resumed.next_batch() for _ in range(5)]
    for a, b in zip(want, got, strict=True):
        assert a.sample_ids == b.sample_ids
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)


def test_epochs_reshuffle_deterministically(tmp_path: Path, inputs: dict[str, Path], tokenizer) -> None:
    path = tmp_path / "few.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(inputs["aligned"])[:30]))
    data = _data(DataSpec(path=str(path)), tokenizer, mb=1, seq=SEQ_LEN)  # one window per document
    orders = [list(data.docs._epoch_order(e)) for e in (0, 1)]
    assert sorted(orders[0]) == sorted(orders[1]) and orders[0] != orders[1]
    ids = [data.next_batch().sample_ids[0] for _ in range(2 * len(orders[0]))]
    assert ids[: len(orders[0])] == [f"e0/d{i}@0" for i in orders[0]]
    assert ids[len(orders[0]) :] == [f"e1/d{i}@0" for i in orders[1]]
    again = _data(DataSpec(path=str(path)), tokenizer, mb=1, seq=SEQ_LEN)
    assert [again.next_batch().sample_ids[0] for _ in range(len(ids))] == ids


def test_validation_batches_are_fixed_and_split_across_ranks(inputs: dict[str, Path], tokenizer) -> None:
    spec = DataSpec(path=str(inputs["aligned"]))
    kwargs = {"seq_len": SEQ_LEN, "micro_batch_size": 2, "eval_steps": 2, "world_size": 2}
    rank0 = validation_batches(spec, tokenizer, rank=0, **kwargs)
    rank1 = validation_batches(spec, tokenizer, rank=1, **kwargs)
    assert len(rank0) == len(rank1) == 2
    windows0 = {tuple(b.inputs[i].tolist()) for b in rank0 for i in range(2)}
    windows1 = {tuple(b.inputs[i].tolist()) for b in rank1 for i in range(2)}
    assert len(windows0) == len(windows1) == 4 and not windows0 & windows1
    again = validation_batches(spec, tokenizer, rank=0, **kwargs)
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(rank0, again, strict=True))
    # Aligned documents are one window each: the validation windows are the held-out documents.
    texts = _texts(inputs["aligned"])
    held_out = {
        tuple(tokenizer(texts[i], add_special_tokens=False)["input_ids"][:10])
        for i in range(len(texts))
        if holdout_mask(len(texts))[i]
    }
    assert {w[1:11] for w in windows0 | windows1} <= held_out


def test_streamed_hold_out_is_by_content(inputs: dict[str, Path], tokenizer) -> None:
    texts = _texts(inputs["aligned"])  # one window per document
    held = {t for t in texts if is_holdout_text(t)}
    assert 0 < len(held) < len(texts) / 10
    spec = DataSpec(path=str(inputs["aligned"]), streaming=True)
    data = _data(spec, tokenizer, mb=10, seq=SEQ_LEN)
    trained = set()
    for _ in range(len(texts) // 10):
        batch = data.next_batch()
        trained |= {tokenizer.decode(row, skip_special_tokens=True) for row in batch.labels}
    assert len(trained) == len(texts) - len(held)
    assert not trained & held
    val = validation_batches(spec, tokenizer, seq_len=SEQ_LEN, micro_batch_size=2, eval_steps=50, rank=0, world_size=1)
    validated = {tokenizer.decode(row, skip_special_tokens=True) for b in val for row in b.labels}
    # Whole micro-batches only: an odd last window is left out.
    assert validated <= held and len(validated) == len(held) // 2 * 2


def test_packer_state_round_trip() -> None:
    packer = Packer(window=5)
    packer.add("a", [1, 2, 3])
    packer.add("b", [4, 5, 6, 7, 8, 9])
    assert packer.take() == ([1, 2, 3, 4, 5], "a@0")
    other = Packer(window=5)
    other.load_state_dict(packer.state_dict())
    other.add("c", [10])
    assert other.take() == ([6, 7, 8, 9, 10], "b@2")


def test_prefetching_keeps_the_position_of_the_last_batch_handed_out(inputs: dict[str, Path], tokenizer) -> None:
    spec = DataSpec(path=str(inputs["ragged"]))
    straight = _data(spec, tokenizer)
    want = [straight.next_batch() for _ in range(8)]
    pre = PrefetchedData(_data(spec, tokenizer), depth=3)
    got = [pre.next_batch() for _ in range(5)]
    deadline = time.monotonic() + 10
    while not pre._queue.full() and time.monotonic() < deadline:
        time.sleep(0.01)  # let the thread read ahead
    state = pre.state_dict()
    pre.close()
    resumed = _data(spec, tokenizer)
    resumed.load_state_dict(state)
    got += [resumed.next_batch() for _ in range(3)]
    assert [b.sample_ids for b in got] == [b.sample_ids for b in want]


def test_prefetch_errors_reach_the_train_loop(inputs: dict[str, Path], tokenizer) -> None:
    pre = PrefetchedData(_data(DataSpec(path=str(inputs["ragged"]), text_field="body"), tokenizer))
    with pytest.raises(KeyError, match="body"):
        pre.next_batch()
    pre.close()


def test_too_little_data_for_one_sequence_is_an_error_not_a_hang(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps({"text": "w1 w2 w3"}) + "\n" for _ in range(3)))
    data = _data(DataSpec(path=str(path)), tokenizer, seq=64)
    with pytest.raises(ValueError, match="fewer tokens than one sequence"):
        data.next_batch()


def test_data_file_resolution(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "b.JSONL").write_text("{}\n")
    (tmp_path / "readme.md").write_text("x")
    assert datafiles.resolve(str(tmp_path)) == datafiles.DataFiles(
        "json", (str(tmp_path / "a.jsonl"), str(tmp_path / "b.JSONL"))
    )
    (tmp_path / "c.parquet").write_bytes(b"")
    with pytest.raises(datafiles.DataFilesError, match="mixes file formats"):
        datafiles.resolve(str(tmp_path))
    assert datafiles.resolve(str(tmp_path / "*.parquet")).builder == "parquet"
