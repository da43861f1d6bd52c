"""training.samples: prompts the model answers during training, so a run shows what it learned, not only a loss."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from ..base import ApiModel
from ..rules import Rule

# Every rank decodes every prompt (FSDP gathers each layer for every token), so the set is kept small.
MAX_PROMPTS = 16
MAX_PROMPT_CHARS = 4096
MAX_NEW_TOKENS = 1024
# Tokens of all the answers together: each is a forward of the whole sharded model on every rank
# (all-gathers included), so a set costs this many forwards at each validation.
MAX_ANSWER_TOKENS = 4096
DEFAULT_NEW_TOKENS = 64


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
        default=DEFAULT_NEW_TOKENS,
        ge=1,
        le=MAX_NEW_TOKENS,
        description="Tokens generated per prompt at most (greedy decoding).",
    )
    chat: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="auto: the chat template when the tokenizer has one; on: it must have one; off: the raw text.",
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel=(
                f"size(self.prompts) * (has(self.maxNewTokens) ? self.maxNewTokens : {DEFAULT_NEW_TOKENS}) "
                f"<= {MAX_ANSWER_TOKENS}"
            ),
            message=(
                f"prompts x maxNewTokens must be at most {MAX_ANSWER_TOKENS}: every answer token is a forward of "
                "the whole sharded model on every rank, at each validation"
            ),
            field_path=".maxNewTokens",
            check=lambda s: len(s.prompts) * s.max_new_tokens <= MAX_ANSWER_TOKENS,
        ),
    )
