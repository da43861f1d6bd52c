"""``data.format: preference``: rows of prompt, chosen and rejected, for the preference objectives.

A row is TRL's preference layout: ``prompt`` plain text or a list of chat
messages, ``chosen`` and ``rejected`` the two answers (text, or a list of
messages: an answer given as text to a chat prompt is one assistant
message); or UltraFeedback's, whose answers are whole conversations that
begin with the same messages; or TRL's implicit prompt, no prompt column
at all: the same conversations, or two texts whose common beginning is the
prompt (HH-RLHF's layout; ``read_pair``). It becomes one
document holding two sequences, prompt + chosen and prompt + rejected,
packed together so a pair never straddles two micro-batches; only the
answers are trained.

Plain text: ``[bos] prompt`` and ``answer [eos]`` are tokenized as separate
pieces, so the boundary is exact and the model learns to stop (TRL appends
the eos too). Chat: the prompt rendered with the generation prompt, and what
the whole conversation adds to it, each tokenized alone; a template whose
prompt rendering is not a prefix of the conversation is an error naming the
row (the answer could not be told from the prompt).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..document import Document
from .base import Encoder, RowFormat, register, snippet
from .chat import messages_problem, tokenize_pieces

if TYPE_CHECKING:
    from fsdp_api.spec import DataSpec
    from transformers import PreTrainedTokenizerBase


def _is_chat(value: Any) -> bool:
    return isinstance(value, list)


EMPTY = "is empty: a pair needs two answers to compare"


@dataclass
class Pair:
    """A row made uniform: text (prompt and answers strings) or chat (all lists of messages)."""

    prompt: Any
    chosen: Any
    rejected: Any

    @property
    def chat(self) -> bool:
        return _is_chat(self.prompt)


def _shared_prefix(a: list[Any], b: list[Any]) -> int:
    n = 0
    while n < min(len(a), len(b)) - 1 and a[n] == b[n]:
        n += 1
    return n


def _as_reply(answer: Any) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": answer}] if isinstance(answer, str) else [dict(m) for m in answer]


def read_pair(row: Any, fields: tuple[str, str, str]) -> tuple[Pair | None, str | None]:
    """The row as a ``Pair``, or why the encoder cannot take it (naming the field).

    Besides TRL's explicit layouts (text prompt and answers; chat prompt and
    answers that are text or messages), answers that are whole conversations
    beginning with the same messages (UltraFeedback's layout, where the prompt
    column repeats the first user turn as text) have that shared beginning as
    their prompt.
    """
    if not isinstance(row, Mapping):
        return None, f"is not a mapping of fields: {snippet(row)}"
    names = dict(zip(("prompt", "chosen", "rejected"), fields, strict=True))
    values: dict[str, Any] = {key: row.get(name) for key, name in names.items()}  # the row's values, as read
    if values["prompt"] is None:
        problem = _implicit_prompt_problem(values["chosen"], values["rejected"])
        if problem:
            return None, f"no field {names['prompt']!r} (data.promptField), and {problem}"
        if isinstance(values["chosen"], str):
            values["prompt"], values["chosen"], values["rejected"] = split_text_prompt(
                values["chosen"], values["rejected"]
            )
        else:
            values["prompt"] = ""  # the shared beginning below becomes the prompt
    for key in ("prompt", "chosen", "rejected"):
        value = values[key]
        if _is_chat(value):
            problem = messages_problem(value)
            if problem:
                return None, f"field {names[key]!r}: {problem}"
        elif not isinstance(value, str):
            return (
                None,
                f"field {names[key]!r} must be text or a list of {{role, content}} messages, got {snippet(value)}",
            )
    prompt, chosen, rejected = values["prompt"], values["chosen"], values["rejected"]
    if not _is_chat(prompt) and _is_chat(chosen) and _is_chat(rejected):
        shared = _shared_prefix(chosen, rejected)
        if shared:
            prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        else:
            prompt = [{"role": "user", "content": prompt}]
    elif not _is_chat(prompt) and (_is_chat(chosen) or _is_chat(rejected)):
        return None, (
            f"fields {names['chosen']!r} and {names['rejected']!r} must both be text or both lists of messages "
            f"when {names['prompt']!r} is text"
        )
    pair = Pair(prompt, chosen, rejected)
    for key in ("chosen", "rejected"):
        value = getattr(pair, key)
        texts = [value] if isinstance(value, str) else [m.get("content") for m in value]
        if not any(isinstance(t, str) and t.strip() for t in texts):
            return None, f"field {names[key]!r} {EMPTY}"
    return pair, None


def split_text_prompt(chosen: str, rejected: str) -> tuple[str, str, str]:
    """Two texts that begin alike as (prompt, chosen, rejected), split as TRL's ``extract_prompt`` splits them.

    The prompt is their longest common beginning, less a space it ends in (which
    stays with the answers): HH-RLHF's rows, ``\\n\\nHuman: ... \\n\\nAssistant: ...``.
    """
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    if 0 < shared < len(chosen) and chosen[shared - 1] == " ":
        shared -= 1
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _implicit_prompt_problem(chosen: Any, rejected: Any) -> str | None:
    """Why two answers cannot carry their own prompt (TRL's implicit prompt), or None."""
    if isinstance(chosen, str) and isinstance(rejected, str):
        if not split_text_prompt(chosen, rejected)[0].strip():
            return "the two texts do not begin alike, so they carry no prompt"
        return None
    if not (_is_chat(chosen) and _is_chat(rejected)):
        return "the answers are neither texts nor conversations whose shared beginning could be the prompt"
    if messages_problem(chosen) or messages_problem(rejected) or not _shared_prefix(chosen, rejected):
        return "the two conversations do not begin with the same messages, which would be the prompt"
    return None


def pair_problem(row: Any, fields: tuple[str, str, str]) -> str | None:
    """Why the encoder would refuse this row (prompt, chosen, rejected named by ``fields``), or None."""
    return read_pair(row, fields)[1]


@register
class PreferenceFormat(RowFormat):
    name = "preference"
    settings = ("data.promptField", "data.chosenField", "data.rejectedField")

    # A pair whose answers are equal has a margin of 0 whatever the model: its loss is ln 2 and its
    # gradient nothing. Some among others are harmless; only such pairs would train nothing, unsaid.
    trains_what = "a chosen answer that differs from its rejected one"

    def fields(self, spec: DataSpec) -> tuple[str, ...]:
        return (spec.prompt_field, spec.chosen_field, spec.rejected_field)

    def optional_fields(self, spec: DataSpec) -> tuple[str, ...]:
        # TRL's implicit prompt: conversations or texts that begin alike carry their prompt themselves.
        return (spec.prompt_field,)

    def row_problem(self, spec: DataSpec, row: dict[str, Any]) -> str | None:
        return pair_problem(row, (spec.prompt_field, spec.chosen_field, spec.rejected_field))

    def row_trains(self, spec: DataSpec, row: dict[str, Any]) -> bool:
        return row[spec.chosen_field] != row[spec.rejected_field]

    def shape_problem(self, spec: DataSpec, row: dict[str, Any], number: int) -> str | None:
        problem = self.row_problem(spec, row)
        return f"row {number}: {problem}" if problem else None

    def encoder(self, spec: DataSpec, tokenizer: PreTrainedTokenizerBase) -> Encoder:
        return PreferenceEncoder(tokenizer, (spec.prompt_field, spec.chosen_field, spec.rejected_field))


# A sequence before tokenization: (text, trained) pieces, and the special tokens around them.
_Pieces = list[tuple[str, bool]]


class PreferenceEncoder:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, fields: tuple[str, str, str]) -> None:
        self.tokenizer = tokenizer
        self.fields = fields

    def __call__(self, rows: list[tuple[str, Any]]) -> list[Document]:
        sequences: list[tuple[_Pieces, bool]] = []  # chosen, rejected, chosen, ...; and whether chat-rendered
        for key, row in rows:
            pair, problem = read_pair(row, self.fields)
            if pair is None:
                raise ValueError(f"row {key}: {problem}")
            for answer in (pair.chosen, pair.rejected):
                pieces = self._chat(key, pair.prompt, answer) if pair.chat else [(pair.prompt, False), (answer, True)]
                sequences.append((pieces, pair.chat))
        docs = tokenize_pieces(self.tokenizer, [pieces for pieces, _ in sequences])
        parts = [
            d if chat else self._special(d.tokens, d.trained) for d, (_, chat) in zip(docs, sequences, strict=True)
        ]
        return [Document.joined(parts[i : i + 2]) for i in range(0, len(parts), 2)]

    def _special(self, tokens: list[int], trained: list[bool]) -> Document:
        """Plain text: ``[bos] prompt answer [eos]``, the eos trained so the model learns to stop."""
        tok = self.tokenizer
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        return Document(bos + tokens + [tok.eos_token_id], [False] * len(bos) + trained + [True])

    def _render(self, messages: list[dict[str, Any]], *, prompt: bool = False) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        assert isinstance(text, str)  # not tokenized: one conversation renders as one text
        return text

    def _chat(self, key: str, prompt: list[Any], answer: Any) -> _Pieces:
        if not self.tokenizer.chat_template:
            raise ValueError(
                f"row {key}: the prompt is a list of chat messages and the tokenizer has no chat template; "
                "use a chat model's tokenizer (data.tokenizer) or plain-text rows"
            )
        messages = [dict(m) for m in prompt]
        reply = _as_reply(answer)
        start = self._render(messages, prompt=True)
        full = self._render(messages + reply)
        if not full.startswith(start) or len(full) == len(start):
            raise ValueError(
                f"row {key}: the chat template does not render the prompt as a prefix of prompt + answer, so the "
                "answer cannot be told from the prompt; use a template that does (data.tokenizer)"
            )
        return [(start, False), (full[len(start) :], True)]
