"""Rules for the spec's references to objects in S3 (model, data, remote checkpoints), written once.

A reference the trainer would only refuse in the pod (or worse, read as a hub
id) is refused by ``validate`` and the API server alike: the s3:// form
(``fsdp_api.object_keys``), a whole bucket where a prefix is meant, and URL
schemes the trainer does not read (``gs://``, ``s3a://`` ...).
"""

from __future__ import annotations

import re
from typing import Any

from ..object_keys import S3_FORM, SCHEME, s3_uri_cel, s3_uri_problem, s3_uri_problem_cel
from ..rules import Rule

# Bounds the CEL rules' cost, as the API server requires of a string a rule reads.
MAX_REFERENCE_LENGTH = 1024
_S3_FORM = f"must be {S3_FORM} with a valid bucket name and prefix"
# A bucket with nothing after it but one slash: the same pattern for Python's re and CEL's matches.
_BUCKET_ROOT = r"^s3://[^/]+/?$"


def _text(obj: Any, attr: str) -> str:
    return getattr(obj, attr) or ""


def s3_form_rule(field: str, attr: str | None = None) -> Rule:
    """``field``, when an s3:// URI, is one the trainer can read (``attr``: the model's name, when it differs)."""
    attr = attr or field
    return Rule(
        cel=f"!has(self.{field}) || {s3_uri_cel(f'self.{field}')}",
        message=_S3_FORM,
        field_path=f".{field}",
        check=lambda m: not _text(m, attr).startswith(SCHEME) or s3_uri_problem(_text(m, attr)) is None,
        # The reason, in the same words from validate and from the API server.
        detail=lambda m: f"{_S3_FORM}: {s3_uri_problem(_text(m, attr))}",
        message_expression=(
            f"has(self.{field}) ? '{_S3_FORM}: ' + ({s3_uri_problem_cel(f'self.{field}')}) : '{_S3_FORM}'"
        ),
    )


def no_bucket_root_rule(attr: str, what: str) -> Rule:
    """A model or data reference names a prefix: a whole bucket would be copied into the pod."""
    return Rule(
        cel=f"!has(self.{attr}) || !self.{attr}.matches('{_BUCKET_ROOT}')",
        message=f"names a whole bucket: give the prefix of the {what} (the bucket's root would be copied whole)",
        field_path=f".{attr}",
        check=lambda m: re.search(_BUCKET_ROOT, _text(m, attr)) is None,
    )


def no_other_scheme_rule(attr: str, reads: str, *, s3: bool) -> Rule:
    """``attr`` is no URL of a scheme the trainer does not read (taken as a hub id, it would fail in the pod).

    ``s3``: whether ``s3://`` is one the field takes.
    """
    allowed = f" && !self.{attr}.startsWith('{SCHEME}')" if s3 else ""
    return Rule(
        cel=f"!has(self.{attr}) || !(self.{attr}.contains('://'){allowed})",
        message=f"must be {reads}; other URLs (gs://, s3a://, https:// ...) are not read",
        field_path=f".{attr}",
        check=lambda m: "://" not in _text(m, attr) or (s3 and _text(m, attr).startswith(SCHEME)),
    )
