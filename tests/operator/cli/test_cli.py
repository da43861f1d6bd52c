"""``fsdp-operator``: crd, docs, validate, render, and the wiring of run / run-local."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_api import FSDPTraining
from fsdp_operator.cli import main
from fsdp_operator.crd import crd_yaml
from fsdp_operator.docs import api_reference
from fsdp_operator.render import render

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "fsdptraining-tiny.yaml"
LLAMA = REPO / "examples" / "fsdptraining-llama3.2-1b.yaml"
CONSOLE_SCRIPT = Path(sys.executable).parent / "fsdp-operator"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_crd_prints_the_generated_crd(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "crd")
    assert code == 0
    assert out == crd_yaml()
    assert yaml.safe_load(out)["kind"] == "CustomResourceDefinition"


def test_docs_match_the_committed_api_reference(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "docs")
    assert code == 0
    assert out == api_reference()
    assert (REPO / "docs" / "api-reference.md").read_text() == out, (
        "docs/api-reference.md is stale: run `fsdp-operator docs > docs/api-reference.md`"
    )
    for needle in ("### `spec.training`", "must be divisible by numHeads", "**Immutable**", "`llama3.1-70b`"):
        assert needle in out


# --- validate ---------------------------------------------------------------------------


def test_validate_accepts_the_valid_examples(capsys: pytest.CaptureFixture[str], valid_example: Path) -> None:
    code, out, err = run_cli(capsys, "validate", "-f", str(valid_example))
    assert code == 0
    # Success on stdout, like kubectl; stderr only notes and warnings.
    assert out.startswith(f"{valid_example}: FSDPTraining '") and out.endswith("' is valid\n"), out
    assert all(line.startswith(("note: ", "warning: ")) for line in err.splitlines()), err


def test_validate_rejects_each_invalid_example(capsys: pytest.CaptureFixture[str], invalid_example: Any) -> None:
    code, out, err = run_cli(capsys, "validate", "-f", str(invalid_example.path))
    assert (code, out) == (1, "")  # errors on stderr, like kubectl
    lines = err.splitlines()
    assert lines, err
    assert any(line.startswith(f"{invalid_example.field}: ") and invalid_example.message in line for line in lines), (
        lines
    )
    assert "Traceback" not in out + err


def test_validate_says_which_defaults_spec_env_replaces_and_what_the_fault_hook_will_do(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    body = yaml.safe_load(LLAMA.read_text())
    body["spec"]["env"] += [
        {"name": "NCCL_SOCKET_IFNAME", "value": "eth9"},
        {"name": "FI_PROVIDER", "value": "tcp"},
        {"name": "FSDP_TRAINER_FAULT", "value": "after_step:20:1:hang"},
    ]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run_cli(capsys, "validate", "-f", str(path), "--memory", "off")
    assert (code, out) == (0, f"{path}: FSDPTraining 'llama32-1b-c4' is valid\n")
    head = f"note: {path}: FSDPTraining 'llama32-1b-c4': "
    assert [line for line in err.splitlines() if line.startswith("note: ")] == [
        f"{head}spec.env[1]: NCCL_SOCKET_IFNAME='eth9' replaces the operator's default '^lo,docker'",
        f"{head}spec.env[2]: FI_PROVIDER='tcp' replaces the operator's default 'efa'",
        f"{head}spec.env[3]: FSDP_TRAINER_FAULT (a test hook) is set: rank 1 hangs after step 20's update, "
        "before anything is saved, in the first attempt only",
    ]
    # Without EFA interfaces FI_PROVIDER is the user's own variable, not a replaced default.
    body["spec"]["resources"]["efaPerNode"] = 0
    path.write_text(yaml.safe_dump(body))
    _, _, err = run_cli(capsys, "validate", "-f", str(path), "--memory", "off")
    assert "FI_PROVIDER" not in err and "NCCL_SOCKET_IFNAME='eth9'" in err


def test_validate_multi_document_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = yaml.safe_load(TINY.read_text())
    bad["metadata"]["name"] = "second"
    bad["spec"]["image"] = "trainer:latest"
    path = tmp_path / "two.yaml"
    path.write_text(TINY.read_text() + "---\n" + yaml.safe_dump(bad) + "---\n")
    code, out, err = run_cli(capsys, "validate", "-f", str(path))
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"# {path}: document 2 (second)",
        "spec.image: image must be pinned to a tag or digest, not :latest",
    ]
    path.write_text(TINY.read_text() + "---\n" + LLAMA.read_text())
    code, out, err = run_cli(capsys, "validate", "-f", str(path))
    assert (code, err) == (0, "")
    assert out.count("is valid") == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("spec:\n  image: [unclosed\n", "invalid YAML at line 3, column 1"),
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "kind 'ConfigMap' with apiVersion 'v1'"),
        ("apiVersion: training.fsdp.dev/v1beta1\nkind: FSDPTraining\n", "apiVersion 'training.fsdp.dev/v1beta1'"),
        ("- a\n- b\n", "expected a FSDPTraining mapping, got a list"),
        ("# only a comment\n", "no YAML documents"),
    ],
)
def test_validate_reports_bad_input_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(content)
    code, out, err = run_cli(capsys, "validate", "-f", str(path))
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert message in err


def test_validate_missing_or_binary_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "validate", "-f", str(tmp_path / "nope.yaml"))
    assert code == 1
    assert err == f"error: cannot read {tmp_path / 'nope.yaml'}: No such file or directory\n"
    (tmp_path / "model.bin").write_bytes(b"\x80\x81\xfe")
    code, _, err = run_cli(capsys, "validate", "-f", str(tmp_path / "model.bin"))
    assert code == 1
    assert err.startswith(f"error: cannot read {tmp_path / 'model.bin'}: not UTF-8 text")


def test_validate_reads_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(read=lambda: TINY.read_text()))
    code, out, _ = run_cli(capsys, "validate", "-f", "-")
    assert code == 0
    assert "'tiny' is valid" in out


# --- render -------------------------------------------------------------------------------


def test_render_prints_what_the_operator_creates(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "render", "-f", str(LLAMA))
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    training = FSDPTraining.model_validate(yaml.safe_load(LLAMA.read_text()))
    assert docs == render(training)
    assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob", "PodMonitor", "NetworkPolicy"]
    # train.yaml reads as YAML in the output, not as an escaped string.
    assert "train.yaml: |" in out
    assert "&id" not in out and "*id" not in out


def test_render_json_and_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "render", "-f", str(TINY), "-o", "json", "--namespace", "ml")
    assert code == 0
    doc = json.loads(out)
    assert (doc["apiVersion"], doc["kind"]) == ("v1", "List")
    assert [i["kind"] for i in doc["items"]] == ["ConfigMap", "PyTorchJob", "PodMonitor", "NetworkPolicy"]
    assert {i["metadata"]["namespace"] for i in doc["items"]} == {"ml"}
    assert "namespace: ml" in doc["items"][0]["data"]["train.yaml"]


def test_render_refuses_an_invalid_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "render", "-f", str(REPO / "examples/invalid/cel-hybrid-one-node.yaml"))
    assert (code, out) == (1, "")
    assert err == "spec.fsdp.shardingStrategy: hybrid sharding needs at least 2 nodes\n"


# --- run / run-local wiring ---------------------------------------------------------------


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def test_run_passes_its_arguments_to_the_operator(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    _fake_module(monkeypatch, "fsdp_operator.controller.main", run_operator=lambda **kw: calls.append(kw))
    code, _, _ = run_cli(
        capsys, "run", "-n", "a", "-n", "b", "--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "8081"
    )
    assert code == 0
    assert calls == [
        {
            "namespaces": ["a", "b"],
            "all_namespaces": False,
            "liveness_endpoint": "http://0.0.0.0:8080/healthz",
            "metrics_port": 8081,
            "peering_name": None,
            "standalone": False,
            "priority": None,
            "scrape_interval": None,
            "verbose": False,
        }
    ]
    calls.clear()
    run_cli(capsys, "run", "-A", "--peering", "p", "--standalone", "--priority", "100", "--scrape-interval", "0")
    assert calls[0]["all_namespaces"] is True and calls[0]["namespaces"] is None
    assert (calls[0]["peering_name"], calls[0]["standalone"], calls[0]["priority"]) == ("p", True, 100)
    assert calls[0]["scrape_interval"] == 0.0


def test_run_needs_exactly_one_scope(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["run"], ["run", "-n", "a", "-A"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "--all-namespaces" in capsys.readouterr().err


def test_run_local_delegates_to_the_launcher(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []

    def run_local(spec_file: Path, nproc: int, output_dir: Path | None, steps: int | None) -> int:
        calls.append((spec_file, nproc, output_dir, steps))
        return 0

    _fake_module(monkeypatch, "fsdp_operator.local", run_local=run_local)
    code, _, _ = run_cli(capsys, "run-local", "-f", str(TINY))
    assert code == 0
    assert calls == [(TINY, 2, None, None)]
    run_cli(capsys, "run-local", "-f", str(TINY), "--nproc", "3", "--output-dir", "/tmp/x", "--steps", "20")
    assert calls[-1] == (TINY, 3, Path("/tmp/x"), 20)
    # An invalid file never reaches the trainer.
    code, _, err = run_cli(capsys, "run-local", "-f", str(REPO / "examples/invalid/cel-image-latest.yaml"))
    assert code == 1 and len(calls) == 2
    assert "spec.image: image must be pinned" in err


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["run-local", "-f", str(TINY), "--nproc", "0"], ["render", "-f", str(TINY), "-o", "xml"], []):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2


def test_console_script_reports_user_errors_without_a_traceback() -> None:
    """The installed entry point, end to end: exit status and message, never a traceback."""
    res = subprocess.run(
        [str(CONSOLE_SCRIPT), "validate", "-f", str(REPO / "examples/invalid/cel-image-latest.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == "spec.image: image must be pinned to a tag or digest, not :latest\n"


def test_a_document_without_a_name_is_one_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = yaml.safe_load(TINY.read_text())
    del doc["metadata"]["name"]
    path = tmp_path / "unnamed.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = run_cli(capsys, "validate", "-f", str(path))
    assert (code, out, err) == (1, "", "metadata.name: Required value: name or generateName is required\n")
    # generateName is how `kubectl create` names objects: that is a valid document.
    doc["metadata"]["generateName"] = "tiny-"
    path.write_text(yaml.safe_dump(doc))
    code, out, _ = run_cli(capsys, "validate", "-f", str(path))
    assert code == 0 and "FSDPTraining 'tiny-*' is valid" in out


@pytest.mark.parametrize("opening", ["[", "{a: "])
def test_yaml_nested_thousands_deep_is_one_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, opening: str
) -> None:
    closing = {"[": "]", "{a: ": "}"}[opening]
    depth = 50_000
    header = TINY.read_text().replace("spec:", "spec:\n  data: " + opening * depth + "1" + closing * depth, 1)
    path = tmp_path / "deep.yaml"
    path.write_text(header)
    code, out, err = run_cli(capsys, "validate", "-f", str(path))
    assert code == 1
    assert "Traceback" not in out + err
    assert len((out + err).strip().splitlines()) == 1, out + err


def _training_with(tmp_path: Path, model: dict[str, Any], training: dict[str, Any]) -> Path:
    doc = {
        "apiVersion": "training.fsdp.dev/v1alpha1",
        "kind": "FSDPTraining",
        "metadata": {"name": "local-model"},
        "spec": {"image": "ghcr.io/example/trainer:1.0", "model": model, "training": training},
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_validate_reads_a_local_model_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model_dir = tmp_path / "qwen"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 512}))
    file = _training_with(tmp_path, {"pretrained": str(model_dir)}, {"maxSteps": 10, "seqLen": 1024})
    code, _, err = run_cli(capsys, "validate", "-f", str(file))
    assert code == 1
    assert err.splitlines() == [
        f"{file}: spec.training.seqLen: 1024 exceeds the model's maximum sequence length 512",
        f"{file}: spec.model.pretrained: {model_dir} has no *.safetensors weights",
    ]
    # As an architecture (random init) it needs no weights; within the maximum it is valid.
    file = _training_with(tmp_path, {"architecture": str(model_dir)}, {"maxSteps": 10, "seqLen": 512})
    assert run_cli(capsys, "validate", "-f", str(file))[0] == 0
    (model_dir / "config.json").write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True}))
    code, _, err = run_cli(capsys, "validate", "-f", str(file))
    assert (code, err.strip()) == (
        1,
        f"{file}: spec.model.architecture: t5 is an encoder-decoder model, not a decoder-only causal LM",
    )


def test_validate_leaves_hub_ids_and_pod_paths_to_the_trainer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for ref in ("Qwen/Qwen2.5-0.5B", "/models/not-on-this-machine"):
        file = _training_with(tmp_path, {"pretrained": ref}, {"maxSteps": 10})
        assert run_cli(capsys, "validate", "-f", str(file))[0] == 0


def test_validate_warns_of_an_instance_type_it_does_not_know_and_names_the_nearest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A typo (`p5.48xlarg`) passes the API (Karpenter may know newer types): a warning, not an error."""
    body = yaml.safe_load(LLAMA.read_text())
    body["spec"]["resources"]["instanceTypes"] = ["p5.48xlarge", "p5.48xlarg", "x9.huge"]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run_cli(capsys, "validate", "-f", str(path), "--memory", "off")
    assert (code, out) == (0, f"{path}: FSDPTraining 'llama32-1b-c4' is valid\n")
    head = f"warning: {path}: FSDPTraining 'llama32-1b-c4': spec.resources.instanceTypes"
    unchecked = "is not an instance type the operator knows, so its GPUs, memory and EFA interfaces are not checked"
    assert [line for line in err.splitlines() if line.startswith("warning: ")] == [
        f"{head}[1]: 'p5.48xlarg' {unchecked}; did you mean 'p5.48xlarge'?",
        f"{head}[2]: 'x9.huge' {unchecked}",
    ]
