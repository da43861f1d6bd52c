"""The example files, as a pytest plugin (tests/conftest.py loads it): every test folder parametrizes over them.

``valid_example`` and ``invalid_example`` parametrize a test over examples/*.yaml
and examples/invalid/*.yaml; ``invalid_examples`` is the set as a whole and
``training_from`` loads one as the API model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api import FSDPTraining

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# The FSDPTraining of examples/your-own-script sits beside its script and kustomization.
VALID_EXAMPLES = sorted([*EXAMPLES.glob("*.yaml"), EXAMPLES / "your-own-script" / "fsdptraining.yaml"])
INVALID_EXAMPLES = sorted((EXAMPLES / "invalid").glob("*.yaml"))

_EXPECT = re.compile(r"^# (expect|expect-apiserver): (\S+) (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class InvalidExample:
    """An examples/invalid file and the error it must produce.

    ``# expect: <field path> <message>`` is what pydantic (``fsdp-operator
    validate``) says; ``# expect-apiserver:`` overrides it for the API server
    where the wording is the server's own (enums, unknown fields). Files named
    cel-* break a rule of api/rules.py, whose message both sides share verbatim.
    """

    path: Path
    field: str
    message: str
    apiserver_field: str
    apiserver_message: str

    def body(self) -> dict[str, Any]:
        return yaml.safe_load(self.path.read_text())


def read_invalid_example(path: Path) -> InvalidExample:
    found = {kind: (field, message.strip()) for kind, field, message in _EXPECT.findall(path.read_text())}
    assert "expect" in found, f"{path} needs a '# expect: <field path> <message>' line"
    field, message = found["expect"]
    api_field, api_message = found.get("expect-apiserver", found["expect"])
    return InvalidExample(path, field, message, api_field, api_message)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "valid_example" in metafunc.fixturenames:
        metafunc.parametrize("valid_example", VALID_EXAMPLES, ids=[p.stem for p in VALID_EXAMPLES])
    if "invalid_example" in metafunc.fixturenames:
        items = [read_invalid_example(p) for p in INVALID_EXAMPLES]
        metafunc.parametrize("invalid_example", items, ids=[p.stem for p in INVALID_EXAMPLES])


def load_training(path: Path) -> FSDPTraining:
    return FSDPTraining.model_validate(yaml.safe_load(path.read_text()))


@pytest.fixture
def training_from() -> Callable[[Path], FSDPTraining]:
    return load_training


@pytest.fixture
def invalid_examples() -> list[InvalidExample]:
    """All examples/invalid files, for tests about the set as a whole."""
    return [read_invalid_example(p) for p in INVALID_EXAMPLES]
