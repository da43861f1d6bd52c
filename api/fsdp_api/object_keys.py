"""Object-store addresses and keys, checked before anything is requested or written.

Two questions every S3 path in the project asks, answered once here (torch-free,
so ``fsdp-operator validate``, the admission rules and the trainer agree):

* Is ``s3://bucket/prefix`` a location at all? The bucket follows the S3 user
  guide's general-purpose naming rules (3-63 characters of lowercase letters,
  digits, dots and hyphens, a letter or digit at each end, no two adjacent dots,
  not an IP address); the prefix has no empty, ``.`` or ``..`` segment, no
  control character and no glob (S3 has none: a ``*`` is a literal key byte).
  The AWS-reserved prefixes and suffixes (``xn--``, ``-s3alias`` ...) are not
  refused: S3-compatible stores allow them, and AWS answers NoSuchBucket.
* Where may an object key land on disk? S3 stores keys verbatim, so a key (or a
  manifest naming one) may be ``../../x`` or ``/etc/x``. ``local_path`` turns a
  key relative to a download root into a path strictly under that root, or
  refuses it, before a byte is written.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

# The object stores the trainer reads and writes (its storage registry holds exactly these);
# each needs its URI form checked below before the spec may accept it.
STORE_SCHEMES: tuple[str, ...] = ("s3",)
SCHEME = "s3://"
S3_FORM = "s3://bucket[/prefix]"

# (pattern, whether a match is the problem, the problem): one table read by
# Python's re here and, as CEL ``matches`` (RE2, a search as re.search is), by
# the API server, so both refuse the same URIs with the same words.
S3_URI_CHECKS: tuple[tuple[str, bool, str], ...] = (
    (
        r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$",
        False,
        "the bucket is not an S3 bucket name (3-63 lowercase letters, digits, dots and hyphens, "
        "a letter or digit at each end)",
    ),
    (r"^s3://[^/]*\.\.", True, "the bucket has two adjacent dots, which S3 bucket names never have"),
    (
        r"^s3://[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+(/|$)",
        True,
        "the bucket is formatted as an IP address, which S3 bucket names never are",
    ),
    # A segment that is empty, "." or ".." before a slash, or "." / ".." at the end
    # (one trailing slash is a prefix's usual spelling, and allowed).
    (r"^s3://[^/]+/(.*/)?(\.|\.\.)?/", True, "the prefix has an empty, '.' or '..' segment"),
    (r"^s3://[^/]+/(.*/)?\.\.?/?$", True, "the prefix has an empty, '.' or '..' segment"),
    (r"[\x00-\x1f\x7f]", True, "the prefix has a control character"),
    (r"\\", True, "the prefix has a backslash, which some tools read as a separator"),
    (r"[*?\[]", True, "the prefix has a glob character: S3 has no globs, give the prefix the objects share"),
)


def s3_uri_problem(uri: str) -> str | None:
    """Why ``uri`` is not a usable ``s3://bucket[/prefix]``, as one phrase; None when it is."""
    if not uri.startswith(SCHEME):
        return f"is not {S3_FORM}"
    for pattern, refused_on_match, problem in S3_URI_CHECKS:
        if bool(re.search(pattern, uri)) == refused_on_match:
            return problem
    return None


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_fails(value: str, check: tuple[str, bool, str]) -> str:
    pattern, refused_on_match, _ = check
    found = f"{value}.matches({_cel_string(pattern)})"
    return found if refused_on_match else f"!{found}"


def s3_uri_cel(value: str) -> str:
    """CEL, true when the string ``value`` (a CEL expression) is no s3:// URI or one ``s3_uri_problem`` accepts."""
    fails = " || ".join(_cel_fails(value, c) for c in S3_URI_CHECKS)
    return f"!{value}.startsWith('{SCHEME}') || !({fails})"


def s3_uri_problem_cel(value: str) -> str:
    """CEL giving ``s3_uri_problem``'s phrase for an s3:// ``value`` it refuses (a messageExpression)."""
    expr = "''"
    for check in reversed(S3_URI_CHECKS):
        expr = f"{_cel_fails(value, check)} ? {_cel_string(check[2])} : {expr}"
    return expr


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix without slashes at its ends) of ``uri``; ValueError with the reason otherwise."""
    problem = s3_uri_problem(uri)
    if problem:
        raise ValueError(f"{uri!r}: {problem}")
    bucket, _, prefix = uri[len(SCHEME) :].partition("/")
    return bucket, prefix.strip("/")


def key_problem(key: str) -> str | None:
    """Why ``key`` (relative, ``/``-separated) cannot name a file under a directory; None when it can."""
    if not key:
        return "key is empty"
    if any(ord(c) < 32 or c == "\x7f" for c in key):
        return f"key {key!r} has a control character"
    if key.startswith("/"):
        return f"key {key!r} is absolute"
    if "\\" in key:
        return f"key {key!r} has a backslash, which some tools read as a separator"
    if any(s in ("", ".", "..") for s in key.split("/")):
        return f"key {key!r} has an empty, '.' or '..' segment"
    return None


class UnsafeKey(ValueError):
    """An object key that would land outside the directory it is downloaded into."""


def local_path(root: Path, key: str) -> Path:
    """``root / key`` for a key relative to ``root``; UnsafeKey unless the result lies strictly under ``root``.

    Checked lexically first (no ``..``, not absolute, no empty segment), then
    after resolving symlinks, so a link already inside ``root`` cannot point out.
    """
    problem = key_problem(key)
    if problem:
        raise UnsafeKey(problem)
    path = root / PurePosixPath(key)
    base = root.resolve()
    resolved = path.resolve()
    if resolved == base or not resolved.is_relative_to(base):
        raise UnsafeKey(f"key {key!r} leads outside {root}")
    return path
