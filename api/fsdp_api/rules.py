"""Cross-field validation rules, written once and enforced twice.

Each rule carries a CEL expression (emitted into the CRD as
``x-kubernetes-validations`` so the API server rejects bad objects) and a
Python predicate (run by pydantic so ``fsdp-operator validate`` and the
renderer reject the same objects with the same message). Keeping both halves
in one object is what lets a test prove the two agree.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
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


def format_errors(err: ValidationError, root: str = "", model: type[BaseModel] | None = None) -> list[str]:
    """Turn a pydantic error into ``path: message`` lines naming the field.

    Paths use the YAML (camelCase) field names, as the API server does, so a
    user sees the same field name from ``fsdp-operator validate`` and from
    ``kubectl apply``; a missing field, an unknown one and a value outside an
    enum are worded as the API server words them, and the last two name the
    nearest known field or value (``model``: the validated class, whose fields
    an unknown name is matched against).
    """
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = _camel_path(loc)
        extra = (e.get("ctx") or {}).get("field_path") or ""
        if extra:
            path = f"{path}{extra}" if path else extra.lstrip(".")
        if root:
            path = f"{root}.{path}" if path else root
        lines.append(f"{path}: {_message(e, path, loc, model)}")
    return lines


def _message(e: Any, path: str, loc: tuple[int | str, ...], model: type[BaseModel] | None) -> str:
    if e["type"] == "missing":
        return "Required value"
    if e["type"] == "extra_forbidden":
        known = _field_names(model, loc[:-1]) if model is not None else []
        return f'unknown field "{path}"' + _nearest(str(loc[-1]), known)
    if e["type"] in ("literal_error", "enum"):
        allowed = re.findall(r"'([^']*)'", (e.get("ctx") or {}).get("expected", ""))
        if allowed and isinstance(e["input"], str):
            supported = ", ".join(f'"{a}"' for a in allowed)
            return f'Unsupported value: "{e["input"]}": supported values: {supported}' + _nearest(e["input"], allowed)
    return e["msg"]


def _nearest(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f'; did you mean "{close[0]}"?' if close else ""


def _field_names(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The YAML names of the fields of the object at ``loc`` under ``model`` (none where it is no model)."""
    current: Any = model
    for item in loc:
        found = _as_model(current)
        if isinstance(item, int):  # an index into a list of models
            current = found or current
            continue
        field = (
            None if found is None else next((f for n, f in found.model_fields.items() if item in (n, f.alias)), None)
        )
        if field is None:
            return []
        current = field.annotation
    found = _as_model(current)
    return [f.alias or n for n, f in found.model_fields.items()] if found is not None else []


def _as_model(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds: itself, or the one inside ``Optional[M]``, ``list[M]``, ``Annotated[M, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _as_model(arg)
        if found is not None:
            return found
    return None
