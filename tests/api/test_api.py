"""The pydantic API model: examples accepted or rejected with the right field and message, updates."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from fsdp_api import FSDPTraining, FSDPTrainingSpec, check_update, format_errors
from fsdp_api.base import ApiModel
from fsdp_api.spec import ROOT_RULES
from fsdp_operator.crd import open_api_schema
from pydantic import BaseModel, ValidationError

Example = Any  # conftest.InvalidExample (conftest is not importable by name in every import mode)


def errors_of(body: dict[str, Any]) -> list[str]:
    try:
        FSDPTraining.model_validate(body)
    except ValidationError as e:
        return format_errors(e, model=FSDPTraining)
    return []


def test_valid_examples_parse(valid_example: Path) -> None:
    body = yaml.safe_load(valid_example.read_text())
    assert errors_of(body) == []
    t = FSDPTraining.model_validate(body)
    # A round trip through the YAML names gives the same object.
    assert FSDPTraining.model_validate(t.model_dump(by_alias=True, exclude_none=True)) == t


def test_invalid_example_names_the_field_with_the_message(invalid_example: Example) -> None:
    lines = errors_of(invalid_example.body())
    assert lines, f"{invalid_example.path.name} was accepted"
    matching = [line for line in lines if line.startswith(f"{invalid_example.field}: ")]
    assert matching, f"no error for {invalid_example.field} in {lines}"
    assert any(invalid_example.message in line for line in matching), lines


def _spec_classes() -> list[type[ApiModel]]:
    seen: list[type[ApiModel]] = []

    def visit(cls: type[BaseModel]) -> None:
        if cls in seen or not issubclass(cls, ApiModel):
            return
        seen.append(cls)
        for field in cls.model_fields.values():
            for t in (field.annotation, *get_args(field.annotation)):
                for inner in (t, *get_args(t)):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        visit(inner)

    visit(FSDPTrainingSpec)
    return seen


def test_every_rule_has_an_invalid_example(invalid_examples: list[Example]) -> None:
    covered = {ex.message for ex in invalid_examples}
    messages = [r.message for cls in _spec_classes() for r in cls.rules] + [r["message"] for r in ROOT_RULES]
    assert len(messages) >= 15
    missing = [m for m in messages if not any(c in m for c in covered)]
    assert missing == [], "add an examples/invalid file for each of these rules"


def _enum_paths(node: dict[str, Any], path: str) -> list[str]:
    out = [path] if "enum" in node else []
    for key, prop in node.get("properties", {}).items():
        out += _enum_paths(prop, f"{path}.{key}")
    if "items" in node:
        out += _enum_paths(node["items"], f"{path}[0]")
    return out


def test_every_enum_has_an_invalid_example(invalid_examples: list[Example]) -> None:
    enums = _enum_paths(open_api_schema()["properties"]["spec"], "spec")
    assert "spec.training.precision" in enums
    covered = {ex.field for ex in invalid_examples if ex.path.name.startswith("enum-")}
    assert sorted(set(enums) - covered) == []


def test_invalid_examples_fail_for_one_reason_only(invalid_examples: list[Example]) -> None:
    """Each file breaks one rule; a second, unrelated error would hide a regression of the first."""
    for ex in invalid_examples:
        fields = {line.split(": ", 1)[0] for line in errors_of(ex.body())}
        assert fields == {ex.field}, f"{ex.path.name}: {fields}"


# --- updates -----------------------------------------------------------------------------


def tiny_spec(**changes: Any) -> FSDPTrainingSpec:
    body = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples/fsdptraining-tiny.yaml").read_text())
    spec = copy.deepcopy(body["spec"])
    for dotted, value in changes.items():
        node = spec
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return FSDPTrainingSpec.model_validate(spec)


IMMUTABILITY = (
    "is immutable: it cannot change on an existing job; delete and recreate the FSDPTraining "
    "(checkpoints on the PVC are kept)"
)


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"model__preset": "llama3.2-1b"}, "spec.model"),
        ({"resources__nodes": 2}, "spec.resources"),
        ({"fsdp__shardingStrategy": "no_shard"}, "spec.fsdp"),
        ({"data__streaming": True}, "spec.data"),
        ({"training__seqLen": 512}, "spec.training.seqLen"),
        ({"training__precision": "bf16"}, "spec.training.precision"),
        ({"training__microBatchSize": 16}, "spec.training.microBatchSize"),
        ({"checkpoint__claimName": "ckpt"}, "spec.checkpoint.claimName"),
        ({"checkpoint__dir": "/data/ckpt"}, "spec.checkpoint.dir"),
        # Turning LoRA on (or changing it) would make the checkpoints unloadable.
        ({"peft__rank": 8}, "spec.peft"),
    ],
)
def test_immutable_fields_are_refused_on_update(change: dict[str, Any], path: str) -> None:
    assert check_update(tiny_spec(), tiny_spec(**change)) == [f"{path}: {path} {IMMUTABILITY}"]


@pytest.mark.parametrize(
    "change",
    [
        {"suspend": True},
        {"training__maxSteps": 600},
        {"training__learningRate": 0.0001},
        {"checkpoint__intervalSteps": 50},
        {"metrics__port": 9500},
        {"image": "ghcr.io/fsdp-k8s/trainer:0.1.1"},
    ],
)
def test_mutable_fields_may_change(change: dict[str, Any]) -> None:
    assert check_update(tiny_spec(), tiny_spec(**change)) == []


def test_every_gpu_instance_type_has_an_efa_count() -> None:
    from fsdp_api.instance_types import EFA_INTERFACES, INSTANCE_TYPES

    assert EFA_INTERFACES.keys() == INSTANCE_TYPES.keys()


@pytest.mark.parametrize(
    ("types", "efa", "fits"),
    [
        (["p5.48xlarge"], 32, True),
        (["p5en.48xlarge"], 32, False),  # 16 interfaces
        (["p4d.24xlarge"], 4, True),
        (["p4d.24xlarge"], 5, False),
        (["p4d.24xlarge", "p5.48xlarge"], 32, True),  # Karpenter may pick the type that has them
        (["g5.8xlarge"], 1, True),
        (["g5.xlarge"], 1, False),  # no EFA below 8xlarge
        (["g5.xlarge", "x9.unknown"], 1, True),  # a type we do not know: not refused on a guess
        ([], 32, True),
        (["g5.xlarge"], 0, True),
    ],
)
def test_efa_per_node_beyond_every_instance_type_is_refused(types: list[str], efa: int, fits: bool) -> None:
    body = {"resources": {"gpusPerNode": 1, "efaPerNode": efa, "instanceTypes": types}}
    spec = {"image": "ghcr.io/fsdp-k8s/trainer:0.1.0", "model": {"preset": "tiny"}, "training": {"maxSteps": 10}}
    try:
        FSDPTraining.model_validate({"metadata": {"name": "t"}, "spec": {**spec, **body}})
        refused = []
    except ValidationError as e:
        refused = [line for line in format_errors(e) if "efaPerNode is more than" in line]
    assert (not refused) == fits, refused


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ("after_step:13", ("after_step", 13, 0, "kill")),
        ("after_step:5:1:hang", ("after_step", 5, 1, "hang")),
        ("during_save:10:0:sleep2.5", ("during_save", 10, 0, "sleep2.5")),
        ("during_save:4:3", ("during_save", 4, 3, "kill")),
        ("after_step:3:1:slow0.5", ("after_step", 3, 1, "slow0.5")),
    ],
)
def test_the_fault_hooks_grammar_reads_every_form_the_tests_use(value: str, fault: tuple) -> None:
    from fsdp_api.faults import parse_fault

    parsed = parse_fault(value)
    assert (parsed.point, parsed.step, parsed.rank, parsed.action) == fault


def test_a_slow_fault_acts_at_every_step_from_its_own_and_says_so() -> None:
    from fsdp_api.faults import parse_fault

    slow, once = parse_fault("after_step:3:1:slow0.5"), parse_fault("after_step:3:1:sleep2")
    assert (slow.persistent, slow.seconds(), once.persistent, once.seconds()) == (True, 0.5, False, 2.0)
    assert slow.describe() == (
        "rank 1 sleeps 0.5 s after step 3's update, before anything is saved, and at the same point of every "
        "later step, in the first attempt only"
    )


@pytest.mark.parametrize(
    "value", ["", "after_step", "after_step:x", "before_step:3", "after_step:3:0:explode", "after_step:3:"]
)
def test_a_malformed_fault_hook_is_refused_with_its_grammar(value: str) -> None:
    from fsdp_api.faults import parse_fault

    with pytest.raises(ValueError, match=r"is not <point>:<step>\[:<rank>\[:<action>\]\] with point after_step"):
        parse_fault(value)


def test_the_float8_refusal_names_the_listed_type_without_float8_tensor_cores_verbatim() -> None:
    """The message is built from user input: braces in it reach the user as written, not as a template."""
    spec = {
        "image": "trainer:test",
        "model": {"preset": "llama3.2-1b"},
        "training": {"maxSteps": 10, "precision": "float8"},
        "resources": {"gpusPerNode": 8, "instanceTypes": ["p5.48xlarge", "g{0}.xlarge", "p4d.24xlarge"]},
    }
    with pytest.raises(ValueError) as refused:
        FSDPTrainingSpec.model_validate(spec)
    (line,) = format_errors(refused.value)
    assert line == (
        "training.precision: training.precision float8 needs GPUs with float8 tensor cores and g{0}.xlarge is "
        "not a type whose GPU the operator knows (it lists only the ones checked against AWS documentation): "
        "list resources.instanceTypes, each one of p5.48xlarge, p5e.48xlarge, p5en.48xlarge (H100, H200)"
    )


@pytest.mark.parametrize(
    ("listed", "said"),
    [
        # A10G and A100: capability 8.6 and 8.0, no float8 tensor cores.
        ("g5.xlarge", "g5.xlarge has none"),
        ("p4d.24xlarge", "p4d.24xlarge has none"),
        # L4 (g6), L40S (g6e) and B200 (p6-b200) have them (capability 8.9 and later): not "has none".
        ("g6.xlarge", "g6.xlarge is not a type whose GPU the operator knows"),
        ("g6e.xlarge", "g6e.xlarge is not a type whose GPU the operator knows"),
        ("p6-b200.48xlarge", "p6-b200.48xlarge is not a type whose GPU the operator knows"),
    ],
)
def test_the_float8_refusal_says_has_none_only_of_a_gpu_known_to_have_none(listed: str, said: str) -> None:
    spec = {
        "image": "trainer:test",
        "model": {"preset": "llama3.2-1b"},
        "training": {"maxSteps": 10, "precision": "float8"},
        "resources": {"gpusPerNode": 1, "instanceTypes": ["p5.48xlarge", listed]},
    }
    with pytest.raises(ValueError) as refused:
        FSDPTrainingSpec.model_validate(spec)
    (line,) = format_errors(refused.value)
    assert f"float8 tensor cores and {said}" in line


def test_validate_words_missing_unknown_and_enum_errors_as_the_api_server_and_names_the_nearest() -> None:
    """`maxStep` for `maxSteps`, `bf61` for `bf16`: the API server's wording, and the name the user meant."""
    body = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples/fsdptraining-tiny.yaml").read_text())
    training = body["spec"]["training"]
    training["maxStep"] = training.pop("maxSteps")
    training["precision"] = "bf61"
    body["spec"]["env"] = [{"name": "A", "valeu": "1"}]
    body["spec"]["totallyNew"] = 1
    lines = sorted(errors_of(body))
    assert lines == [
        'spec.env[0].valeu: unknown field "spec.env[0].valeu"; did you mean "value"?',
        'spec.totallyNew: unknown field "spec.totallyNew"',  # nothing near: no guess
        'spec.training.maxStep: unknown field "spec.training.maxStep"; did you mean "maxSteps"?',
        "spec.training.maxSteps: Required value",
        'spec.training.precision: Unsupported value: "bf61": supported values: "bf16", "float8", "fp32"; '
        'did you mean "bf16"?',
    ]
