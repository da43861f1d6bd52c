"""Cross-field validation rules, written once and enforced twice.

Each rule carries a CEL expression (emitted into the CRD as
``x-kubernetes-validations`` so the API server rejects bad objects) and a
Python predicate (run by pydantic so ``fsdp-operator validate`` and the
renderer reject the same objects with the same message). Keeping both halves
in one object is what lets a test prove the two agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError


@dataclass(frozen=True)
class Rule:
    """One validation rule of a schema object.

    ``field_path`` is relative to the object the rule is attached to, in the
    CEL ``fieldPath`` syntax (``.resources.nodes``), so the API server's error
    names the offending field rather than the whole object.
    """

    cel: str
    message: str
    check: Callable[[Any], bool]
    field_path: str | None = None
    # A message that names the offending values: ``detail`` for validate, the same text
    # from ``message_expression`` (CEL) in the API server, which falls back to ``message``.
    detail: Callable[[Any], str] | None = None
    message_expression: str | None = None

    def to_crd(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            out["messageExpression"] = self.message_expression
        if self.field_path:
            out["fieldPath"] = self.field_path
            out["reason"] = "FieldValueInvalid"
        return out

    def violation(self, obj: Any = None) -> PydanticCustomError:
        message = self.detail(obj) if self.detail is not None and obj is not None else self.message
        return PydanticCustomError("fsdp_rule", message, {"field_path": self.field_path or ""})


@dataclass(frozen=True)
class TransitionRule:
    """A rule on updates (``oldSelf``): fields that cannot change on a live job."""

    cel: str
    message: str


def immutable(field: str) -> TransitionRule:
    return TransitionRule(
        cel="self == oldSelf",
        message=(
            f"{field} is immutable: it cannot change on an existing job; "
            "delete and recreate the FSDPTraining (checkpoints on the PVC are kept)"
        ),
    )


def cel_literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and "'" not in value:
        return f"'{value}'"
    raise TypeError(f"no CEL literal for {value!r}")


def wire_name(owner: type[Any], attr: str) -> str:
    """The field's name in YAML and in CEL (its camelCase alias)."""
    return owner.model_fields[attr].alias or attr


def applies_only_when(owner: type[Any], attr: str, when_cel: str, when: Callable[[Any], bool], what: str) -> Rule:
    """``attr`` of ``owner`` keeps its default unless ``when`` holds: a value nothing reads is refused.

    The CRD fills the defaults, so the API server cannot tell "unset" from "set to the
    default": comparing with the default is what both sides can check.
    """
    wire, default = wire_name(owner, attr), owner.model_fields[attr].default
    return Rule(
        cel=f"({when_cel}) || !has(self.{wire}) || self.{wire} == {cel_literal(default)}",
        message=f"{wire} applies to {what} only: set that, or leave {wire} unset (it does nothing otherwise)",
        field_path=f".{wire}",
        check=lambda o: when(o) or getattr(o, attr) == default,
    )


def run_rules(obj: Any, rules: tuple[Rule, ...]) -> None:
    for rule in rules:
        if not rule.check(obj):
            raise rule.violation(obj)


def _camel_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1] = f"{parts[-1]}[{item}]" if parts else f"[{item}]"
        else:
            parts.append(str(item))
    return ".".join(parts)


def format_errors(err: ValidationError, root: str = "") -> list[str]:
    """Turn a pydantic error into ``path: message`` lines naming the field.

    Paths use the YAML (camelCase) field names, as the API server does, so a
    user sees the same field name from ``fsdp-operator validate`` and from
    ``kubectl apply``.
    """
    lines = []
    for e in err.errors():
        path = _camel_path(tuple(e["loc"]))
        extra = (e.get("ctx") or {}).get("field_path") or ""
        if extra:
            path = f"{path}{extra}" if path else extra.lstrip(".")
        if root:
            path = f"{root}.{path}" if path else root
        lines.append(f"{path}: {e['msg']}")
    return lines
