"""The spec package's seams: one module per concern, the backend rules in one place, the trainer config derived."""

from __future__ import annotations

import importlib
import pkgutil
import re
import typing
from pathlib import Path

import pytest
from fsdp_api import spec
from fsdp_api.base import ApiModel
from fsdp_api.spec import FSDPTrainingSpec, check_update
from fsdp_api.spec.backend_rules import (
    TRAINJOB_FROZEN_RULE,
    TRAINJOB_MAX_NAME_LENGTH,
    TRAINJOB_NAME_LENGTH_MESSAGE,
    backend_name_error,
)
from fsdp_api.trainer_config import REQUIRED_SECTIONS, SECTIONS, TrainerConfig

PACKAGE = Path(spec.__file__).parent
# A comparison of the backend name, in Python or in CEL.
BACKEND_COMPARISON = re.compile(r"backend\s*[!=]=|(TRAINJOB|PYTORCHJOB)\.name")


def _modules() -> list[str]:
    return [m.name for m in pkgutil.iter_modules([str(PACKAGE)])]


def test_every_model_of_a_module_is_exported_by_the_package() -> None:
    # fsdp_operator.crd finds a $ref's class (and so its rules) among the package's names.
    for name in _modules():
        module = importlib.import_module(f"fsdp_api.spec.{name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, ApiModel) and obj.__module__ == module.__name__:
                assert getattr(spec, obj.__name__) is obj, f"fsdp_api.spec does not export {obj.__name__}"


def test_the_backend_name_is_compared_only_in_backend_rules() -> None:
    found = [
        f"{path.name}:{n}"
        for path in sorted(PACKAGE.glob("*.py"))
        if path.name != "backend_rules.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if BACKEND_COMPARISON.search(line)
    ]
    assert found == []
    assert BACKEND_COMPARISON.search((PACKAGE / "backend_rules.py").read_text())


@pytest.mark.parametrize("name", sorted(p.name for p in PACKAGE.glob("*.py")))
def test_no_module_of_the_package_is_over_500_lines(name: str) -> None:
    assert len((PACKAGE / name).read_text().splitlines()) <= 500


def _spec(**extra: object) -> FSDPTrainingSpec:
    body = {"image": "trainer:1.0", "model": {"preset": "tiny"}, "training": {"maxSteps": 10}, **extra}
    return FSDPTrainingSpec.model_validate(body)


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
def test_only_a_trainjob_freezes_the_fields_of_its_trainer(backend: str) -> None:
    old = _spec(backend=backend)
    new = _spec(backend=backend, image="trainer:2.0")
    frozen = f"spec: {TRAINJOB_FROZEN_RULE.message}"
    assert (frozen in check_update(old, new)) == (backend == "trainjob")
    assert check_update(old, _spec(backend=backend)) == []


def test_only_a_trainjob_shortens_the_name() -> None:
    name = "a" * (TRAINJOB_MAX_NAME_LENGTH + 1)
    assert backend_name_error(name, "trainjob") == TRAINJOB_NAME_LENGTH_MESSAGE
    assert backend_name_error(name[:-1], "trainjob") is None
    assert backend_name_error(name, "pytorchjob") is None


def test_the_trainer_config_takes_its_sections_from_the_spec() -> None:
    assert tuple(TrainerConfig.model_fields) == ("job", *SECTIONS)
    for name in SECTIONS:
        ours, theirs = TrainerConfig.model_fields[name], FSDPTrainingSpec.model_fields[name]
        assert ours.description == theirs.description
        if name in REQUIRED_SECTIONS:
            assert ours.is_required()
            assert typing.get_args(theirs.annotation) == (ours.annotation, type(None))
        else:
            assert (ours.default, ours.default_factory) == (theirs.default, theirs.default_factory)
            assert ours.annotation == theirs.annotation


def test_a_trainer_config_needs_model_and_training() -> None:
    with pytest.raises(ValueError, match="Field required"):
        TrainerConfig.model_validate({"training": {"maxSteps": 1}})
    with pytest.raises(ValueError, match="Field required"):
        TrainerConfig.model_validate({"model": {"preset": "tiny"}})
