"""The client's offline half: the same verdicts as the CLI, typed read-backs, the CLI's status table, the notebook."""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest
import yaml
from fsdp_api import FSDPTraining
from fsdp_k8s import Client, InvalidTraining, MemoryWarning, TrainerMetrics, Training, load_training
from fsdp_operator.cli import main
from fsdp_operator.cluster_cli import status_text
from fsdp_operator.render import render

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "fsdptraining-tiny.yaml"


def test_an_invalid_file_gets_the_lines_validate_prints(capsys: pytest.CaptureFixture[str], invalid_example) -> None:
    assert main(["validate", "-f", str(invalid_example.path), "--memory", "off"]) == 1
    printed = [line.removeprefix("error: ") for line in capsys.readouterr().err.splitlines()]
    with pytest.raises(InvalidTraining) as refused:
        Client().validate(invalid_example.path, memory="off")
    # One document, so the CLI prints the problems alone: the same lines, word for word.
    assert refused.value.problems == printed


def test_a_plan_that_does_not_fit_warns_or_refuses() -> None:
    body = yaml.safe_load(TINY.read_text())
    body["spec"]["model"] = {"preset": "llama3.1-70b"}
    body["spec"]["resources"] = {"nodes": 1, "gpusPerNode": 1, "instanceTypes": ["g5.xlarge"]}
    client = Client()
    assert client.plan(body).fits is False
    with pytest.warns(MemoryWarning, match="FSDPTraining 'tiny': does not fit"):
        client.validate(body)
    with pytest.raises(InvalidTraining, match="does not fit"):
        client.validate(body, memory="refuse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert client.validate(body, memory="off").spec.model.preset == "llama3.1-70b"


def test_render_is_the_operators_render() -> None:
    model = FSDPTraining.model_validate(yaml.safe_load(TINY.read_text()))
    assert Client().render(TINY) == render(model)


def test_a_model_is_sent_with_only_what_was_set() -> None:
    model = FSDPTraining.model_validate(yaml.safe_load(TINY.read_text()))
    _, body = load_training(model)
    assert (body["apiVersion"], body["kind"], body["metadata"]) == (
        "training.fsdp.dev/v1alpha1",
        "FSDPTraining",
        {"name": "tiny"},
    )
    assert body["spec"] == yaml.safe_load(TINY.read_text())["spec"]  # no defaults added: the API server adds them
    assert FSDPTraining.model_validate(body) == model


def test_a_missing_file_is_one_line() -> None:
    with pytest.raises(InvalidTraining, match=r"^cannot read /nonexistent.yaml: No such file or directory$"):
        Client().validate("/nonexistent.yaml")


def test_metrics_come_from_the_lowest_rank_with_a_finite_value() -> None:
    m = TrainerMetrics.parse(
        'fsdp_train_loss{node_rank="0",local_rank="0"} NaN\n'
        'fsdp_train_loss{node_rank="1",local_rank="0"} 2.5\n'
        'fsdp_train_step{node_rank="1",local_rank="0"} 8\n'
        'fsdp_train_step{node_rank="0",local_rank="1"} 9\n'
        'fsdp_train_step{node_rank="0",local_rank="0"} 9\n'
    )
    assert (m.loss, m.step, m.tokens_per_second) == (2.5, 9, None)
    assert m.as_dict() == {"fsdp_train_loss": 2.5, "fsdp_train_step": 9.0}


def running(**status: object) -> Training:
    body = yaml.safe_load(TINY.read_text())
    body["metadata"]["namespace"] = "team"
    body["status"] = status
    return Training.of(body)


def test_the_status_table_reads_like_kubectl_describe() -> None:
    t = running(
        phase="Running",
        step=120,
        loss=2.25,
        progressPercentage=40,
        remaining="3m00s",
        jobName="tiny",
        nodes=1,
        gpus=0,
        checkpoint={"dir": "/checkpoints", "ephemeral": False, "lastStep": 100},
        trackerRuns={"mlflow": "http://mlflow/#/experiments/1/runs/abc"},
        router={"layer": "3", "maxLoadRatio": 2.0, "unusedExpertsRatio": 0.625, "collapsed": True},
        conditions=[
            {"type": "Created", "status": "True", "reason": "Created", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {
                "type": "FitsMemory",
                "status": "True",
                "reason": "Fits",
                "message": "about 1.2 GiB per GPU",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ],
    )
    assert status_text(t).splitlines() == [
        "team/tiny: Running | step 120/300 | loss 2.2500 | 3m00s left",
        "  progress:   40%, 3m00s left",
        "  job:        PyTorchJob tiny (1 nodes, 0 GPUs)",
        "  checkpoint: /checkpoints, last step 100",
        "  router:     layer 3: most-loaded expert 2x the mean, 62% of experts without a token (collapsed)",
        "  mlflow:     http://mlflow/#/experiments/1/runs/abc",
        "",
        "CONDITION   STATUS  REASON   MESSAGE",
        "Created     True    Created",
        "FitsMemory  True    Fits     about 1.2 GiB per GPU",
    ]


def test_an_ephemeral_pending_training_says_so() -> None:
    t = running(phase="Queued", message="waiting for quota", checkpoint={"dir": "/checkpoints", "ephemeral": True})
    assert status_text(t).splitlines() == [
        "team/tiny: Queued | waiting for quota",
        "  checkpoint: /checkpoints (ephemeral: lost with the pods)",
    ]


def test_the_cluster_commands_without_a_kubeconfig_are_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for command in (["status", "x"], ["logs", "x", "--rank", "1"], ["watch", "x"]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: no kubeconfig") and err.count("\n") == 1, err


def test_the_notebook_calls_only_what_the_client_has() -> None:
    notebook = json.loads((REPO / "examples" / "client.ipynb").read_text())
    code = [("".join(c["source"])) for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code, "the notebook has no code"
    called = set()
    for source in code:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "client":
                called.add(node.attr)
    assert called and all(callable(getattr(Client, name, None)) for name in called), called
    assert {"plan", "validate", "submit", "wait", "logs", "delete"} <= called
