"""The data.format registry: one class per format, what each answers, and a new one found by name."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsdp_api.spec import DataSpec
from fsdp_trainer.data import files
from fsdp_trainer.data.document import Document
from fsdp_trainer.data.formats import (
    FORMATS,
    ChatFormat,
    PromptCompletionFormat,
    RowFormat,
    TextFormat,
    data_format,
    register,
)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> files.DataFiles:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return files.resolve(str(path))


def test_the_registry_holds_exactly_the_formats_the_api_accepts() -> None:
    accepted = set(typing.get_args(DataSpec.model_fields["format"].annotation))
    assert set(FORMATS) == accepted
    assert isinstance(data_format("text"), TextFormat)
    assert isinstance(data_format("chat"), ChatFormat)
    assert isinstance(data_format("prompt-completion"), PromptCompletionFormat)


def test_an_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"data\.format csv is not one of chat, preference, prompt-completion, text"):
        data_format("csv")


def test_each_format_names_its_columns_and_the_settings_that_name_them() -> None:
    spec = DataSpec(
        path="x.jsonl", text_field="body", messages_field="turns", prompt_field="q", completion_field="a", format="chat"
    )
    assert data_format("text").fields(spec) == ("body",)
    assert data_format("chat").fields(spec) == ("turns",)
    assert data_format("prompt-completion").fields(spec) == ("q", "a")
    assert data_format("text").settings == ("data.textField",)
    assert data_format("chat").settings == ("data.messagesField",)
    assert data_format("prompt-completion").settings == ("data.promptField", "data.completionField")
    assert data_format("preference").fields(spec) == ("q", "chosen", "rejected")
    assert data_format("preference").settings == ("data.promptField", "data.chosenField", "data.rejectedField")


def test_only_the_row_formats_pack_documents_and_the_text_format_has_no_row_encoder() -> None:
    assert {name for name, f in FORMATS.items() if f.packs_documents} == {"chat", "prompt-completion", "preference"}
    # The API's reading of the same fact (the memory plan's mask estimate), for every format the spec takes.
    spec_formats = typing.get_args(DataSpec.model_fields["format"].annotation)
    assert sorted(spec_formats) == sorted(FORMATS)
    assert {f: DataSpec(format=f, path="/d").packs_rows for f in spec_formats} == {
        name: fmt.packs_documents for name, fmt in FORMATS.items()
    }
    with pytest.raises(ValueError, match=r"data\.format text has no row encoder"):
        data_format("text").encoder(DataSpec(), object())  # type: ignore[arg-type]


def test_row_formats_refuse_txt_files_and_check_the_first_full_row(tmp_path: Path) -> None:
    txt = tmp_path / "a.txt"
    txt.write_text("plain prose\n")
    spec = DataSpec(path=str(txt), format="chat")
    (error,) = data_format("chat").check_files(spec, files.resolve(str(txt)))
    assert error == (
        f"data.format: chat reads rows with named fields (json, jsonl or parquet); {txt} holds txt files, "
        "which are plain text"
    )

    found = _jsonl(tmp_path / "pc.jsonl", [{"prompt": "", "completion": "x"}, {"prompt": "p", "completion": 3}])
    spec = DataSpec(path=str(tmp_path / "pc.jsonl"), format="prompt-completion")
    assert data_format("prompt-completion").check_files(spec, found) == [
        f"data.path: {spec.path}: row 2: field 'completion' is not a string (int)"
    ]

    found = _jsonl(tmp_path / "chat.jsonl", [{"messages": "hello"}])
    spec = DataSpec(path=str(tmp_path / "chat.jsonl"), format="chat")
    assert data_format("chat").check_files(spec, found) == [
        f"data.path: {spec.path}: row 1: field 'messages' is not a list of {{role, content}} messages"
    ]


def test_the_text_format_probes_for_text(tmp_path: Path) -> None:
    found = _jsonl(tmp_path / "t.jsonl", [{"body": "words"}])
    spec = DataSpec(path=str(tmp_path / "t.jsonl"))
    assert data_format("text").check_files(spec, found) == [
        f"data.path: {spec.path}: no row has a field 'text' (fields: body); set data.textField"
    ]
    assert data_format("text").check_files(spec.model_copy(update={"text_field": "body"}), found) == []


class _NoTemplate:
    chat_template = None


def test_only_chat_asks_the_tokenizer_for_a_chat_template() -> None:
    problem = data_format("chat").check_tokenizer(_NoTemplate(), "tok-dir", "data.tokenizer")  # type: ignore[arg-type]
    assert problem is not None and problem.startswith("data.format: chat renders conversations")
    assert "(tok-dir, from data.tokenizer) has none" in problem
    assert data_format("prompt-completion").check_tokenizer(_NoTemplate(), "t", "f") is None  # type: ignore[arg-type]
    assert data_format("text").check_tokenizer(_NoTemplate(), "t", "f") is None  # type: ignore[arg-type]


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    saved = dict(FORMATS)
    yield
    FORMATS.clear()
    FORMATS.update(saved)


def test_a_new_format_is_one_registered_class(scratch_registry: None, tmp_path: Path) -> None:
    @register
    class Labelled(RowFormat):
        name = "labelled"
        settings = ("data.textField",)

        def fields(self, spec: DataSpec) -> tuple[str, ...]:
            return (spec.text_field,)

        def encoder(self, spec: DataSpec, tokenizer: Any) -> Any:
            return lambda rows: [Document([1, 2], [False, True]) for _ in rows]

    fmt = data_format("labelled")
    assert isinstance(fmt, Labelled) and fmt.packs_documents
    found = _jsonl(tmp_path / "l.jsonl", [{"other": "x"}])
    spec = DataSpec(path=str(tmp_path / "l.jsonl"))
    assert fmt.check_files(spec, found) == [
        f"data.path: {spec.path}: no row has a field 'text' (fields: other); set data.textField"
    ]
    assert fmt.encoder(spec, None)([("r0", "x")]) == [Document([1, 2], [False, True])]
    with pytest.raises(ValueError, match=r"data\.format labelled is registered twice"):
        register(Labelled)


def test_the_registry_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, fsdp_trainer.data.formats; "
        "assert not {'torch', 'transformers', 'datasets'} & set(sys.modules), sorted(sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]


# --- the config check reads the files through (issue 24: bad rows stopped every rank mid-run) -----


def _pc(i: int) -> str:
    return json.dumps({"prompt": f"p{i}", "completion": f"c{i}"}) + "\n"


def test_the_check_reads_every_row_and_names_the_first_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "pc.jsonl"
    lines = [_pc(i) for i in range(800)]
    lines[500] = json.dumps({"prompt": "p", "completion": None}) + "\n"  # line 501
    lines[700] = '{"prompt": "p", "completion": "c"} trailing\n'  # line 701
    path.write_text("".join(lines))
    spec = DataSpec(path=str(path), format="prompt-completion")
    assert data_format("prompt-completion").check_files(spec, files.resolve(str(path))) == [
        f"data.path: {path}: {path} line 501: field 'completion' must be a string, got None "
        "(1 more bad rows in what was read)"
    ]


def test_bytes_that_are_not_utf8_and_lines_that_are_not_json_are_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "also fine"}\n{"text": "caf\xe9"}\n')
    spec = DataSpec(path=str(path))
    assert data_format("text").check_files(spec, files.resolve(str(path))) == [
        f"data.path: {path}: {path} line 3: not UTF-8 (byte 0xe9 at column 14)"
    ]
    path.write_text('{"text": "fine"}\n{"text": "cut off\n')
    assert data_format("text").check_files(spec, files.resolve(str(path))) == [
        f"data.path: {path}: {path} line 2: not JSON (Unterminated string starting at: column 10)"
    ]


def test_a_csv_named_jsonl_is_refused_in_one_line_not_skipped(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("prompt,completion\nhello,world\n")
    spec = DataSpec(path=str(path), format="prompt-completion")
    assert data_format("prompt-completion").check_files(spec, files.resolve(str(path))) == [
        f"data.path: {path}: {path}: not JSON: neither JSON lines nor one JSON array (it starts 'prompt,completion')"
    ]
    # One JSON array is datasets' to read whole, as before.
    path.write_text(json.dumps([{"prompt": "p", "completion": "c"}]))
    assert data_format("prompt-completion").check_files(spec, files.resolve(str(path))) == []


def test_chat_rows_with_null_content_or_nothing_to_train_are_refused(tmp_path: Path) -> None:
    spec = DataSpec(path=str(tmp_path / "chat.jsonl"), format="chat")
    user, answer = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
    found = _jsonl(
        tmp_path / "chat.jsonl", [{"messages": [user, answer]}, {"messages": [user, {**answer, "content": None}]}]
    )
    assert data_format("chat").check_files(spec, found) == [
        f"data.path: {spec.path}: {spec.path} line 2: field 'messages': message 1 (assistant) has content None: "
        "a string is needed (or tool_calls)"
    ]
    # A misspelled role would render as a header of its own and train nothing: refused, named.
    found = _jsonl(
        tmp_path / "chat.jsonl", [{"messages": [user, answer]}, {"messages": [user, {**answer, "role": "assitant"}]}]
    )
    assert data_format("chat").check_files(spec, found) == [
        f"data.path: {spec.path}: {spec.path} line 2: field 'messages': message 1 has role 'assitant', not one of "
        "system, developer, user, assistant, tool, function, ipython, observation"
    ]
    # A tool call may leave the content empty.
    call = {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    found = _jsonl(tmp_path / "chat.jsonl", [{"messages": [user, call, answer]}])
    assert data_format("chat").check_files(spec, found) == []
    # Some rows without an assistant turn are fine (counted when packed); none at all trains nothing.
    found = _jsonl(tmp_path / "chat.jsonl", [{"messages": [answer, user]}, {"messages": [user]}])
    assert data_format("chat").check_files(spec, found) == [
        f"data.path: {spec.path}: none of the 2 rows read has an assistant turn after the first message: "
        "nothing would be trained"
    ]


def test_beyond_the_bound_lines_are_sampled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdp_trainer.data import scan

    path = tmp_path / "pc.jsonl"
    path.write_text("".join(_pc(i) for i in range(50)) + "not json\n" * 2000)
    monkeypatch.setattr(scan, "SCAN_BYTES", 1000)
    result = scan.scan(files.resolve(str(path)))
    # 27 lines read in full; the samples beyond them fall on good and bad lines.
    assert result.sampled and result.rows > 1000 // len(_pc(0)) and result.bad_rows > 100
    assert result.first_problem is not None and " at byte " in result.first_problem
    assert result.first_problem.endswith(": not JSON (Expecting value: column 1)")


def test_preference_pairs_whose_answers_are_all_equal_are_refused_as_training_nothing(tmp_path: Path) -> None:
    spec = DataSpec(path=str(tmp_path / "pairs.jsonl"), format="preference")
    same = [{"prompt": f"p{i}", "chosen": "yes", "rejected": "yes"} for i in range(3)]
    assert data_format("preference").check_files(spec, _jsonl(tmp_path / "pairs.jsonl", same)) == [
        f"data.path: {spec.path}: none of the 3 rows read has a chosen answer that differs from its rejected one: "
        "nothing would be trained"
    ]
    # One pair that differs among them trains: the equal ones only add ln 2 to the mean.
    mixed = [*same, {"prompt": "p", "chosen": "yes", "rejected": "no"}]
    assert data_format("preference").check_files(spec, _jsonl(tmp_path / "pairs.jsonl", mixed)) == []
