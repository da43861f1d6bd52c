"""Telling local paths from Hugging Face hub ids, and fetching hub snapshots.

``model.pretrained``, ``data.tokenizer`` and ``data.dataset`` accept either.
A reference is local when it is written like a path (absolute, ``./``, ``~``)
or names an existing directory; anything else is a hub id, fetched into the
hub cache (``HF_HOME``) unless ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import re
from pathlib import Path

# owner/name or name, as the hub spells repository ids.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def local_path(ref: str) -> Path | None:
    """The local file or directory ``ref`` names, or None for a hub id.

    ``owner/name`` is ambiguous (a relative path or a hub id): it is local only
    if it exists; otherwise it is looked up on the hub, and the error then
    says it could not be fetched. Write ``./owner/name`` to mean a path.
    """
    path = Path(ref).expanduser()
    if ref.startswith(("/", "./", "../", "~")) or path.exists() or not HUB_ID.match(ref):
        return path
    return None


def snapshot(repo_id: str, allow_patterns: list[str]) -> Path:
    """Download (or find in the cache) the files of a hub repository.

    Only the patterns asked for are fetched: a model's safetensors and JSON
    files, never its other weight formats.
    """
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, allow_patterns=allow_patterns))
