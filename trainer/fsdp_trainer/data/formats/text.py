"""``data.format: text``: documents are plain text, tokenized whole and packed into windows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import files, scan
from .base import DataFormat, register

if TYPE_CHECKING:
    from fsdp_api.spec import DataSpec


@register
class TextFormat(DataFormat):
    name = "text"
    settings = ("data.textField",)
    packs_documents = False

    def fields(self, spec: DataSpec) -> tuple[str, ...]:
        return (spec.text_field,)

    def check_files(self, spec: DataSpec, found: files.DataFiles) -> list[str]:
        # The text builder reads whole lines: its column is always "text".
        problem = files.check_has_text(found, spec.text_field if found.builder != "text" else "text")
        if problem is None:
            problem = scan.scan(found).message()
        return [f"data.path: {spec.path}: {problem}"] if problem else []
