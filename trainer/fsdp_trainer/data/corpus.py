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
removed. The text differs between Python versions, so it is rendered once
(``python -m fsdp_trainer.data.corpus``) and shipped as
``assets/corpus.json.xz``: every install, image and Python version trains on
the same bytes, the ones the embedded tokenizer was learned from.
"""

from __future__ import annotations

import functools
import importlib
import json
import lzma
import os
import platform
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
# Rendered once and shipped: see ``embedded_documents``.
ASSET = Path(__file__).resolve().parent.parent / "assets" / "corpus.json.xz"


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
    # typeshed's pydoc stub leaves out ``plaintext`` (the TextDoc without bold), which pydoc has had since 3.0.
    page = pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext)  # type: ignore[attr-defined]
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


def write_asset(path: Path = ASSET) -> Path:
    """Render the corpus with this interpreter and write it as the shipped asset (maintainers only)."""
    record = {"rendered_with": f"Python {platform.python_version()}", "documents": build_documents_cleanly()}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(lzma.compress(json.dumps(record, indent=0).encode(), preset=9))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def embedded_documents() -> list[str]:
    """The corpus as documents, in a fixed order: the shipped asset, never a render.

    Read, not rendered, because pydoc's text changes with the Python version
    (3.12 gives 490 documents where 3.11 gives 482, 477 of them different):
    a pod on the image's Python would train on other text than ``make run``
    on the host, and a resume after an image upgrade would land its data
    position in another corpus.
    """
    return list(_read_asset())


@functools.cache
def _read_asset() -> tuple[str, ...]:
    try:
        return tuple(json.loads(lzma.decompress(ASSET.read_bytes()))["documents"])
    except (OSError, ValueError, KeyError, lzma.LZMAError) as e:
        raise SystemExit(f"fsdp-train: the embedded corpus {ASSET} cannot be read ({e}); reinstall fsdp-k8s") from None


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ASSET
    print(f"embedded corpus rendered with Python {platform.python_version()} into {write_asset(target)}")
