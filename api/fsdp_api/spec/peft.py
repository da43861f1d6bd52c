"""The peft section: LoRA adapters on a frozen base model."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from ..base import ApiModel
from ..rules import Rule

# A module name as transformers spells it (q_proj, mlp.down_proj, c_attn).
MODULE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$"
ModuleName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=MODULE_NAME_PATTERN,
        description="A module name or a suffix of one (q_proj, self_attn.v_proj).",
    ),
]


class PeftSpec(ApiModel):
    """Parameter-efficient fine-tuning: LoRA adapters on a frozen base model.

    The base weights are frozen (no gradients, no optimizer state) and only
    the adapters train; checkpoints hold the adapters, their optimizer state
    and the data position, and ``fsdp-train export`` writes a PEFT adapter
    directory or a merged model (docs/fine-tuning.md).
    """

    method: Literal["lora", "qlora"] = Field(
        default="lora",
        description="lora: low-rank adapters on the frozen base (qlora, a 4-bit base, is not supported).",
    )
    rank: int = Field(default=16, ge=1, le=1024, description="Rank r of each adapter (A is r x in, B is out x r).")
    alpha: float | None = Field(
        default=None,
        gt=0,
        le=65536,
        description="LoRA alpha: the adapter's output is scaled by alpha / rank. Unset: twice the rank.",
    )
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the adapters' input while training.")
    target_modules: list[ModuleName] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description=(
            "Modules to adapt, by name or name suffix as PEFT matches them (q_proj, self_attn.v_proj); "
            "each must match a Linear layer inside the decoder layers. Unset: every Linear layer of the "
            "decoder layers (attention and MLP projections; MoE routers excepted), found from the model."
        ),
    )

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule(
            cel="self.method != 'qlora'",
            message="qlora (4-bit base weights) is not supported; use lora (docs/fine-tuning.md says why)",
            field_path=".method",
            check=lambda s: s.method != "qlora",
        ),
    )

    def effective_alpha(self) -> float:
        return self.alpha if self.alpha is not None else 2.0 * self.rank

    def scaling(self) -> float:
        return self.effective_alpha() / self.rank
