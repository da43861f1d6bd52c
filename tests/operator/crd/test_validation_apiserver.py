"""The CRD in a real kube-apiserver: examples and rendered objects accepted, bad ones rejected.

Every invalid example must be refused by the API server on the field pydantic
names, and for the CEL rules with the very message pydantic gives, so
``fsdp-operator validate`` and ``kubectl apply`` can never disagree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api import FSDPTraining, check_update, format_errors
from fsdp_api.contract import BACKENDS, TRAINJOB_RUNTIME
from fsdp_api.spec import TRAINJOB_FROZEN_RULE
from fsdp_operator.render import cluster_training_runtime, render
from pydantic import ValidationError

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
CRD_FILE = REPO / "kustomize" / "crd" / "training.fsdp.dev_fsdptrainings.yaml"
TINY = REPO / "examples" / "fsdptraining-tiny.yaml"
LLAMA = REPO / "examples" / "fsdptraining-llama3.2-1b.yaml"
NAMESPACE = "fsdp-api-validation"


@pytest.fixture(scope="module")
def api(cluster: Any) -> Any:
    """The test cluster with our CRD installed and the examples' namespaces created."""
    assert cluster.install_crds(CRD_FILE) == ["fsdptrainings.training.fsdp.dev"]
    for ns in (NAMESPACE, "training", "fsdp-training"):
        cluster.create_namespace(ns)
    return cluster


def dry_run(cluster: Any, manifest: str, namespace: str | None = None) -> Any:
    args = ["apply", "--dry-run=server", "--validate=strict", "-f", "-"]
    if namespace:
        args.append(f"--namespace={namespace}")
    return cluster.kubectl(*args, input=manifest, check=False)


def namespace_flag(body: dict[str, Any]) -> str | None:
    return None if body.get("metadata", {}).get("namespace") else NAMESPACE


# --- the CRD itself ---------------------------------------------------------------------


def test_crd_is_served_with_its_descriptions(api: Any) -> None:
    # The OpenAPI document behind `kubectl explain` is published shortly after the CRD.
    deadline = time.monotonic() + 60
    while True:
        res = api.kubectl("explain", "fsdptrainings.spec.training.maxSteps", check=False)
        if res.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert res.returncode == 0, res.stderr
    assert "Number of optimizer steps to train for." in res.stdout
    names = api.kubectl("api-resources", "--api-group=training.fsdp.dev", "-o", "wide").stdout
    assert "fsdp,fsdpt" in names


# --- valid examples -----------------------------------------------------------------------


def test_valid_example_and_its_rendered_objects_are_accepted(api: Any, valid_example: Path) -> None:
    body = yaml.safe_load(valid_example.read_text())
    res = dry_run(api, valid_example.read_text(), namespace_flag(body))
    assert res.returncode == 0, res.stderr
    assert "fsdptraining.training.fsdp.dev" in res.stdout

    training = FSDPTraining.model_validate(body)
    training.metadata.namespace = training.metadata.namespace or NAMESPACE
    training.metadata.uid = "8d4f2c51-7b0e-4c1a-9a57-2f8e3b6d1c90"
    objects = render(training, set_owner=True)
    res = dry_run(api, json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    assert res.returncode == 0, res.stderr
    created = {line.split()[0] for line in res.stdout.splitlines() if line.endswith("created (server dry run)")}
    # A script of your own (spec.command) has no trainer config.
    config = set() if training.spec.runs_own_script else {f"configmap/{training.name}-trainer"}
    assert created == config | {
        f"{training.spec.backend}.{BACKENDS[training.spec.backend].group}/{training.name}",
        f"podmonitor.monitoring.coreos.com/{training.name}",
        f"networkpolicy.networking.k8s.io/{training.name}",
    }


# --- invalid examples ---------------------------------------------------------------------


def rule_messages(body: dict[str, Any], field: str) -> list[str]:
    """Messages of the rules (CEL + Python, api/fsdp_api/rules.py) that pydantic reports on ``field``."""
    try:
        FSDPTraining.model_validate(body)
    except ValidationError as e:
        return [
            line.split(": ", 1)[1]
            for err, line in zip(e.errors(), format_errors(e), strict=True)
            if err["type"] == "fsdp_rule" and line.startswith(f"{field}: ")
        ]
    return []


def test_invalid_example_is_rejected_like_pydantic_rejects_it(api: Any, invalid_example: Any) -> None:
    res = dry_run(api, invalid_example.path.read_text(), NAMESPACE)
    assert res.returncode != 0, f"{invalid_example.path.name} was accepted:\n{res.stdout}"
    lines = [line for line in res.stderr.splitlines() if invalid_example.apiserver_field in line]
    assert any(invalid_example.apiserver_message in line for line in lines), res.stderr
    rules = rule_messages(invalid_example.body(), invalid_example.field)
    assert bool(rules) == invalid_example.path.name.startswith("cel-")
    if rules:
        # A rule: the API server's message is pydantic's, word for word.
        (message,) = rules
        assert any(f"{invalid_example.field}: Invalid value: {message}" in line for line in lines), (
            f"API server: {res.stderr}\npydantic: {message}"
        )


# --- updates ----------------------------------------------------------------------------


def apply(cluster: Any, body: dict[str, Any]) -> Any:
    return cluster.kubectl(
        "apply", "--server-side", "--field-manager=fsdp-api-tests", "-f", "-", input=json.dumps(body), check=False
    )


def test_immutable_fields_are_refused_and_mutable_ones_accepted(api: Any) -> None:
    original = yaml.safe_load(TINY.read_text())
    original["metadata"] = {"name": "immutability", "namespace": NAMESPACE}
    api.kubectl("delete", "fsdptraining", "immutability", f"--namespace={NAMESPACE}", "--ignore-not-found")
    created = apply(api, original)
    assert created.returncode == 0, created.stderr

    def changed(**edits: Any) -> dict[str, Any]:
        body = json.loads(json.dumps(original))
        for dotted, value in edits.items():
            node = body["spec"]
            *parents, leaf = dotted.split("__")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        return body

    old_spec = FSDPTraining.model_validate(original).spec
    for edits in (
        {"training__seqLen": 512},
        {"checkpoint__claimName": "late-pvc"},  # unset -> set is a change too
        {"model__preset": "llama3.2-1b", "training__seqLen": 256},
        {"resources__nodes": 2},
        {"fsdp__shardingStrategy": "no_shard"},
        {"peft__rank": 8},  # unset -> set: LoRA cannot be turned on under existing checkpoints
    ):
        new = changed(**edits)
        (expected,) = check_update(old_spec, FSDPTraining.model_validate(new).spec)
        path, message = expected.split(": ", 1)
        res = apply(api, new)
        assert res.returncode != 0, f"{edits} was accepted"
        assert f"{path}: Invalid value: " in res.stderr and message in res.stderr, res.stderr

    new = changed(suspend=True, training__maxSteps=500, training__learningRate=0.0005)
    assert check_update(old_spec, FSDPTraining.model_validate(new).spec) == []
    res = apply(api, new)
    assert res.returncode == 0, res.stderr
    stored = json.loads(
        api.kubectl("get", "fsdptraining", "immutability", f"--namespace={NAMESPACE}", "-o", "json").stdout
    )
    assert stored["spec"]["suspend"] is True
    assert stored["spec"]["training"]["maxSteps"] == 500
    # The API server filled in the model's defaults.
    assert stored["spec"]["fsdp"]["shardingStrategy"] == "full"
    assert stored["spec"]["metrics"] == {"enabled": True, "port": 9402}


def test_a_trainjob_trainings_trainer_fields_are_frozen_and_a_pytorchjobs_are_not(api: Any) -> None:
    """A TrainJob's spec.trainer is immutable: the fields rendered there cannot change with backend trainjob."""
    for backend in ("trainjob", "pytorchjob"):
        name = f"frozen-{backend}"
        original = yaml.safe_load(TINY.read_text())
        original["metadata"] = {"name": name, "namespace": NAMESPACE}
        original["spec"]["backend"] = backend
        api.kubectl("delete", "fsdptraining", name, f"--namespace={NAMESPACE}", "--ignore-not-found")
        assert apply(api, original).returncode == 0
        old_spec = FSDPTraining.model_validate(original).spec
        for edit in (
            {"image": "ghcr.io/fsdp-k8s/trainer:0.2.0"},
            {"env": [{"name": "X", "value": "1"}]},
            {"metrics": {"enabled": False}},
        ):
            new = {**original, "spec": {**original["spec"], **edit}}
            expected = check_update(old_spec, FSDPTraining.model_validate(new).spec)
            res = apply(api, new)
            if backend == "trainjob":
                assert expected == [f"spec: {TRAINJOB_FROZEN_RULE.message}"]
                assert res.returncode != 0, f"{edit} was accepted"
                assert TRAINJOB_FROZEN_RULE.message in res.stderr, res.stderr
            else:
                assert expected == []
                assert res.returncode == 0, res.stderr
                original = new
        # Mutable either way: the trainer config's fields and suspend.
        new = {**original, "spec": {**original["spec"], "suspend": True}}
        new["spec"]["training"] = {**original["spec"]["training"], "maxSteps": 500}
        assert check_update(old_spec, FSDPTraining.model_validate(new).spec) == []
        res = apply(api, new)
        assert res.returncode == 0, res.stderr


def test_the_cluster_training_runtime_is_accepted_by_trainer_v2s_crd(api: Any) -> None:
    res = dry_run(api, json.dumps(cluster_training_runtime()))
    assert res.returncode == 0, res.stderr
    assert f"clustertrainingruntime.trainer.kubeflow.org/{TRAINJOB_RUNTIME} created (server dry run)" in res.stdout


# --- pod security --------------------------------------------------------------------------


def trainer_pod(training: FSDPTraining, namespace: str) -> dict[str, Any]:
    job = render(training)[1]
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{training.name}-worker-0", "namespace": namespace, **template["metadata"]},
        "spec": {**template["spec"], "restartPolicy": "OnFailure"},
    }


def test_trainer_pods_meet_the_restricted_pod_security_standard_unless_efa(api: Any) -> None:
    """EFA's IPC_LOCK is outside even the baseline profile: its namespace must allow it."""
    for level in ("restricted", "baseline"):
        ns = f"fsdp-pss-{level}"
        api.create_namespace(ns)
        api.kubectl("label", "namespace", ns, f"pod-security.kubernetes.io/enforce={level}", "--overwrite")
    tiny = FSDPTraining.model_validate(yaml.safe_load(TINY.read_text()))
    res = dry_run(api, json.dumps(trainer_pod(tiny, "fsdp-pss-restricted")))
    assert res.returncode == 0, res.stderr

    llama = FSDPTraining.model_validate(yaml.safe_load(LLAMA.read_text()))
    res = dry_run(api, json.dumps(trainer_pod(llama, "fsdp-pss-baseline")))
    assert res.returncode != 0
    assert 'violates PodSecurity "baseline:latest"' in res.stderr
    assert "IPC_LOCK" in res.stderr


# --- numbers written the way kubectl reads them ----------------------------------------------

NUMBER_FORMS = """\
apiVersion: training.fsdp.dev/v1alpha1
kind: FSDPTraining
metadata:
  name: number-forms
spec:
  image: ghcr.io/fsdp-k8s/trainer:0.1.0
  model:
    preset: tiny
  training:
    maxSteps: 2.0e+2
    learningRate: 3e-4
    warmupSteps: 1e1
"""


def test_number_forms_read_alike_by_kubectl_and_validate(api: Any, tmp_path: Path) -> None:
    """``3e-4`` and ``2.0e+2``: go-yaml reads them as numbers (and 200.0 as the integer 200), so must we.

    With strict types, PyYAML's reading (``3e-4`` is a string) would make
    ``fsdp-operator validate`` refuse what ``kubectl apply`` accepts.
    """
    res = dry_run(api, NUMBER_FORMS, NAMESPACE)
    assert res.returncode == 0, res.stderr
    stored = json.loads(
        api.kubectl("apply", "--dry-run=server", "-o", "json", "-n", NAMESPACE, "-f", "-", input=NUMBER_FORMS).stdout
    )["spec"]["training"]
    from fsdp_api.documents import load_one

    path = tmp_path / "number-forms.yaml"
    path.write_text(NUMBER_FORMS)
    training = load_one(path).spec.training
    assert (stored["maxSteps"], stored["learningRate"], stored["warmupSteps"]) == (200, 0.0003, 10)
    assert (training.max_steps, training.learning_rate, training.warmup_steps) == (200, 0.0003, 10)


# --- pod values: what validate refuses is exactly what the API server refuses in a pod ---------------

_POD_VALUES = {
    # case: (where in a pod's spec and in spec.pod / spec.env, refused value, accepted value)
    "toleration-key": ("tolerations[0].key", "nvidia.com/gpu type", "nvidia.com/gpu"),
    "toleration-value": ("tolerations[0].value", "ml team", "ml-team"),
    "node-affinity-key": ("node-affinity.key", "-zone", "topology.kubernetes.io/zone"),
    "node-affinity-value": ("node-affinity.values[0]", "us-east-1a/b", "us-east-1a"),
    "topology-key": ("topologyKey", "kubernetes.io hostname", "kubernetes.io/hostname"),
    "env-field-path": ("fieldPath", "spec.hostname", "metadata.labels['app.kubernetes.io/name']"),
}


def _with_value(case: str, value: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(pod-level fields, env) carrying ``value`` where ``case`` says, as both a Pod and spec.pod take them."""
    if case.startswith("toleration"):
        toleration = (
            {"key": value, "operator": "Exists"} if case.endswith("key") else {"key": "dedicated", "value": value}
        )
        return {"tolerations": [toleration]}, []
    if case.startswith("node-affinity"):
        req = {"key": value, "operator": "Exists"} if case.endswith("key") else {
            "key": "topology.kubernetes.io/zone", "operator": "In", "values": [value]
        }  # fmt: skip
        terms = {"nodeSelectorTerms": [{"matchExpressions": [req]}]}
        return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}}, []
    if case == "topology-key":
        term = {"topologyKey": value, "labelSelector": {"matchLabels": {"app": "x"}}}
        return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}, []
    return {}, [{"name": "FIELD", "valueFrom": {"fieldRef": {"fieldPath": value}}}]


@pytest.mark.parametrize("case", sorted(_POD_VALUES))
def test_pod_values_are_refused_by_validate_exactly_when_a_pod_refuses_them(api: Any, case: str) -> None:
    """Before (issue 24, 11), validate and the CRD took values every pod create then failed on."""
    _, bad, good = _POD_VALUES[case]
    for value, accepted in ((bad, False), (good, True)):
        pod_fields, env = _with_value(case, value)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"values-{case}", "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "c", "image": "busybox:1", "env": env}], **pod_fields},
        }
        res = api.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
        assert (res.returncode == 0) == accepted, f"a pod with {value!r}: {res.stderr}"
        body = yaml.safe_load(TINY.read_text())
        body["metadata"]["namespace"] = NAMESPACE
        if pod_fields:
            body["spec"]["pod"] = pod_fields
        if env:
            body["spec"]["env"] = env
        try:
            FSDPTraining.model_validate(body)
            ours = True
        except ValidationError:
            ours = False
        assert ours == accepted, f"validate with {value!r}"
        assert (dry_run(api, yaml.safe_dump(body), NAMESPACE).returncode == 0) == accepted, f"the CRD with {value!r}"


# --- values at the edges of YAML and JSON: validate and the API server agree (issue 24) ---------------

_EDGE_HEAD = f"""apiVersion: training.fsdp.dev/v1alpha1
kind: FSDPTraining
metadata:
  name: edge
  namespace: {NAMESPACE}
spec:
  image: ghcr.io/fsdp-k8s/trainer:0.1.0
  model:
    preset: tiny
"""
_EDGES = {
    "grad-clip-inf": "  training:\n    maxSteps: 100\n    gradClipNorm: .inf\n",
    "grad-clip-nan": "  training:\n    maxSteps: 100\n    gradClipNorm: .nan\n",
    "max-steps-beyond-int64": "  training:\n    maxSteps: 99999999999999999999\n",
    "checkpoint-null": "  training:\n    maxSteps: 100\n  checkpoint: null\n",
    "training-null": "  training: null\n",
    "peft-null": "  training:\n    maxSteps: 100\n  peft: null\n",
    "env-value-null": "  training:\n    maxSteps: 100\n  env:\n  - name: A\n    value: null\n",
}


@pytest.mark.parametrize("case", sorted(_EDGES))
def test_edge_values_are_refused_or_accepted_alike_by_validate_and_the_api_server(
    api: Any, case: str, tmp_path: Path
) -> None:
    from fsdp_api.documents import load_one

    manifest = _EDGE_HEAD + _EDGES[case]
    res = dry_run(api, manifest, NAMESPACE)
    path = tmp_path / f"{case}.yaml"
    path.write_text(manifest)
    try:
        load_one(path)
        validate_error = None
    except Exception as e:  # whatever validate says: it must agree on accepting or refusing
        validate_error = str(e)
    assert (res.returncode == 0) == (validate_error is None), (res.stderr, validate_error)


_S3_REFERENCES = [
    "s3://models/qwen3/",
    "s3://my.models-1/team/.hidden/..dots",
    "s3://a..b/qwen3",
    "s3://10.0.0.12/qwen3",
    "s3://models//qwen3",
    "s3://models/team/../other",
    "s3://models/team/.",
    "s3://models/team\\\\qwen3",
    "s3://models/qwen3-*",
    "s3://Models/qwen3",
]


@pytest.mark.parametrize("uri", _S3_REFERENCES)
def test_s3_references_are_refused_alike_and_in_the_same_words_by_validate_and_the_api_server(
    api: Any, uri: str
) -> None:
    body = yaml.safe_load(_EDGE_HEAD)
    body["spec"]["model"] = {"pretrained": uri}
    body["spec"]["training"] = {"maxSteps": 100}
    res = dry_run(api, json.dumps(body), NAMESPACE)
    messages = rule_messages(body, "spec.model.pretrained")
    assert (res.returncode == 0) == (messages == []), (res.stderr, messages)
    for message in messages:
        assert f"spec.model.pretrained: Invalid value: {message}" in res.stderr, (res.stderr, message)
