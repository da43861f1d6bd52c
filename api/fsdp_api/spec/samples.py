"""training.samples: prompts the model answers during training, so a run shows what it learned, not only a loss."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..base import ApiModel

# Every rank decodes every prompt (FSDP gathers each layer for every token), so the set is kept small.
MAX_PROMPTS = 16
MAX_PROMPT_CHARS = 4096
MAX_NEW_TOKENS = 1024


Prompt = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS, description="One prompt.")]


class SamplesSpec(ApiModel):
    """Completions of a few prompts, greedy, at each validation and at the end of training, sent to the trackers."""

    prompts: list[Prompt] = Field(
        min_length=1,
        max_length=MAX_PROMPTS,
        description=(
            f"1 to {MAX_PROMPTS} prompts, each up to {MAX_PROMPT_CHARS} characters. Answered with the model's chat "
            "template (a user turn and the generation prompt) where its tokenizer has one and chat is not off."
        ),
    )
    max_new_tokens: int = Field(
        default=64, ge=1, le=MAX_NEW_TOKENS, description="Tokens generated per prompt at most (greedy decoding)."
    )
    chat: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="auto: the chat template when the tokenizer has one; on: it must have one; off: the raw text.",
    )
