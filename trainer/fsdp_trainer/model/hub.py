"""Telling local paths from Hugging Face hub ids, and fetching hub snapshots.

``model.pretrained``, ``data.tokenizer`` and ``data.dataset`` accept either.
A reference is local when it is written like a path (absolute, ``./``, ``~``)
or names an existing directory; anything else is a hub id, fetched into the
hub cache (``HF_HOME``) unless ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from pathlib import Path

# owner/name or name, as the hub spells repository ids.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# How long the config check waits for the hub to answer. The hub client's own
# retries wait much longer without a word: behind a proxy or a firewall that
# swallows the connection, huggingface_hub 2.4's snapshot_download was still
# waiting after 3 minutes, when the measurement gave up (docs/trainer.md).
HUB_PROBE_SECONDS = 10.0
# huggingface_hub's spellings of "true" for its offline switches (constants._is_true).
_TRUE = {"1", "ON", "YES", "TRUE"}


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


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or transformers' TRANSFORMERS_OFFLINE) is set: only the local cache is read."""
    return any(os.environ.get(v, "").upper() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_unreachable(timeout: float | None = None) -> str | None:
    """Why the hub does not answer within ``timeout`` seconds; None when it answers, whatever the status.

    One request, no retries, through the same proxy variables the hub client honours.
    """
    request = urllib.request.Request(hub_endpoint(), method="HEAD")
    try:
        # A fresh opener: it reads the proxy variables now (urlopen's global one keeps its first).
        opener = urllib.request.build_opener()
        opener.open(request, timeout=HUB_PROBE_SECONDS if timeout is None else timeout).close()
    except urllib.error.HTTPError:
        return None  # an answer, even 4xx/5xx: the network works; the hub client says what is wrong
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return str(reason) or type(reason).__name__
    return None
