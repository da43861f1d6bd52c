"""The generated CRD: committed copy up to date, a structural schema, names and columns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from fsdp_api.spec import IMMUTABLE_FIELDS, ROOT_RULES, FSDPTrainingSpec
from fsdp_operator.crd import crd, crd_yaml

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "kustomize" / "crd" / "training.fsdp.dev_fsdptrainings.yaml"

Schema = dict[str, Any]


def schema() -> Schema:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    yield path, node
    for key, prop in node.get("properties", {}).items():
        yield from walk(prop, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_up_to_date() -> None:
    assert COMMITTED.read_text() == crd_yaml(), (
        f"{COMMITTED.relative_to(REPO)} is stale: run `make crd` and commit the result"
    )


def test_kustomization_installs_the_crd() -> None:
    kustomization = yaml.safe_load((COMMITTED.parent / "kustomization.yaml").read_text())
    assert COMMITTED.name in kustomization["resources"]


def test_schema_is_structural() -> None:
    nodes = list(walk(schema()))
    assert len(nodes) > 80
    for path, node in nodes:
        assert "$ref" not in node and "$defs" not in node, path
        assert "nullable" not in node, path
        assert node.get("type") != "null", path
        assert "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, path
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        for key in ("oneOf", "allOf", "not"):
            assert key not in node, path


def test_every_property_has_a_description() -> None:
    # metadata is the API server's: it forbids any keyword there but name/generateName.
    missing = [p or "<root>" for p, node in walk(schema()) if not node.get("description") and p != ".metadata"]
    assert missing == []


def test_names_scope_and_subresources() -> None:
    spec = crd()["spec"]
    assert crd()["metadata"]["name"] == "fsdptrainings.training.fsdp.dev"
    assert spec["group"] == "training.fsdp.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "FSDPTraining",
        "listKind": "FSDPTrainingList",
        "plural": "fsdptrainings",
        "singular": "fsdptraining",
        "shortNames": ["fsdp", "fsdpt"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def _resolve(json_path: str) -> Schema | None:
    node: Schema | None = {"properties": {**schema()["properties"], "metadata": {"type": "object"}}}
    for part in json_path.lstrip(".").split("."):
        if node is None or (part == "creationTimestamp" and node.get("type") == "object"):
            return {"type": "string"}
        node = node.get("properties", {}).get(part)
    return node


def test_printer_columns_point_at_fields_of_their_type() -> None:
    columns = crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    names = [c["name"] for c in columns]
    assert names == [
        "Phase",
        "Nodes",
        "GPUs",
        "Step",
        "Loss",
        "Done%",
        "Remaining",
        "Tokens/s",
        "TP",
        "CP",
        "EP",
        "PP",
        "Backend",
        "Job",
        "Age",
    ]
    for c in columns:
        target = _resolve(c["jsonPath"])
        assert target is not None, f"{c['name']}: {c['jsonPath']} is not in the schema"
        if c["type"] != "date":
            assert target["type"] == c["type"], c
    wide = {c["name"] for c in columns if c.get("priority", 0) > 0}
    assert wide == {"Tokens/s", "TP", "CP", "EP", "PP", "Backend", "Job"}


def test_cel_rules_of_the_models_are_in_the_schema() -> None:
    crd_rules = {
        (r["rule"], r["message"]) for _, node in walk(schema()) for r in node.get("x-kubernetes-validations", [])
    }
    for r in FSDPTrainingSpec.rules:
        assert (r.cel, r.message) in crd_rules, r.message
    for r in ROOT_RULES:
        assert (r["rule"], r["message"]) in crd_rules
    # Root rules name metadata.name, which therefore must be declared.
    assert schema()["properties"]["metadata"]["properties"]["name"]["type"] == "string"


def test_immutable_fields_carry_a_transition_rule() -> None:
    nodes = dict(walk(schema()))
    expected = [f".{prefix}.{field}" for prefix, fields in IMMUTABLE_FIELDS.values() for field in fields]
    assert len(expected) == 18
    for path in expected:
        rules = nodes[path].get("x-kubernetes-validations", [])
        assert any(r["rule"] == "self == oldSelf" and "is immutable" in r["message"] for r in rules), path
    mutable = nodes[".spec.training.maxSteps"].get("x-kubernetes-validations", [])
    assert not any("oldSelf" in r["rule"] for r in mutable)


def test_optional_immutable_fields_cannot_be_set_or_cleared() -> None:
    """``self == oldSelf`` skips a field absent on either side; its parent checks presence."""
    nodes = dict(walk(schema()))
    for parent, field in ((".spec.training", "seqLen"), (".spec.checkpoint", "claimName"), (".spec", "peft")):
        rules = nodes[parent]["x-kubernetes-validations"]
        (rule,) = [r for r in rules if "oldSelf" in r["rule"] and r.get("fieldPath") == f".{field}"]
        assert rule["rule"] == f"has(self.{field}) == has(oldSelf.{field})"
        assert rule["fieldPath"] == f".{field}"
        assert rule["message"].startswith(f"spec{parent.removeprefix('.spec')}.{field} is immutable")
    # data/fsdp/resources/pod default to {}: always present, their own rule suffices; model, peft,
    # command and args (optional, no default) are the fields of spec whose presence the spec itself checks.
    presence = [
        r["rule"]
        for r in nodes[".spec"]["x-kubernetes-validations"]
        if r["rule"].startswith("has(self.") and "oldSelf" in r["rule"]
    ]
    assert presence == [f"has(self.{f}) == has(oldSelf.{f})" for f in ("model", "peft", "command", "args")]
