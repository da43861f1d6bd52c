"""Errors the trainer reports to the user rather than as a traceback."""

from __future__ import annotations

from collections.abc import Iterable

from fsdp_api.contract import CONFIG_ERROR_HEADER

# Names listed in one error line before "and N more".
SHOWN_NAMES = 8


def name_list(names: Iterable[str]) -> str:
    """``a, b, c and 12 more``: sorted, bounded, for error lines that name tensors or files."""
    ordered = sorted(names)
    more = f" and {len(ordered) - SHOWN_NAMES} more" if len(ordered) > SHOWN_NAMES else ""
    return ", ".join(ordered[:SHOWN_NAMES]) + more


def first_line(e: BaseException) -> str:
    """``TypeName: first line of the message``, for a log or error line that names what went wrong."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def load_failure(e: BaseException) -> str:
    """Why transformers could not load a config, tokenizer or model: its message, or ours for custom code.

    transformers' own words for a directory with ``auto_map`` advise
    ``trust_remote_code=True``, which the trainer never passes.
    """
    if "custom code" in str(e) or "trust_remote_code" in str(e):
        return (
            "it needs custom code of its own (auto_map), and the trainer never runs code from a model or "
            "tokenizer directory; use a model type transformers ships"
        )
    return str(e)


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file holds more than data (tensors, numbers, strings): never unpickled."""


class UnloadableCheckpointError(RuntimeError):
    """No complete checkpoint under checkpoint.dir could be loaded; each is named with why."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written for a reason only the user can fix (a full volume): one line."""


class ConfigError(ValueError):
    """The configuration cannot work; each line names the field: ``path: message``.

    Raised before any process group exists, so a bad config fails fast on every
    rank with the same message instead of hanging a rendezvous.
    """

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__(CONFIG_ERROR_HEADER + "\n" + "\n".join(f"  {line}" for line in lines))
