"""Generate the FSDPTraining CustomResourceDefinition from the pydantic models.

pydantic's JSON schema is close to, but not, a Kubernetes structural schema:
it uses ``$ref``, ``anyOf`` with ``null`` for optional fields, numeric
``exclusiveMinimum`` and ``additionalProperties: false``. This module rewrites
it into what the API server accepts and adds the CEL rules declared on the
models, so the CRD can never drift from the Python validation.
"""

from __future__ import annotations

from typing import Any

import yaml
from fsdp_api import spec as spec_mod
from fsdp_api import status as status_mod
from fsdp_api.base import ApiModel
from fsdp_api.contract import GROUP, KIND, PLURAL, VERSION
from fsdp_api.rules import immutable
from fsdp_api.spec import IMMUTABLE_FIELDS, ROOT_RULES, TRAINJOB_FROZEN_RULE, FSDPTrainingSpec, immutable_rule
from fsdp_api.status import FSDPTrainingStatus
from pydantic import BaseModel

Schema = dict[str, Any]

SHORT_NAMES = ["fsdp", "fsdpt"]

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Summary of the job's state."},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.resources.nodes", "description": "Nodes requested."},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus", "description": "GPUs requested in total."},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step", "description": "Latest optimizer step."},
    {"name": "Loss", "type": "number", "jsonPath": ".status.loss", "description": "Latest training loss."},
    {
        "name": "Done%",
        "type": "integer",
        "jsonPath": ".status.progressPercentage",
        "description": "Share of maxSteps trained.",
    },
    {
        "name": "Remaining",
        "type": "string",
        "jsonPath": ".status.remaining",
        "description": "Estimated training time left.",
    },
    {
        "name": "Tokens/s",
        "type": "number",
        "jsonPath": ".status.tokensPerSecond",
        "description": "Global training throughput.",
        "priority": 1,
    },
    {
        "name": "TP",
        "type": "integer",
        "jsonPath": ".spec.parallelism.tensor",
        "description": "Tensor-parallel degree (parallelism.tensor).",
        "priority": 1,
    },
    {
        "name": "CP",
        "type": "integer",
        "jsonPath": ".spec.parallelism.context",
        "description": "Context-parallel degree (parallelism.context).",
        "priority": 1,
    },
    {
        "name": "EP",
        "type": "integer",
        "jsonPath": ".spec.parallelism.expert",
        "description": "Expert-parallel degree (parallelism.expert).",
        "priority": 1,
    },
    {
        "name": "PP",
        "type": "integer",
        "jsonPath": ".spec.parallelism.pipeline",
        "description": "Pipeline stages (parallelism.pipeline).",
        "priority": 1,
    },
    {
        "name": "Backend",
        "type": "string",
        "jsonPath": ".spec.backend",
        "description": "What runs the pods: pytorchjob or trainjob.",
        "priority": 1,
    },
    {"name": "Job", "type": "string", "jsonPath": ".status.jobName", "description": "The job's name.", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _model_classes() -> dict[str, type[BaseModel]]:
    classes: dict[str, type[BaseModel]] = {}
    for module in (spec_mod, status_mod):
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, ApiModel) and obj is not ApiModel:
                classes[obj.__name__] = obj
    return classes


def _presence_rules(owner: type[BaseModel] | None, node: Schema) -> list[dict[str, Any]]:
    """Immutability of optional fields: setting or clearing one is a change too.

    A field's own ``self == oldSelf`` rule only runs when the old and the new
    object both have the field, so for a field without a default (which may be
    absent) the parent object also checks that presence did not change.
    """
    if owner not in IMMUTABLE_FIELDS:
        return []
    prefix, fields = IMMUTABLE_FIELDS[owner]
    out = []
    for field in fields:
        prop = node["properties"].get(field, {})
        if field in node.get("required", ()) or "default" in prop:
            continue
        out.append(
            {
                "rule": f"has(self.{field}) == has(oldSelf.{field})",
                "message": immutable(f"{prefix}.{field}").message,
                "fieldPath": f".{field}",
                "reason": "FieldValueInvalid",
            }
        )
    return out


class _Converter:
    def __init__(self, defs: dict[str, Schema]) -> None:
        self.defs = defs
        self.classes = _model_classes()

    def convert(self, node: Schema, owner: type[BaseModel] | None = None) -> Schema:
        node = dict(node)
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            resolved = self.convert(self.defs[name], self.classes.get(name))
            # The field's own description and default win over the class's.
            return {**resolved, **{k: v for k, v in node.items() if k in ("description", "default")}}
        if "anyOf" in node:
            branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
            if len(branches) == 1:
                inner = self.convert(branches[0], owner)
                return {**inner, **self._scalar_keys(node, inner)}
            types = sorted(b.get("type") for b in branches)
            if types == ["integer", "string"] or node.get("x-kubernetes-int-or-string"):
                # int-or-string (resource quantities): the API server's one sanctioned anyOf.
                out = {k: v for k, v in node.items() if k not in ("title",)}
                out["x-kubernetes-int-or-string"] = True
                out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
                return out
            raise ValueError(f"unsupported anyOf in schema: {branches}")
        node.pop("title", None)
        node.pop("additionalProperties", None) if node.get("additionalProperties") is False else None
        if "exclusiveMinimum" in node:
            node["minimum"] = node.pop("exclusiveMinimum")
            node["exclusiveMinimum"] = True
        if "exclusiveMaximum" in node:
            node["maximum"] = node.pop("exclusiveMaximum")
            node["exclusiveMaximum"] = True
        if node.get("type") == "object" and "properties" in node:
            node["properties"] = self._properties(node["properties"], owner)
            rules = [r.to_crd() for r in getattr(owner, "rules", ())] + _presence_rules(owner, node)
            if owner is FSDPTrainingSpec:
                rules.append({"rule": TRAINJOB_FROZEN_RULE.cel, "message": TRAINJOB_FROZEN_RULE.message})
            if rules:
                node["x-kubernetes-validations"] = rules
        if isinstance(node.get("additionalProperties"), dict):
            node["additionalProperties"] = self.convert(node["additionalProperties"])
        if node.get("type") == "array" and "items" in node:
            node["items"] = self.convert(node["items"])
        if "default" in node and node["default"] is None:
            node.pop("default")
        return node

    @staticmethod
    def _scalar_keys(outer: Schema, inner: Schema) -> Schema:
        keep = {k: v for k, v in outer.items() if k in ("description", "default") and v is not None}
        if "x-kubernetes-int-or-string" in inner:
            keep.pop("default", None)
        return keep

    def _properties(self, props: dict[str, Schema], owner: type[BaseModel] | None) -> dict[str, Schema]:
        out = {}
        fields_by_alias = {}
        if owner is not None:
            fields_by_alias = {(f.alias or name): f for name, f in owner.model_fields.items()}
        for key, value in props.items():
            prop = self.convert(value)
            field = fields_by_alias.get(key)
            if field is not None and field.default_factory is not None:
                produced = field.get_default(call_default_factory=True)
                # Nested defaults only apply when the parent object exists, so
                # a section the user omits defaults to {} and is filled in.
                if isinstance(produced, BaseModel):
                    prop["default"] = {}
            if owner is not None:
                rule = immutable_rule(owner, key)
                if rule is not None:
                    prop.setdefault("x-kubernetes-validations", []).append({"rule": rule.cel, "message": rule.message})
            out[key] = prop
        return out


def _schema_of(model: type[BaseModel]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation", ref_template="#/$defs/{model}")
    defs = raw.pop("$defs", {})
    return _Converter(defs).convert(raw, model)


def open_api_schema() -> Schema:
    return {
        "type": "object",
        "description": (
            "FSDPTraining runs a PyTorch FSDP2 training job as a Kubeflow PyTorchJob or Trainer v2 TrainJob "
            "on Karpenter GPU nodes."
        ),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object: training.fsdp.dev/v1alpha1."},
            "kind": {"type": "string", "description": "Kind of this object: FSDPTraining."},
            # Declaring metadata.name makes the root rules' fieldPath valid, so
            # the API server's error names the field; maxLength bounds their cost.
            # The API server forbids any other keyword on metadata (even a description).
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 253, "description": "Name of the FSDPTraining."},
                },
            },
            "spec": _schema_of(FSDPTrainingSpec),
            "status": _schema_of(FSDPTrainingStatus),
        },
        "x-kubernetes-validations": [dict(r) for r in ROOT_RULES],
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": SHORT_NAMES,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }


def crd_yaml() -> str:
    return yaml.safe_dump(crd(), sort_keys=False, width=10_000)
