"""Supervised formats (data.format chat and prompt-completion): which tokens are trained,
packing whole rows, the overlong option, the loss over trained tokens only, exact resume,
validation, and the config errors (in-process)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from fsdp_api.spec import DataSpec
from fsdp_trainer.build import prepare
from fsdp_trainer.config import load_config
from fsdp_trainer.data.formats import ChatEncoder, PromptCompletionEncoder
from fsdp_trainer.data.loader import TrainData, row_counts, validation_batches
from fsdp_trainer.data.packing import IGNORE_INDEX, Batch
from fsdp_trainer.data.sft import Document, DocumentPacker, stack_sequences
from fsdp_trainer.data.sources import holdout_mask
from fsdp_trainer.errors import ConfigError
from fsdp_trainer.loss import token_loss_sum
from transformers import AutoTokenizer

from tests.trainer.data.chat_inputs import (
    GENERATION,
    PLAIN,
    build_chat_tokenizer,
    conversation,
    write_chat_jsonl,
    write_prompt_completion_jsonl,
)
from tests.trainer.harness import base_config, cpu_world

SEQ = 32


@pytest.fixture(scope="module")
def chat_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sft-inputs")
    build_chat_tokenizer(root / "plain", PLAIN)
    build_chat_tokenizer(root / "generation", GENERATION)
    build_chat_tokenizer(root / "no-template", None)
    write_chat_jsonl(root / "chat.jsonl", 300)
    write_prompt_completion_jsonl(root / "pc.jsonl", 300)
    return root


@pytest.fixture(scope="module")
def tok(chat_root: Path):
    return AutoTokenizer.from_pretrained(chat_root / "plain")


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _data(spec: DataSpec, tok, rank: int = 0, world: int = 1, mb: int = 2) -> TrainData:
    return TrainData(spec, tok, seq_len=SEQ, micro_batch_size=mb, rank=rank, world_size=world, seed=3)


# --- which tokens are trained ------------------------------------------------------------


def test_prompt_completion_trains_the_completion_and_eos_only(tok) -> None:
    enc = PromptCompletionEncoder(tok, "prompt", "completion")
    (doc,) = enc([("r0", {"prompt": "w1 w2 w3", "completion": "w4 w5"})])
    assert doc.tokens == [tok.bos_token_id, *_ids(tok, "w1 w2 w3 w4 w5"), tok.eos_token_id]
    assert doc.trained == [False] * 4 + [True] * 3
    with pytest.raises(ValueError, match=r"row r1: field 'completion' must be a string, got None"):
        enc([("r1", {"prompt": "w1", "completion": None})])


@pytest.mark.parametrize("template", ["plain", "generation"])
def test_chat_trains_assistant_turns_only(chat_root: Path, template: str) -> None:
    tok = AutoTokenizer.from_pretrained(chat_root / template)
    enc = ChatEncoder(tok, "messages")
    assert enc.by_generation_blocks == (template == "generation")
    messages = [
        {"role": "system", "content": "w1"},
        {"role": "user", "content": "w2 w3"},
        {"role": "assistant", "content": "w4 w5"},
        {"role": "user", "content": "w6"},
        {"role": "assistant", "content": "w7"},
    ]
    (doc,) = enc([("r0", messages)])
    pieces = tok.convert_ids_to_tokens(doc.tokens)
    rendered = "<bos> <|system|> w1 <|end|> <|user|> w2 w3 <|end|> <|assistant|> w4 w5 <|end|> "
    assert pieces == (rendered + "<|user|> w6 <|end|> <|assistant|> w7 <|end|>").split(" ")
    trained = [p for p, t in zip(pieces, doc.trained, strict=True) if t]
    # What the assistant says and its end-of-turn marker; never the header the inference prompt ends with.
    assert trained == ["w4", "w5", "<|end|>", "w7", "<|end|>"]


def test_both_ways_of_finding_assistant_turns_agree(chat_root: Path) -> None:
    rng = random.Random(5)
    rows = [(f"r{i}", conversation(rng, rng.randint(1, 4), system=i % 2 == 0)) for i in range(40)]
    plain = ChatEncoder(AutoTokenizer.from_pretrained(chat_root / "plain"), "messages")(rows)
    marked = ChatEncoder(AutoTokenizer.from_pretrained(chat_root / "generation"), "messages")(rows)
    assert plain == marked


def test_an_assistant_message_opening_the_conversation_is_not_trained(tok) -> None:
    (doc,) = ChatEncoder(tok, "messages")([("r0", [{"role": "assistant", "content": "w1"}])])
    assert not any(doc.trained)


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path: Path) -> None:
    # Earlier assistant turns lose their content once the conversation goes on
    # (as reasoning-stripping templates do): prefixes are no prefixes.
    rewriting = (
        "{% for m in messages %}<|{{ m['role'] }}|> "
        "{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] }} {% endif %}<|end|> {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    tok = AutoTokenizer.from_pretrained(build_chat_tokenizer(tmp_path / "tok", rewriting))
    messages = [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]
    ChatEncoder(tok, "messages")([("ok", messages)])  # the last turn alone renders consistently
    with pytest.raises(ValueError, match=r"row r0: the chat template .* \{% generation %\} blocks"):
        ChatEncoder(tok, "messages")([("r0", messages + messages)])


def test_malformed_messages_name_the_row(tok) -> None:
    enc = ChatEncoder(tok, "messages")
    with pytest.raises(ValueError, match="row r3: expected a non-empty list"):
        enc([("r3", "w1 w2")])
    with pytest.raises(ValueError, match="row r4: every message needs a string 'role'"):
        enc([("r4", [{"content": "w1"}])])


# --- packing -------------------------------------------------------------------------------


def _doc(n: int, first_trained: int = 1, start: int = 10) -> Document:
    return Document(list(range(start, start + n)), [i >= first_trained for i in range(n)])


def test_rows_are_packed_whole_with_positions_restarting_and_padding_masked() -> None:
    packer = DocumentPacker(seq_len=10, overlong="truncate", pad_id=0)
    packer.add("a", _doc(4, first_trained=2, start=10))  # 3 positions
    packer.add("b", _doc(5, start=20))  # 4 positions: 7 used
    packer.add("c", _doc(5, start=30))  # does not fit: closes the first sequence
    assert packer.ready()
    inputs, labels, positions, sample_id = packer.take()
    assert inputs == [10, 11, 12, 20, 21, 22, 23, 0, 0, 0]
    assert labels == [-100, 12, 13, 21, 22, 23, 24, -100, -100, -100]
    assert positions == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]
    assert sample_id == "a+b"
    assert not packer.ready(), "c alone does not fill a sequence yet"
    packer.add("d", _doc(7, start=40))  # 6 positions: c + d = 10, exactly full
    assert packer.ready()
    inputs, labels, positions, sample_id = packer.take()
    assert sample_id == "c+d" and positions == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5]
    assert labels == [31, 32, 33, 34, 41, 42, 43, 44, 45, 46]  # a label never crosses into the next row
    first = stack_sequences([packer_take_again := (inputs, labels, positions, sample_id)])
    assert first.num_trained == first.num_tokens == 10 and packer_take_again[3] == "c+d"
    assert packer.pending == [] and not packer.ready()


def test_overlong_rows_are_truncated_or_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    for overlong, action in (("truncate", "truncated"), ("drop", "dropped")):
        packer = DocumentPacker(seq_len=10, overlong=overlong, pad_id=0, where="rank 3: ")
        with caplog.at_level(logging.WARNING, logger="fsdp_trainer.data.sft"):
            for i in range(5):
                packer.add(f"long{i}", _doc(12 + i))
            packer.add("fits", _doc(11))
        counts = packer.counts.as_dict()
        if overlong == "truncate":
            assert counts == {"rows": 6, "truncated": 5, "dropped": 0, "untrained": 0}
            inputs, labels, _, sample_id = packer.take()
            assert sample_id == "long0" and inputs == list(range(10, 20)) and labels == list(range(11, 21))
        else:
            assert counts == {"rows": 6, "truncated": 0, "dropped": 5, "untrained": 0}
            assert packer.take()[3] == "fits"
        # Logged at the 1st, 2nd and 4th: never silent, never a line per row.
        lines = [r.getMessage() for r in caplog.records if "row(s) longer than seqLen + 1 = 11" in r.getMessage()]
        assert [line.split(" row(s)")[0] for line in lines] == [f"rank 3: {action} {n}" for n in (1, 2, 4)]
        assert "latest: long3, 15 tokens" in lines[-1]
        caplog.clear()


def test_rows_with_nothing_to_train_on_are_skipped_and_counted() -> None:
    packer = DocumentPacker(seq_len=10, overlong="truncate", pad_id=0)
    packer.add("prompt-only", _doc(5, first_trained=5))
    packer.add("cut-before-the-answer", _doc(20, first_trained=15))
    assert packer.pending == [] and packer.counts.untrained == 2 and packer.counts.truncated == 1


def test_training_batches_of_files(chat_root: Path, tok, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (chat_root / "chat.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    for spec in (
        DataSpec(path=str(chat_root / "chat.jsonl"), format="chat"),
        DataSpec(path=str(tmp_path / "chat.parquet"), format="chat"),
        DataSpec(path=str(chat_root / "pc.jsonl"), format="prompt-completion"),
    ):
        data = _data(spec, tok, mb=4)
        batch = data.next_batch()
        assert batch.inputs.shape == batch.labels.shape == batch.position_ids.shape == (4, SEQ)
        assert batch.num_trained == int((batch.labels != IGNORE_INDEX).sum()) > 0
        # Within a document a label is the next input; across a boundary (position 0) it is not.
        inner = batch.position_ids[:, 1:] > 0
        trained = batch.labels[:, :-1] != IGNORE_INDEX
        assert torch.equal(batch.labels[:, :-1][inner & trained], batch.inputs[:, 1:][inner & trained])
        assert data.row_counts is not None and data.row_counts.rows > 0


# --- the loss --------------------------------------------------------------------------------


def test_masked_targets_do_not_count_in_the_loss(tok) -> None:
    enc = PromptCompletionEncoder(tok, "prompt", "completion")
    rows = [("a", {"prompt": "w1 w2 w3", "completion": "w9 w8"}), ("b", {"prompt": "w5 w6 w7", "completion": "w9 w8"})]
    batches = []
    for key, row in rows:
        packer = DocumentPacker(seq_len=8, overlong="truncate", pad_id=tok.pad_token_id)
        (doc,) = enc([(key, row)])
        packer.add(key, doc)
        batches.append(stack_sequences([packer.take()]))
    a, b = batches
    assert not torch.equal(a.inputs, b.inputs)  # the prompts differ, the completions do not
    logits = torch.randn(1, 8, len(tok), generator=torch.Generator().manual_seed(0))
    loss_a = token_loss_sum(logits, a.labels) / a.num_trained
    loss_b = token_loss_sum(logits, b.labels) / b.num_trained
    assert loss_a.item() == loss_b.item()
    # By hand: the mean over the completion's targets (w9, w8, eos) only.
    logp = F.log_softmax(logits[0].double(), dim=-1)
    targets = {3: _ids(tok, "w9")[0], 4: _ids(tok, "w8")[0], 5: tok.eos_token_id}
    by_hand = -sum(logp[pos, t] for pos, t in targets.items()) / len(targets)
    assert a.num_trained == 3 and loss_a.item() == pytest.approx(by_hand.item(), abs=1e-6)
    # Training on every target instead would see the prompts.
    every_a, every_b = a.inputs.roll(-1, dims=1), b.inputs.roll(-1, dims=1)
    assert token_loss_sum(logits, every_a).item() != pytest.approx(token_loss_sum(logits, every_b).item())


# --- resume and validation ------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["map", "streamed"])
@pytest.mark.parametrize("fmt", ["chat", "prompt-completion"])
def test_resumed_position_continues_with_the_next_sequence(chat_root: Path, tok, fmt: str, streaming: bool) -> None:
    path = chat_root / ("chat.jsonl" if fmt == "chat" else "pc.jsonl")
    spec = DataSpec(path=str(path), format=fmt, streaming=streaming)
    straight = _data(spec, tok, rank=1, world=2)
    want = [straight.next_batch() for _ in range(12)]

    first = _data(spec, tok, rank=1, world=2)
    got: list[Batch] = [first.next_batch() for _ in range(7)]
    state = first.state_dict()
    assert state["buffer"]["pending"], "rows read but not yet packed travel with the checkpoint"
    resumed = _data(spec, tok, rank=1, world=2)
    resumed.load_state_dict(state)
    assert row_counts(resumed.state_dict()) == row_counts(state)
    got += [resumed.next_batch() for _ in range(5)]
    for a, b in zip(want, got, strict=True):
        assert a.sample_ids == b.sample_ids and a.num_trained == b.num_trained
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
        assert torch.equal(a.position_ids, b.position_ids)
    assert row_counts(straight.state_dict()) == row_counts(resumed.state_dict())


def test_validation_packs_held_out_rows_only(chat_root: Path, tok) -> None:
    spec = DataSpec(path=str(chat_root / "chat.jsonl"), format="chat", overlong="drop")
    held_out = int(holdout_mask(300).sum())
    one = validation_batches(spec, tok, seq_len=64, micro_batch_size=1, eval_steps=50, rank=0, world_size=1)
    keys = [k for b in one for s in b.sample_ids for k in s.split("+")]
    # Every held-out row, in stored order, several to a sequence; the last, partial one too.
    assert keys == [f"v{i}" for i in range(held_out)] and len(one) < held_out
    assert (one[-1].labels[0, -1] == IGNORE_INDEX).item() and one[-1].position_ids[0, -1] > 0
    again = validation_batches(spec, tok, seq_len=64, micro_batch_size=1, eval_steps=50, rank=0, world_size=1)
    for a, b in zip(one, again, strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    # Dealt round-robin to ranks, the same number each.
    ranks = [
        validation_batches(spec, tok, seq_len=64, micro_batch_size=1, eval_steps=50, rank=r, world_size=2)
        for r in (0, 1)
    ]
    assert len(ranks[0]) == len(ranks[1]) == len(one) // 2
    assert [b.sample_ids for b in ranks[0]] == [b.sample_ids for b in one[0 : 2 * len(ranks[0]) : 2]]
    assert [b.sample_ids for b in ranks[1]] == [b.sample_ids for b in one[1 : 2 * len(ranks[1]) : 2]]
    # No held-out row is trained on.
    data = _data(spec, tok)
    assert not set(data.docs.train_indices.tolist()) & set(holdout_mask(300).nonzero()[0].tolist())


def test_streamed_chat_hold_out_is_by_content(chat_root: Path, tok) -> None:
    spec = DataSpec(path=str(chat_root / "chat.jsonl"), format="chat", streaming=True)
    val = validation_batches(spec, tok, seq_len=SEQ, micro_batch_size=1, eval_steps=50, rank=0, world_size=1)
    held = {tuple(row.tolist()) for b in val for row in b.inputs}
    data = _data(spec, tok, mb=4)
    trained = {tuple(row.tolist()) for _ in range(20) for row in data.next_batch().inputs}
    assert held and not held & trained


def test_a_missing_column_is_named_before_the_first_step(chat_root: Path, tok) -> None:
    spec = DataSpec(path=str(chat_root / "chat.jsonl"), format="chat", messages_field="conversation")
    with pytest.raises(ValueError, match=r"data.messagesField: the dataset has no column 'conversation' \(columns:"):
        _data(spec, tok)


# --- config errors ---------------------------------------------------------------------------


def _errors(tmp_path: Path, config: dict) -> list[str]:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        prepare(load_config(path), cpu_world())
    assert not dist.is_initialized()
    return info.value.lines


def _chat_config(tmp_path: Path, chat_root: Path, **data: object) -> dict:
    cfg = base_config(tmp_path, chat_root / "chat.jsonl", chat_root / "plain")
    cfg["data"].update({"format": "chat", **data})
    return cfg


def test_chat_and_prompt_completion_prepare(tmp_path: Path, chat_root: Path) -> None:
    for cfg in (
        _chat_config(tmp_path, chat_root),
        _chat_config(tmp_path, chat_root, path=str(chat_root / "pc.jsonl"), format="prompt-completion"),
    ):
        path = tmp_path / "train.yaml"
        path.write_text(yaml.safe_dump(cfg))
        assert prepare(load_config(path), cpu_world()).tokenizer.chat_template


def test_chat_without_a_chat_template(tmp_path: Path, chat_root: Path) -> None:
    lines = _errors(tmp_path, _chat_config(tmp_path, chat_root, tokenizer=str(chat_root / "no-template")))
    assert lines == [
        "data.format: chat renders conversations with the tokenizer's chat template, and the tokenizer "
        f"({chat_root / 'no-template'}, from data.tokenizer) has none; use a chat model's tokenizer "
        "(data.tokenizer) or format prompt-completion"
    ]


def test_rows_without_the_format_fields(tmp_path: Path, chat_root: Path) -> None:
    data = chat_root / "chat.jsonl"
    lines = _errors(tmp_path, _chat_config(tmp_path, chat_root, messagesField="conversation"))
    assert lines == [f"data.path: {data}: no row has a field 'conversation' (fields: messages); set data.messagesField"]
    pc = _chat_config(tmp_path, chat_root, path=str(chat_root / "pc.jsonl"), format="prompt-completion")
    pc["data"]["completionField"] = "answer"
    assert _errors(tmp_path, pc) == [
        f"data.path: {chat_root / 'pc.jsonl'}: no row has a field 'answer' (fields: completion, prompt); "
        "set data.completionField"
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": "w1 w2"}) + "\n")
    assert _errors(tmp_path, _chat_config(tmp_path, chat_root, path=str(bad))) == [
        f"data.path: {bad}: row 1: field 'messages' is not a list of {{role, content}} messages"
    ]


def test_chat_needs_rows_not_plain_text(tmp_path: Path, chat_root: Path) -> None:
    txt = tmp_path / "docs.txt"
    txt.write_text("w1 w2\n\nw3 w4\n")
    assert _errors(tmp_path, _chat_config(tmp_path, chat_root, path=str(txt))) == [
        f"data.format: chat reads rows with named fields (json, jsonl or parquet); {txt} holds txt files, "
        "which are plain text"
    ]
    embedded = _chat_config(tmp_path, chat_root)
    del embedded["data"]["path"]
    assert _errors(tmp_path, embedded) == [
        "data.format: format chat, prompt-completion and preference need dataset or path: "
        "the embedded corpus is plain text"
    ]
