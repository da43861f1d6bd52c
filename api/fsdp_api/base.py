"""The base of every API object (spec, status and trainer config alike)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

from .rules import Rule, run_rules


class ApiModel(BaseModel):
    """Base of every API object: camelCase in YAML, unknown fields rejected.

    The API server rejects unknown fields too (kubectl's strict field
    validation), so a typo fails loudly instead of being pruned silently.
    """

    # allow_inf_nan=False: JSON has no infinity or NaN, so kubectl cannot send them (YAML's .inf, .nan).
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        strict=True,
        allow_inf_nan=False,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _run_rules(self) -> ApiModel:
        run_rules(self, self.rules)
        return self
