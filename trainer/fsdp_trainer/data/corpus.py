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
    module = __spec__.name if __spec__ else __name__  # not "__main__" under ``python -m``
    code = f"import json, sys; from {module} import build_documents; json.dump(build_documents(), sys.stdout)"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


def _cache_files() -> list[Path]:
    """Where the rendered corpus may be kept, first found first read.

    Keyed by the interpreter (the source of the text) and by this module's
    own source (the rules that cut it), so a change of either rebuilds it.
    First the environment's own copy (``<prefix>/share/fsdp-k8s``, written
    when the image or the virtual environment is built): a pod's HOME is a
    fresh emptyDir, so a user cache alone made every rank of every pod that
    trains on the corpus render it again, about 2 s each before training.
    """
    key = hashlib.sha256((sys.version + Path(__file__).read_text()).encode()).hexdigest()[:16]
    name = f"corpus-{key}.json"
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fsdp-k8s"
    return [Path(sys.prefix) / "share" / "fsdp-k8s" / name, user / name]


def _write(path: Path, docs: list[str]) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(docs, f)
        os.chmod(tmp, 0o644)  # an image's copy is written by root and read by the pod's user
        os.replace(tmp, path)
        return True
    except OSError:
        return False  # a read-only place only costs the rebuild next time


def embedded_documents() -> list[str]:
    """The corpus as documents, in a fixed order.

    Rendering the pydoc pages takes seconds, so the result is cached; every
    rank of a launch reads the same file (or builds an identical one). A
    virtual environment keeps its own copy (the local cluster's pods run from
    this one); any other install writes to the user cache only.
    """
    places = _cache_files()
    in_venv = sys.prefix != sys.base_prefix
    for i, place in enumerate(places):
        try:
            docs = json.loads(place.read_text())
        except (OSError, ValueError):
            continue
        if i > 0 and in_venv:
            _write(places[0], docs)  # a venv made before the environment's copy existed
        return docs
    docs = build_documents_cleanly()
    for place in places if in_venv else places[1:]:
        if _write(place, docs):
            break
    return docs


def install() -> Path:
    """Render the corpus into the environment, so that no process renders it at start (image builds)."""
    place = _cache_files()[0]
    if not _write(place, build_documents_cleanly()):
        raise SystemExit(f"fsdp-train: cannot write the embedded corpus to {place}")
    return place


if __name__ == "__main__":
    print(f"embedded corpus written to {install()}")
