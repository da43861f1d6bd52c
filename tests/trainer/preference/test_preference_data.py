"""data.format preference: a row becomes one pair, packed whole, its answers trained; bad rows named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fsdp_api.spec import DataSpec
from fsdp_trainer.data import files
from fsdp_trainer.data.document import Document
from fsdp_trainer.data.formats import data_format, row_encoder
from fsdp_trainer.data.loader import TrainData
from fsdp_trainer.data.packing import IGNORE_INDEX
from fsdp_trainer.data.sft import DocumentPacker
from transformers import AutoTokenizer

from tests.trainer.data.chat_inputs import build_chat_tokenizer
from tests.trainer.harness import build_word_tokenizer

BOS, EOS = 0, 1


def _w(i: int) -> int:
    return 4 + i  # the word tokenizer's id of "w<i>"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(build_word_tokenizer(tmp_path_factory.mktemp("tok") / "t"))


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return AutoTokenizer.from_pretrained(build_chat_tokenizer(tmp_path_factory.mktemp("chat") / "t"))


def _spec(**kw: Any) -> DataSpec:
    return DataSpec(path="/data", format="preference", **kw)


def test_a_text_pair_is_prompt_plus_each_answer_with_only_the_answers_and_eos_trained(tokenizer: Any) -> None:
    [doc] = row_encoder(_spec(), tokenizer)([("r0", {"prompt": "w1 w2", "chosen": "w3 w4", "rejected": "w9"})])
    chosen, rejected = doc.parts()
    assert chosen == Document([BOS, _w(1), _w(2), _w(3), _w(4), EOS], [False] * 3 + [True] * 3)
    assert rejected == Document([BOS, _w(1), _w(2), _w(9), EOS], [False] * 3 + [True] * 2)
    assert doc.positions == 5 + 4


def test_the_columns_are_settings(tokenizer: Any) -> None:
    spec = _spec(prompt_field="q", chosen_field="good", rejected_field="bad")
    assert data_format("preference").fields(spec) == ("q", "good", "bad")
    [doc] = row_encoder(spec, tokenizer)([("r0", {"q": "w1", "good": "w2", "bad": "w3"})])
    assert [p.tokens for p in doc.parts()] == [[BOS, _w(1), _w(2), EOS], [BOS, _w(1), _w(3), EOS]]


def test_a_chat_prompt_is_rendered_with_the_template_and_only_the_reply_trained(chat_tokenizer: Any) -> None:
    tok = chat_tokenizer
    row = {
        "prompt": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}],
        "chosen": "w3 w4",
        "rejected": [{"role": "assistant", "content": "w5"}],
    }
    [doc] = row_encoder(_spec(), tok)([("r0", row)])
    chosen, rejected = doc.parts()
    prompt = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids("<|end|>")
    assert chosen.tokens == [*prompt_ids, _w(3), _w(4), end]
    assert chosen.trained == [False] * len(prompt_ids) + [True] * 3
    # The assistant turn inside the prompt is context, not trained.
    assert rejected.tokens == [*prompt_ids, _w(5), end]
    assert rejected.trained == [False] * len(prompt_ids) + [True] * 2


def test_answers_that_are_whole_conversations_share_their_beginning_as_the_prompt(chat_tokenizer: Any) -> None:
    """UltraFeedback's layout: the prompt column repeats the user turn as text, the answers hold it too."""
    user = {"role": "user", "content": "w1"}
    row = {
        "prompt": "w1",
        "chosen": [user, {"role": "assistant", "content": "w3 w4"}],
        "rejected": [user, {"role": "assistant", "content": "w5"}],
    }
    explicit = {"prompt": [user], "chosen": "w3 w4", "rejected": [{"role": "assistant", "content": "w5"}]}
    encode = row_encoder(_spec(), chat_tokenizer)
    assert encode([("r0", row)]) == encode([("r0", explicit)])
    # Text prompt, conversations with nothing in common: the text is the user's turn.
    apart = {"prompt": "w1", "chosen": [{"role": "assistant", "content": "w3 w4"}], "rejected": explicit["rejected"]}
    assert encode([("r0", apart)]) == encode([("r0", explicit)])
    mixed = {"prompt": "w1", "chosen": "w3", "rejected": explicit["rejected"]}
    with pytest.raises(ValueError, match=r"^row r0: fields 'chosen' and 'rejected' must both be text or both lists"):
        encode([("r0", mixed)])


def test_conversations_without_a_prompt_column_carry_their_prompt(chat_tokenizer: Any, tmp_path: Path) -> None:
    """TRL's implicit prompt: only chosen and rejected, each the whole conversation."""
    user = {"role": "user", "content": "w1"}
    implicit = {
        "chosen": [user, {"role": "assistant", "content": "w3 w4"}],
        "rejected": [user, {"role": "assistant", "content": "w5"}],
    }
    explicit = {"prompt": [user], "chosen": "w3 w4", "rejected": [{"role": "assistant", "content": "w5"}]}
    encode = row_encoder(_spec(), chat_tokenizer)
    assert encode([("r0", implicit)]) == encode([("r0", explicit)])
    # The file check and the loader take the missing column as the layout it is.
    path = tmp_path / "implicit.jsonl"
    spec = DataSpec(path=str(path), format="preference")
    assert data_format("preference").check_files(spec, _jsonl(path, [implicit] * 3)) == []
    data = TrainData(spec, chat_tokenizer, seq_len=32, micro_batch_size=1, rank=0, world_size=1, seed=0)
    batch = data.next_batch()
    [doc] = encode([("r0", implicit)])
    inputs = [t for part in doc.parts() for t in part.tokens[:-1]]
    assert batch.inputs[0].tolist()[: len(inputs)] == inputs
    # Texts that do not begin alike carry no prompt: one line naming what is missing.
    texts = {"chosen": "yes", "rejected": "no"}
    assert data_format("preference").check_files(spec, _jsonl(path, [texts])) == [
        f"data.path: {path}: row 1: no field 'prompt' (data.promptField), and the two texts do not begin alike, "
        "so they carry no prompt"
    ]


@pytest.mark.parametrize(
    "chosen, rejected",
    [
        ("\n\nHuman: w1 w2\n\nAssistant: w3 w4", "\n\nHuman: w1 w2\n\nAssistant: w5"),  # HH-RLHF's layout
        ("w1 w2 w3", "w1 w2 w3 w4"),  # one answer ends where the other goes on
        ("w1 w2 w6", "w1 w2 w5"),  # the split falls inside a word: the space stays with the answers
    ],
)
def test_texts_without_a_prompt_column_split_as_trl_extracts_the_prompt(
    tokenizer: Any, chosen: str, rejected: str
) -> None:
    from fsdp_trainer.data.formats.preference import split_text_prompt
    from trl import extract_prompt

    trl = extract_prompt({"chosen": chosen, "rejected": rejected})
    if chosen == rejected[: len(chosen)]:
        # TRL cuts before the shorter text's last character there (its loop ends without a difference);
        # the shorter text is all prompt here, and the row is refused for its empty answer instead.
        assert split_text_prompt(chosen, rejected) == (chosen, "", rejected[len(chosen) :])
        encode = row_encoder(_spec(), tokenizer)
        with pytest.raises(Exception, match="field 'chosen' is empty"):
            encode([("r0", {"chosen": chosen, "rejected": rejected})])
        return
    assert split_text_prompt(chosen, rejected) == (trl["prompt"], trl["chosen"], trl["rejected"])
    encode = row_encoder(_spec(), tokenizer)
    explicit = {"prompt": trl["prompt"], "chosen": trl["chosen"], "rejected": trl["rejected"]}
    assert encode([("r0", {"chosen": chosen, "rejected": rejected})]) == encode([("r0", explicit)])


def test_a_chat_prompt_without_a_template_is_one_line_naming_the_row(tokenizer: Any) -> None:
    row = {"prompt": [{"role": "user", "content": "w1"}], "chosen": "w2", "rejected": "w3"}
    with pytest.raises(ValueError, match=r"^row e0/d7: the prompt is a list of chat messages and the tokenizer has no"):
        row_encoder(_spec(), tokenizer)([("e0/d7", row)])


def test_a_pair_is_packed_whole_with_positions_restarting_per_answer(tokenizer: Any) -> None:
    [doc] = row_encoder(_spec(), tokenizer)([("r0", {"prompt": "w1", "chosen": "w2 w3", "rejected": "w4"})])
    packer = DocumentPacker(seq_len=10, overlong="truncate", pad_id=2)
    packer.add("r0", doc)
    inputs, labels, positions, sample = packer.take()
    assert inputs == [BOS, _w(1), _w(2), _w(3), BOS, _w(1), _w(4), 2, 2, 2]
    assert labels == [IGNORE_INDEX, _w(2), _w(3), EOS, IGNORE_INDEX, _w(4), EOS] + [IGNORE_INDEX] * 3
    assert positions == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2]
    assert sample == "r0"


def test_a_pair_that_does_not_fit_is_cut_evenly_or_dropped_and_counted(tokenizer: Any) -> None:
    row = {"prompt": "w1 w2", "chosen": "w3 w4 w5 w6", "rejected": "w7 w8 w9"}
    [doc] = row_encoder(_spec(), tokenizer)([("r0", row)])
    assert doc.positions == 7 + 6
    cut = DocumentPacker(seq_len=8, overlong="truncate", pad_id=2)
    cut.add("r0", doc)
    [pending] = cut.pending
    # Each side keeps its first seqLen/2 + 1 tokens: both still train an answer token.
    assert [p.tokens for p in pending.doc.parts()] == [
        [BOS, _w(1), _w(2), _w(3), _w(4)],
        [BOS, _w(1), _w(2), _w(7), _w(8)],
    ]
    assert pending.doc.positions == 8 and cut.counts.truncated == 1
    dropped = DocumentPacker(seq_len=8, overlong="drop", pad_id=2)
    dropped.add("r0", doc)
    assert not dropped.pending and dropped.counts.dropped == 1
    # Cut before an answer starts: nothing to compare, so the pair is left out and counted.
    short = DocumentPacker(seq_len=4, overlong="truncate", pad_id=2)
    short.add("r0", doc)
    assert not short.pending and short.counts.untrained == 1


def test_pending_pairs_survive_the_data_state(tokenizer: Any) -> None:
    docs = row_encoder(_spec(), tokenizer)(
        [(f"r{i}", {"prompt": "w1", "chosen": "w2", "rejected": "w3"}) for i in (0, 1)]
    )
    packer = DocumentPacker(seq_len=16, overlong="truncate", pad_id=2)
    for i, d in enumerate(docs):
        packer.add(f"r{i}", d)
    again = DocumentPacker(seq_len=16, overlong="truncate", pad_id=2)
    again.load_state_dict(packer.state_dict())
    assert [p.doc for p in again.pending] == docs
    assert again.take() == packer.take()


def _jsonl(path: Path, rows: list[Any]) -> files.DataFiles:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return files.resolve(str(path))


def test_the_config_check_names_the_first_row_with_a_missing_or_empty_answer(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    spec = DataSpec(path=str(path), format="preference")
    fmt = data_format("preference")
    good = {"prompt": "p", "chosen": "a", "rejected": "b"}
    assert fmt.check_files(spec, _jsonl(path, [good, good])) == []
    assert fmt.check_files(spec, _jsonl(path, [good, {**good, "rejected": "  "}])) == [
        f"data.path: {path}: {path} line 2: field 'rejected' is empty: a pair needs two answers to compare"
    ]
    assert fmt.check_files(spec, _jsonl(path, [good, {"prompt": "p", "chosen": "a"}, good])) == [
        f"data.path: {path}: {path} line 2: field 'rejected' must be text or a list of {{role, content}} messages, "
        "got None"
    ]
    assert fmt.check_files(spec, _jsonl(path, [{"question": "p", "chosen": "a", "rejected": "b"}])) == [
        f"data.path: {path}: row 1: no field 'prompt' (data.promptField), and the two texts do not begin alike, "
        "so they carry no prompt"
    ]
    chat = {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant"}], "rejected": "no"}
    assert fmt.check_files(spec, _jsonl(path, [good, chat])) == [
        f"data.path: {path}: {path} line 2: field 'chosen': message 0 (assistant) has content None: a string is "
        "needed (or tool_calls)"
    ]
