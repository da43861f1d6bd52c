"""A DCP checkpoint of a sharded run exports to a Hugging Face directory that
``transformers`` loads and that computes the trained model's logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fsdp_trainer.__main__ import main as cli
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.trainer.harness import SMALL_MODEL, ParityRuns

pytestmark = pytest.mark.slow


def test_exported_model_loads_and_reproduces_the_trained_logits(parity_runs: ParityRuns, tmp_path: Path) -> None:
    run = parity_runs.get("full")
    out = tmp_path / "hf"
    # The checkpoint root: export picks the newest complete checkpoint (step 20).
    assert cli(["export", "--checkpoint", str(run.workdir / "checkpoints"), "--output", str(out)]) == 0

    config = json.loads((out / "config.json").read_text())
    assert config["hidden_size"] == SMALL_MODEL["hiddenSize"]
    assert config["num_hidden_layers"] == SMALL_MODEL["numLayers"]
    assert config["tie_word_embeddings"] is True
    assert (out / "model.safetensors").is_file()

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    probe = torch.load(run.trace_dir / "probe.pt")
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"]).logits
    torch.testing.assert_close(logits, probe["logits"], atol=1e-5, rtol=1e-5)

    # The trainer's tokenizer travels with the model.
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("w1 w2 w3")["input_ids"] == [5, 6, 7]
    assert tokenizer.eos_token == "<eos>"


def test_export_of_a_directory_without_a_complete_checkpoint_is_a_clear_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "step-00000010.tmp-abc").mkdir()
    assert cli(["export", "--checkpoint", str(tmp_path), "--output", str(tmp_path / "out")]) == 2
    assert "--checkpoint:" in capsys.readouterr().err


@pytest.mark.parametrize("existing", ["model directory", "file"])
def test_export_never_overwrites_an_existing_output(tmp_path: Path, capsys, existing: str) -> None:
    """A LoRA run's model.pretrained base given as --output by mistake is left as it was (issue 24, 12)."""
    out = tmp_path / "base"
    if existing == "file":
        out.write_text("keep")
    else:
        out.mkdir()
        (out / "config.json").write_text("keep")
    assert cli(["export", "--checkpoint", str(tmp_path / "checkpoints"), "--output", str(out)]) == 2
    what = "a file" if existing == "file" else "a directory that is not empty"
    assert f"\n  --output: {out} is {what}; export never overwrites" in capsys.readouterr().err
    assert (out if existing == "file" else out / "config.json").read_text() == "keep"


def test_export_fills_an_empty_output_directory(tmp_path: Path, capsys) -> None:
    """An empty directory is fine (a mounted volume often is one): the next error is about the checkpoint."""
    (tmp_path / "out").mkdir()
    assert cli(["export", "--checkpoint", str(tmp_path / "none"), "--output", str(tmp_path / "out")]) == 2
    assert "--checkpoint:" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--checkpoint", "--output"])
def test_a_url_of_a_store_the_trainer_does_not_read_is_one_line_not_a_local_path(
    tmp_path: Path, capsys, flag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gs:// is no directory named "gs:": it is refused before anything is read or written."""
    monkeypatch.chdir(tmp_path)
    args = {"--checkpoint": str(tmp_path / "none"), "--output": str(tmp_path / "out"), flag: "gs://bucket/run"}
    assert cli(["export", *(part for pair in args.items() for part in pair)]) == 2
    err = capsys.readouterr().err
    assert f"\n  {flag}: 'gs://bucket/run': is not a location of a store the trainer reads (s3://)\n" in err
    assert list(tmp_path.iterdir()) == []


def test_export_skips_a_damaged_newest_checkpoint_as_resume_does(
    parity_runs: ParityRuns, tmp_path: Path, capsys
) -> None:
    """Issue 24: the trainer fell back past a damaged newest checkpoint, export stopped with a traceback."""
    import shutil

    run = parity_runs.get("full")
    root = shutil.copytree(run.workdir / "checkpoints", tmp_path / "checkpoints")
    newest = max(p for p in root.iterdir() if p.name.startswith("step-"))
    damaged = shutil.copytree(newest, root / "step-99999999")
    for shard in damaged.glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 3])

    out = tmp_path / "hf"
    assert cli(["export", "--checkpoint", str(root), "--output", str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    probe = torch.load(run.trace_dir / "probe.pt")
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=probe["input_ids"]).logits, probe["logits"], atol=1e-5, rtol=1e-5)

    # Named alone, the damaged one is one line, and no output is left behind.
    capsys.readouterr()
    assert cli(["export", "--checkpoint", str(damaged), "--output", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fsdp-train: --checkpoint: nothing under {damaged} can be loaded: step-99999999: "), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "none").exists()
