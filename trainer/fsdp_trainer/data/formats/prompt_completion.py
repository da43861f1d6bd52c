"""``data.format: prompt-completion``: ``[bos] prompt completion [eos]``, the completion trained.

Prompt and completion are tokenized as two pieces so the boundary is exact;
the completion and the eos are trained, so the model learns to stop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..document import Document
from .base import Encoder, RowFormat, register, string_field_problem

if TYPE_CHECKING:
    from fsdp_api.spec import DataSpec
    from transformers import PreTrainedTokenizerBase


@register
class PromptCompletionFormat(RowFormat):
    name = "prompt-completion"
    settings = ("data.promptField", "data.completionField")

    trains_what = "a completion"

    def fields(self, spec: DataSpec) -> tuple[str, ...]:
        return (spec.prompt_field, spec.completion_field)

    def row_trains(self, spec: DataSpec, row: dict[str, Any]) -> bool:
        return True  # the completion's eos is always trained

    def encoder(self, spec: DataSpec, tokenizer: PreTrainedTokenizerBase) -> Encoder:
        return PromptCompletionEncoder(tokenizer, spec.prompt_field, spec.completion_field)


class PromptCompletionEncoder:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_field: str, completion_field: str) -> None:
        self.tokenizer = tokenizer
        self.fields = (prompt_field, completion_field)

    def _texts(self, rows: list[tuple[str, Any]], name: str) -> list[str]:
        out = []
        for key, row in rows:
            problem = string_field_problem(dict(row) if isinstance(row, Mapping) else row, name)
            if problem:
                raise ValueError(f"row {key}: {problem}")
            out.append(row[name])
        return out

    def __call__(self, rows: list[tuple[str, Any]]) -> list[Document]:
        tok = self.tokenizer
        prompts = tok(self._texts(rows, self.fields[0]), add_special_tokens=False)["input_ids"]
        completions = tok(self._texts(rows, self.fields[1]), add_special_tokens=False)["input_ids"]
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        eos = [tok.eos_token_id]
        docs = []
        for prompt, completion in zip(prompts, completions, strict=True):
            head, tail = bos + prompt, completion + eos
            docs.append(Document(head + tail, [False] * len(head) + [True] * len(tail)))
        return docs
