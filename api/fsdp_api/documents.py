"""Reading FSDPTraining documents from YAML files: the one loader of the CLI, run-local and the tools.

Every problem with the input is an :class:`InputError` whose message is one
line naming the file, the document and the field, never a traceback.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from . import kubeyaml
from .contract import API_VERSION, KIND
from .rules import format_errors
from .spec import FSDPTraining


class InputError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""


@dataclass(frozen=True)
class Document:
    """One YAML document of an input file, with where it came from."""

    source: str
    index: int  # 1-based, as a user counts documents
    body: Any

    @property
    def where(self) -> str:
        meta = self.body.get("metadata") if isinstance(self.body, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        label = f"document {self.index}" + (f" ({name})" if isinstance(name, str) else "")
        return f"{self.source}: {label}"


def read_documents(path: str) -> list[Document]:
    """The non-empty YAML documents of ``path`` (``-`` is stdin)."""
    source = "<stdin>" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise InputError(f"cannot read {source}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise InputError(f"cannot read {source}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    try:
        bodies = list(kubeyaml.load_all(text))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(f"{source}: invalid YAML{at}: {e.problem or e.context}") from e
    except yaml.YAMLError as e:
        raise InputError(f"{source}: invalid YAML: {e}") from e
    except RecursionError:
        raise InputError(f"{source}: invalid YAML: nested too deeply") from None
    docs = [Document(source, i, body) for i, body in enumerate(bodies, start=1) if body is not None]
    if not docs:
        raise InputError(f"{source}: no YAML documents")
    return docs


def check_kind(doc: Document) -> None:
    body = doc.body
    if not isinstance(body, dict):
        raise InputError(f"{doc.where}: expected a {KIND} mapping, got a {type(body).__name__}")
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if kind != KIND or api_version != API_VERSION:
        raise InputError(
            f"{doc.where}: kind {kind!r} with apiVersion {api_version!r} is not supported; "
            f"expected kind {KIND!r} with apiVersion {API_VERSION!r}"
        )


def without_nulls(value: Any) -> Any:
    """``value`` with every mapping entry whose value is null left out, at any depth.

    What the API server does with a null where the CRD's schema (which has no
    nullable field) expects a value: it defaults or drops it, so
    ``checkpoint: null`` means the defaults there, and must here.
    """
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def parse(doc: Document) -> tuple[FSDPTraining | None, list[str]]:
    """The validated FSDPTraining, or the ``path: message`` lines saying why not."""
    check_kind(doc)
    try:
        training = FSDPTraining.model_validate(without_nulls(doc.body))
    except ValidationError as e:
        return None, format_errors(e, model=FSDPTraining)
    except RecursionError:
        return None, ["nested too deeply to be an FSDPTraining"]
    if not training.metadata.name and not training.metadata.generate_name:
        # What the API server answers to a create without either.
        return None, ["metadata.name: Required value: name or generateName is required"]
    return training, []


def load_trainings(path: str, out: TextIO) -> list[FSDPTraining] | None:
    """All FSDPTrainings of ``path``, or None after printing every problem to ``out``."""
    trainings: list[FSDPTraining] = []
    ok = True
    docs = read_documents(path)
    for doc in docs:
        training, errors = parse(doc)
        if training is None:
            ok = False
            if len(docs) > 1:
                print(f"# {doc.where}", file=out)
            for line in errors:
                print(line, file=out)
        else:
            trainings.append(training)
    return trainings if ok else None


def load_one(path: str | Path) -> FSDPTraining:
    """The single named FSDPTraining of ``path``; every problem as one InputError."""
    docs = read_documents(str(path))
    if len(docs) != 1:
        raise InputError(f"{path}: expected one {KIND} document, the file has {len(docs)}")
    training, errors = parse(docs[0])
    if training is None:
        raise InputError(f"{docs[0].where}: invalid {KIND}: " + "; ".join(errors))
    if not training.metadata.name:
        raise InputError(f"{docs[0].where}: metadata.name is required")
    return training
