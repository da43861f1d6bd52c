"""The embedded training corpus: English prose every Python install carries.

With neither ``data.dataset`` nor ``data.path`` the trainer trains on text
that needs no download: CPython's interactive help topics
(``pydoc_data.topics``, the Language Reference chapters behind ``help('if')``)
and the ``pydoc`` text of a fixed list of standard-library modules
(descriptions, class and function docstrings). It is real technical English,
about 1.5 MB, enough for the tiny preset to learn visibly in a few hundred
steps on a CPU.

Only the NAME/DESCRIPTION/CLASSES/FUNCTIONS sections of the module pages are
kept: FILE and MODULE REFERENCE name local paths and versions, and DATA would
print module globals, ``os.environ`` included. Memory addresses in reprs are
removed so the text is identical on every run and every node. The text
differs slightly between Python versions, which only matters for comparing
runs across versions.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pydoc
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

# Pure-prose-heavy, import-safe modules; the order is part of the corpus.
MODULES = (
    "abc", "argparse", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fractions", "functools", "glob",
    "gzip", "hashlib", "heapq", "html", "http", "inspect", "io", "ipaddress", "itertools", "json",
    "logging", "math", "operator", "pathlib", "pickle", "queue", "random", "re", "shutil", "socket",
    "statistics", "string", "struct", "subprocess", "tempfile", "textwrap", "threading", "time", "timeit",
    "typing", "unittest", "urllib", "uuid", "warnings", "weakref", "zipfile",
)  # fmt: skip
KEPT_SECTIONS = frozenset({"NAME", "DESCRIPTION", "CLASSES", "FUNCTIONS"})
SECTION = re.compile(r"^[A-Z][A-Z ]+$")
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# Documents are cut at paragraph boundaries to about this many characters, so
# the held-out validation slice (whole documents) is a fair sample.
DOC_CHARS = 4000


def _split(text: str, limit: int = DOC_CHARS) -> list[str]:
    docs: list[str] = []
    current: list[str] = []
    size = 0
    for para in re.split(r"\n\s*\n", text):
        para = para.strip("\n")
        if not para.strip():
            continue
        if current and size + len(para) > limit:
            docs.append("\n\n".join(current))
            current, size = [], 0
        current.append(para)
        size += len(para) + 2
    if current:
        docs.append("\n\n".join(current))
    return docs


def _module_text(name: str) -> str:
    page = pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext)
    kept: list[str] = []
    keep = False
    for line in page.splitlines()[1:]:  # the first line is a title with the module kind
        if SECTION.match(line):
            keep = line in KEPT_SECTIONS
            continue
        if keep:
            kept.append(line.rstrip())
    return ADDRESS.sub("", textwrap.dedent("\n".join(kept)))


def help_topic_documents() -> list[str]:
    from pydoc_data.topics import topics

    return [doc for key in sorted(topics) for doc in _split(ADDRESS.sub("", topics[key]))]


def module_documents() -> list[str]:
    return [doc for name in MODULES for doc in _split(_module_text(name))]


def build_documents() -> list[str]:
    """Render the corpus in this interpreter (its text depends on what already ran here)."""
    return help_topic_documents() + module_documents()


def build_documents_cleanly() -> list[str]:
    """Render the corpus in a fresh interpreter.

    pydoc shows class attributes as they are at the time of rendering, and
    some appear only after use (``copy``/``pickle`` add ``__slotnames__``), so
    rendering inside a process that has done other things is not reproducible.
    """
    code = f"import json, sys; from {__name__} import build_documents; json.dump(build_documents(), sys.stdout)"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


def _cache_file() -> Path:
    # Keyed by the interpreter (the source of the text) and by this module's
    # own source (the rules that cut it), so a change of either rebuilds it.
    key = hashlib.sha256((sys.version + Path(__file__).read_text()).encode()).hexdigest()[:16]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fsdp-k8s"
    return base / f"corpus-{key}.json"


def embedded_documents() -> list[str]:
    """The corpus as documents, in a fixed order.

    Rendering the pydoc pages takes seconds, so the result is cached; every
    rank of a launch reads the same file (or builds an identical one).
    """
    cache = _cache_file()
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        pass
    docs = build_documents_cleanly()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=cache.name + ".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(docs, f)
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home only costs the rebuild next time
    return docs
