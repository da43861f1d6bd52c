"""The registry of ``data.format``s: one class per format (``base.DataFormat``), registered by name.

A new format is one module here with one registered class (and its name in
the API's ``DataSpec.format``); the loader, the config checks and the train
loop find it through ``data_format``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import FORMATS, DataFormat, Encoder, RowFormat, data_format, register
from .chat import ChatEncoder, ChatFormat
from .preference import PreferenceEncoder, PreferenceFormat
from .prompt_completion import PromptCompletionEncoder, PromptCompletionFormat
from .text import TextFormat

if TYPE_CHECKING:
    from fsdp_api.spec import DataSpec
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "FORMATS",
    "ChatEncoder",
    "ChatFormat",
    "DataFormat",
    "Encoder",
    "PreferenceEncoder",
    "PreferenceFormat",
    "PromptCompletionEncoder",
    "PromptCompletionFormat",
    "RowFormat",
    "TextFormat",
    "data_format",
    "register",
    "row_encoder",
]


def row_encoder(spec: DataSpec, tokenizer: PreTrainedTokenizerBase) -> Encoder:
    """Rows ``(key, value)`` of ``spec.format`` -> documents; a plain-text format has none."""
    return data_format(spec.format).encoder(spec, tokenizer)
