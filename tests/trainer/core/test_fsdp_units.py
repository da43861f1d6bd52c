"""Small pure pieces: schedule, mesh mapping, launch environment, checkpoint
discovery, the embedded corpus and tokenizer, reference resolution."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fsdp_api.spec import FSDPSpec
from fsdp_trainer import datafiles
from fsdp_trainer.checkpoint import MARKER, complete_checkpoints, latest_checkpoint, remove_stale
from fsdp_trainer.corpus import build_documents_cleanly, embedded_documents
from fsdp_trainer.distributed import mesh_shape, world_from_env
from fsdp_trainer.hub import local_path
from fsdp_trainer.optim import lr_factor
from fsdp_trainer.tokenizer import ASSET_DIR, EMBEDDED_VOCAB_SIZE, build_bpe_tokenizer


def test_schedule_warms_up_then_decays_to_the_floor() -> None:
    f = [lr_factor(s, warmup_steps=10, max_steps=110, min_ratio=0.1) for s in range(110)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0)
    assert f[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 50 / 99)))
    assert f[109] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(f[10:]))
    assert lr_factor(0, warmup_steps=0, max_steps=5, min_ratio=0.0) == 1.0


@pytest.mark.parametrize(
    ("fsdp", "world", "local", "expected"),
    [
        ({"shardingStrategy": "full"}, 16, 8, ((16,), ("shard",))),
        ({"shardingStrategy": "shard_grad_op"}, 16, 8, ((16,), ("shard",))),
        ({"shardingStrategy": "no_shard"}, 16, 8, ((16, 1), ("replicate", "shard"))),
        ({"shardingStrategy": "hybrid"}, 16, 8, ((2, 8), ("replicate", "shard"))),
        ({"shardingStrategy": "hybrid", "shardGroupSize": 4}, 16, 8, ((4, 4), ("replicate", "shard"))),
    ],
)
def test_mesh_for_each_strategy(fsdp: dict, world: int, local: int, expected: tuple) -> None:
    assert mesh_shape(FSDPSpec.model_validate(fsdp), world, local) == expected


def test_world_from_torchrun_kubeflow_and_nothing() -> None:
    torchrun = {"RANK": "11", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1"}
    w = world_from_env(torchrun, use_cuda=False)
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size, w.node_rank, w.num_nodes) == (11, 16, 3, 8, 1, 2)
    assert w.backend == "gloo" and w.device == torch.device("cpu")
    # A PyTorchJob without torchrun: one process per pod, RANK is the pod index.
    w = world_from_env(
        {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0", "PET_NODE_RANK": "2"}, use_cuda=False
    )
    assert (w.rank, w.local_rank, w.local_world_size, w.node_rank, w.num_nodes) == (2, 0, 1, 2, 4)
    w = world_from_env({}, use_cuda=True)
    assert (w.rank, w.world_size) == (0, 1)
    assert w.device == torch.device("cuda", 0) and w.backend == "cuda:nccl,cpu:gloo"


def test_only_marked_final_directories_are_checkpoints(tmp_path: Path) -> None:
    for name, marked in [("step-00000010", True), ("step-00000020", True), ("step-00000030", False)]:
        (tmp_path / name).mkdir()
        if marked:
            (tmp_path / name / MARKER).write_text(json.dumps({"step": int(name[5:])}))
    (tmp_path / "step-00000040.tmp-1a2b").mkdir()
    (tmp_path / "step-00000040.tmp-1a2b" / MARKER).write_text("{}")  # marked, but never renamed
    (tmp_path / "notes").mkdir()
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [10, 20]
    assert latest_checkpoint(tmp_path) == (20, tmp_path / "step-00000020")
    assert remove_stale(tmp_path) == [tmp_path / "step-00000040.tmp-1a2b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step-00000010", "step-00000020", "step-00000030"]
    assert latest_checkpoint(tmp_path / "missing") is None


def test_embedded_corpus_is_prose_without_local_details() -> None:
    docs = embedded_documents()
    assert docs == build_documents_cleanly()  # the cache holds exactly what a fresh build gives
    text = "\n".join(docs)
    assert len(docs) > 300 and len(text) > 1_000_000
    assert sorted(len(d) for d in docs)[len(docs) // 2] <= 4000  # cut at paragraphs into ~4 kB documents
    assert "The " in text and "Return" in text
    for leak in (sys.prefix, sys.base_prefix, "environ(", " at 0x"):
        assert leak not in text


def test_shipped_tokenizer_is_the_embedded_bpe() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ASSET_DIR)
    assert len(tok) == EMBEDDED_VOCAB_SIZE
    assert (tok.bos_token, tok.eos_token) == ("<|begin_of_text|>", "<|end_of_text|>")
    sample = "Return a new list containing all items from the iterable in ascending order."
    ids = tok(sample, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == sample
    assert len(ids) < len(sample.split()) * 1.5  # merges learned from the corpus, not bytes


def test_bpe_builder_learns_a_vocabulary() -> None:
    docs = embedded_documents()[:40]
    tok = build_bpe_tokenizer(docs, vocab_size=600)
    assert len(tok) == 600
    text = docs[3][:300]
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: lossless
    assert len(tok(text)["input_ids"]) < len(text.encode()) / 2


def test_data_file_resolution(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "b.JSONL").write_text("{}\n")
    (tmp_path / "readme.md").write_text("x")
    assert datafiles.resolve(str(tmp_path)) == datafiles.DataFiles(
        "json", (str(tmp_path / "a.jsonl"), str(tmp_path / "b.JSONL"))
    )
    (tmp_path / "c.parquet").write_bytes(b"")
    with pytest.raises(datafiles.DataFilesError, match="mixes file formats"):
        datafiles.resolve(str(tmp_path))
    assert datafiles.resolve(str(tmp_path / "*.parquet")).builder == "parquet"


def test_local_paths_and_hub_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert local_path("meta-llama/Llama-3.2-1B") is None
    assert local_path("./meta-llama/Llama-3.2-1B") == Path("./meta-llama/Llama-3.2-1B")
    assert local_path("/models/llama") == Path("/models/llama")
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert local_path("org/model") == Path("org/model")  # an existing directory wins


def test_package_and_config_import_without_torch() -> None:
    """The operator image installs fsdp_trainer without torch."""
    code = (
        "import sys, fsdp_trainer, fsdp_trainer.config, fsdp_trainer.errors; "
        "assert 'torch' not in sys.modules, 'torch imported'; print(fsdp_trainer.__version__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.1.0"
