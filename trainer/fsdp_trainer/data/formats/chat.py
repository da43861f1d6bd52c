"""``data.format: chat``: conversations rendered by the tokenizer's chat template, assistant turns trained.

The conversation is rendered by the tokenizer's own chat template (what
the model will see at inference) and only assistant turns are trained. Which
tokens belong to an assistant turn is found one of two ways:

- the template marks them with ``{% generation %}`` blocks: transformers'
  ``return_assistant_tokens_mask`` gives the mask directly (fast tokenizers);
- otherwise, by rendering prefixes: the text of turn i is what
  ``messages[:i+1]`` adds to ``messages[:i]`` rendered with the generation
  prompt, so the header the inference prompt ends with stays untrained and
  the turn's end-of-turn markup is trained. That needs a template whose
  rendering of a conversation's beginning is a prefix of the whole (almost
  all are; one that rewrites earlier turns, e.g. to strip reasoning, is an
  error naming the fix). The rendered text is cut at those boundaries and
  each piece tokenized alone, so the mask is exact whatever the tokenizer.

An assistant message that opens a conversation has no prompt before it and is
not trained.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..document import Document
from .base import Encoder, RowFormat, register, snippet

if TYPE_CHECKING:
    from fsdp_api.spec import DataSpec
    from transformers import PreTrainedTokenizerBase

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")


@register
class ChatFormat(RowFormat):
    name = "chat"
    settings = ("data.messagesField",)

    trains_what = "an assistant turn after the first message"

    def fields(self, spec: DataSpec) -> tuple[str, ...]:
        return (spec.messages_field,)

    def row_problem(self, spec: DataSpec, row: dict[str, Any]) -> str | None:
        problem = messages_problem(row.get(spec.messages_field))
        return f"field {spec.messages_field!r}: {problem}" if problem else None

    def row_trains(self, spec: DataSpec, row: dict[str, Any]) -> bool:
        return has_assistant_turn(row[spec.messages_field])

    def shape_problem(self, spec: DataSpec, row: dict[str, Any], number: int) -> str | None:
        messages = row[spec.messages_field]
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            return f"row {number}: field {spec.messages_field!r} is not a list of {{role, content}} messages"
        return None

    def check_tokenizer(self, tokenizer: PreTrainedTokenizerBase, ref: str, field: str) -> str | None:
        if tokenizer.chat_template:
            return None
        return (
            f"data.format: chat renders conversations with the tokenizer's chat template, and the tokenizer "
            f"({ref}, from {field}) has none; use a chat model's tokenizer (data.tokenizer) or format "
            "prompt-completion"
        )

    def encoder(self, spec: DataSpec, tokenizer: PreTrainedTokenizerBase) -> Encoder:
        return ChatEncoder(tokenizer, spec.messages_field)


# The roles chat templates render: OpenAI's chat messages (system, developer, user, assistant,
# tool, and the older function), Llama 3.1's ipython, GLM's observation. Any other is refused,
# not passed on: a template renders an unknown role as its own header or drops it, and a
# misspelled "assitant" (or ShareGPT's human/gpt) trains nothing, without a word.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython", "observation")


def messages_problem(value: Any) -> str | None:
    """Why ``value`` is not a conversation the chat template can render, or None.

    A message's content is a string (or a list of parts); it may be missing or
    null only beside tool calls. Otherwise a template writes null as "None"
    and that text would be trained.
    """
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        return f"expected a non-empty list of {{role, content}} messages, got {snippet(value)}"
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            return f"every message needs a string 'role', got {snippet(m)}"
        if m["role"] not in CHAT_ROLES:
            return f"message {i} has role {snippet(m['role'])}, not one of {', '.join(CHAT_ROLES)}"
        content = m.get("content")
        if not isinstance(content, str | list) and not m.get("tool_calls"):
            return f"message {i} ({m['role']}) has content {snippet(content)}: a string is needed (or tool_calls)"
    return None


def has_assistant_turn(value: list[Mapping[str, Any]]) -> bool:
    """An assistant message after the first: what a conversation trains (one that opens it has no prompt)."""
    return any(m["role"] == "assistant" for m in value[1:])


def _messages(key: str, value: Any) -> list[dict[str, Any]]:
    problem = messages_problem(value)
    if problem:
        raise ValueError(f"row {key}: {problem}")
    return [dict(m) for m in value]


class ChatEncoder:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, messages_field: str) -> None:
        template = tokenizer.get_chat_template()  # raises when the tokenizer has none
        self.tokenizer = tokenizer
        self.messages_field = messages_field
        # transformers maps generation blocks to tokens with offsets: fast tokenizers only.
        self.by_generation_blocks = bool(GENERATION_BLOCK.search(template)) and tokenizer.is_fast

    def __call__(self, rows: list[tuple[str, Any]]) -> list[Document]:
        conversations = [_messages(key, value) for key, value in rows]
        if self.by_generation_blocks:
            return self._by_generation_blocks(conversations)
        return self._by_prefixes(rows, conversations)

    def _by_generation_blocks(self, conversations: list[list[dict[str, Any]]]) -> list[Document]:
        out = self.tokenizer.apply_chat_template(
            conversations, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert isinstance(out, Mapping)  # return_dict=True: a BatchEncoding
        return [
            Document(list(ids), [bool(m) for m in mask])
            for ids, mask in zip(out["input_ids"], out["assistant_masks"], strict=True)
        ]

    def _render(self, messages: list[dict[str, Any]], *, prompt: bool = False) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        assert isinstance(text, str)  # not tokenized: one conversation renders as one text
        return text

    def _pieces(self, key: str, messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
        """The rendered conversation cut into (text, trained) pieces."""
        full = self._render(messages)
        pieces: list[tuple[str, bool]] = []
        done = 0  # characters of ``full`` already in pieces
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or i == 0:
                continue
            start = self._render(messages[:i], prompt=True)
            end = self._render(messages[: i + 1])
            if not (end.startswith(start) and full.startswith(end) and len(start) >= done):
                raise ValueError(
                    f"row {key}: the chat template does not render the conversation up to message {i} as a "
                    "prefix of the whole, so assistant turns cannot be found by rendering prefixes; use a "
                    "template that marks them with {% generation %} blocks (data.tokenizer)"
                )
            pieces += [(full[done : len(start)], False), (full[len(start) : len(end)], True)]
            done = len(end)
        pieces.append((full[done:], False))
        return [(text, trained) for text, trained in pieces if text]

    def _by_prefixes(self, rows: list[tuple[str, Any]], conversations: list[list[dict[str, Any]]]) -> list[Document]:
        per_row = [self._pieces(key, messages) for (key, _), messages in zip(rows, conversations, strict=True)]
        return tokenize_pieces(self.tokenizer, per_row)


def tokenize_pieces(tokenizer: PreTrainedTokenizerBase, documents: list[list[tuple[str, bool]]]) -> list[Document]:
    """Documents given as (text, trained) pieces: every piece tokenized alone (in one batched call), so each
    boundary between prompt and answer is exact whatever the tokenizer merges across it."""
    texts = [text for pieces in documents for text, _ in pieces]
    ids = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
    docs = []
    for pieces in documents:
        tokens: list[int] = []
        trained: list[bool] = []
        for _, flag in pieces:
            piece = next(ids)
            tokens += piece
            trained += [flag] * len(piece)
        docs.append(Document(tokens, trained))
    return docs
