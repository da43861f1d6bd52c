"""The data section: the training data, its format and the tokenizer."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ..base import ApiModel
from ..rules import Rule, cel_literal, wire_name
from .object_refs import MAX_REFERENCE_LENGTH, no_bucket_root_rule, no_other_scheme_rule, s3_form_rule


class DataSpec(ApiModel):
    """Training data: a Hugging Face dataset, local files, or the embedded corpus."""

    dataset: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REFERENCE_LENGTH,
        description="Hugging Face dataset id (e.g. allenai/c4). Mutually exclusive with path.",
    )
    config: str | None = Field(
        default=None, min_length=1, description="Dataset configuration name (e.g. en for allenai/c4)."
    )
    split: str = Field(default="train", min_length=1, description="Split to train on.")
    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REFERENCE_LENGTH,
        description=(
            "Local or PVC path to json/jsonl/parquet/txt files (a file, a directory or a glob), or "
            "s3://bucket/key (an object, or every object under a prefix), instead of the hub. With neither "
            "dataset nor path, the corpus embedded in the trainer is used."
        ),
    )
    text_field: str = Field(default="text", min_length=1, description="Name of the column holding the text.")
    format: Literal["text", "chat", "prompt-completion", "preference"] = Field(
        default="text",
        description=(
            "text: documents concatenated into full windows, every token trained (pre-training); "
            "chat: rows of messages rendered with the tokenizer's chat template, loss on assistant turns only; "
            "prompt-completion: rows of prompt and completion, loss on the completion only; "
            "preference: rows of prompt, chosen and rejected (TRL's fields; the prompt plain text or a list of "
            "chat messages) for training.objective dpo and simpo. "
            "The row formats pack whole rows (a preference pair stays together) into sequences that never attend "
            "across rows."
        ),
    )

    @property
    def packs_rows(self) -> bool:
        """Whether whole rows are packed into padded sequences (attention kept within a row), not windows."""
        return self.format in ROW_FORMATS

    messages_field: str = Field(
        default="messages",
        min_length=1,
        description="format chat: column holding the list of {role, content} messages.",
    )
    prompt_field: str = Field(
        default="prompt", min_length=1, description="format prompt-completion and preference: column of the prompt."
    )
    completion_field: str = Field(
        default="completion", min_length=1, description="format prompt-completion: column of the completion."
    )
    chosen_field: str = Field(
        default="chosen",
        min_length=1,
        description="format preference: column of the preferred answer (text, or a list of chat messages).",
    )
    rejected_field: str = Field(
        default="rejected",
        min_length=1,
        description="format preference: column of the dispreferred answer (text, or a list of chat messages).",
    )
    overlong: Literal["truncate", "drop"] = Field(
        default="truncate",
        description=(
            "chat and prompt-completion: a row longer than seqLen + 1 tokens is cut to its first seqLen + 1 "
            "tokens (truncate) or skipped (drop); preference: a pair whose two sequences together fill more "
            "than seqLen positions has each cut to its first seqLen/2 + 1 tokens, or is skipped; either way it "
            "is counted and logged."
        ),
    )
    streaming: bool = Field(default=False, description="Stream the dataset instead of downloading it whole first.")
    tokenizer: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Hugging Face tokenizer id or local path (AutoTokenizer). "
            "Unset: pretrained's tokenizer if set, else the tokenizer embedded in the trainer."
        ),
    )
    validation_split: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Split used for validation. Unset: a deterministic held-out slice of the training "
            "documents (never trained on)."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        no_other_scheme_rule("dataset", "a Hugging Face dataset id", s3=False),
        no_other_scheme_rule("path", "a local or PVC path or s3://bucket/key", s3=True),
        s3_form_rule("path"),
        no_bucket_root_rule("path", "data's files"),
        Rule(
            cel="!(has(self.dataset) && has(self.path))",
            message="set either dataset or path, not both",
            field_path=".path",
            check=lambda d: not (d.dataset and d.path),
        ),
        Rule(
            cel="!has(self.format) || self.format == 'text' || has(self.dataset) || has(self.path)",
            message=(
                "format chat, prompt-completion and preference need dataset or path: the embedded corpus is plain text"
            ),
            field_path=".format",
            check=lambda d: d.format == "text" or bool(d.dataset or d.path),
        ),
    )


# The formats that pack whole rows into padded sequences whose rows never attend to each other
# (the trainer's DataFormat.packs_documents; tests/trainer/data/test_formats.py holds the two equal).
# The rest ("text") cut one stream of documents into full windows.
ROW_FORMATS = frozenset({"chat", "prompt-completion", "preference"})


# The columns each row format reads: two of them naming one column would train on the
# prompt as its own answer, or on a pair whose two answers are always equal (loss ln 2, no signal).
_FORMAT_COLUMNS: dict[str, tuple[str, ...]] = {
    "prompt-completion": ("prompt_field", "completion_field"),
    "preference": ("prompt_field", "chosen_field", "rejected_field"),
}


def _distinct_columns_rule(fmt: str, attrs: tuple[str, ...]) -> Rule:
    fields = DataSpec.model_fields
    wires = [wire_name(DataSpec, a) for a in attrs]
    value = {
        w: f"(has(self.{w}) ? self.{w} : {cel_literal(fields[a].default)})" for w, a in zip(wires, attrs, strict=True)
    }
    pairs = [(a, b) for i, a in enumerate(wires) for b in wires[i + 1 :]]
    return Rule(
        cel=f"!has(self.format) || self.format != '{fmt}' || ("
        + " && ".join(f"{value[a]} != {value[b]}" for a, b in pairs)
        + ")",
        message=f"format {fmt} reads {', '.join(wires)} as different columns: two of them name the same one",
        field_path=f".{wires[-1]}",
        check=lambda d: d.format != fmt or len({getattr(d, a) for a in attrs}) == len(attrs),
    )


# After the class: the rules read its fields' names and defaults.
DataSpec.rules = (*DataSpec.rules, *(_distinct_columns_rule(fmt, attrs) for fmt, attrs in _FORMAT_COLUMNS.items()))
