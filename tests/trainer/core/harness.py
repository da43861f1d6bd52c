"""Launching the real trainer (torchrun on CPU, gloo) on tiny, fully controlled inputs.

The inputs are built offline in the test: a word-level tokenizer saved as a
Hugging Face tokenizer directory (so ``AutoTokenizer`` loads it from a local
path, as it would a hub snapshot) and jsonl documents over its words.
"Aligned" documents are exactly one packed window long, which makes the
global batch identical for any world size (each window is one document), so a
sharded run can be compared step by step with a single process.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from fsdp_trainer.trace import read_trace

NUM_WORDS = 200
SEQ_LEN = 32
# The tiny preset shrunk to milliseconds per step; the vocabulary covers the
# word tokenizer (200 words + 4 specials).
SMALL_MODEL = {
    "hiddenSize": 64,
    "numLayers": 2,
    "numHeads": 4,
    "numKeyValueHeads": 2,
    "intermediateSize": 128,
    "vocabSize": 256,
    "maxSeqLen": 128,
}
SPECIALS = ["<bos>", "<eos>", "<pad>", "<unk>"]


def build_word_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + [f"w{i}" for i in range(NUM_WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(path)
    return path


def _words(rng: random.Random, n: int) -> str:
    # A learnable pattern (runs of consecutive words) so the loss visibly falls.
    start = rng.randrange(NUM_WORDS)
    return " ".join(f"w{(start + i * rng.choice((1, 1, 1, 2))) % NUM_WORDS}" for i in range(n))


def write_aligned_jsonl(path: Path, num_docs: int, seq_len: int = SEQ_LEN, seed: int = 0) -> Path:
    """Documents of exactly ``seq_len - 1`` words: with bos and eos, one window each."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(num_docs):
            f.write(json.dumps({"text": _words(rng, seq_len - 1)}) + "\n")
    return path


def write_ragged_jsonl(path: Path, num_docs: int, seed: int = 1) -> Path:
    """Documents of 3..90 words: windows span documents and end mid-document."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(num_docs):
            f.write(json.dumps({"text": _words(rng, rng.randint(3, 90))}) + "\n")
    return path


def base_config(workdir: Path, data_path: Path, tokenizer: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "job": {"name": "core-test"},
        "model": {"preset": "tiny", "config": dict(SMALL_MODEL)},
        "data": {"path": str(data_path), "tokenizer": str(tokenizer)},
        "training": {
            "maxSteps": 20,
            "seqLen": SEQ_LEN,
            "microBatchSize": 2,
            "gradAccumSteps": 1,
            "learningRate": 3e-3,
            "warmupSteps": 2,
            "precision": "fp32",
            "logIntervalSteps": 5,
            "seed": 7,
        },
        "checkpoint": {"dir": str(workdir / "checkpoints"), "intervalSteps": 1000, "keepLast": 3},
        "metrics": {"enabled": False},
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


@dataclass
class RunResult:
    returncode: int
    output: str
    workdir: Path
    trace_dir: Path

    def trace(self, rank: int = 0) -> list[dict[str, Any]]:
        return read_trace(self.trace_dir / f"trace-rank{rank}.jsonl")

    def events(self, event: str, rank: int = 0) -> list[dict[str, Any]]:
        return [r for r in self.trace(rank) if r["event"] == event]

    def losses(self, rank: int = 0) -> dict[int, float]:
        """Loss per step; a step trained twice (before and after a restart) keeps the last."""
        return {r["step"]: r["loss"] for r in self.events("step", rank)}

    def check(self) -> RunResult:
        assert self.returncode == 0, f"trainer failed ({self.returncode}):\n{self.output[-6000:]}"
        return self


def offline_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("FSDP_TRAINER_FAULT", None)
    env.update(extra or {})
    return env


def launch(
    workdir: Path,
    config: dict[str, Any],
    *,
    nproc: int | None = 2,
    env: dict[str, str] | None = None,
    max_restarts: int = 0,
    args: list[str] | None = None,
    timeout: float = 300,
) -> RunResult:
    """Run the trainer to completion: ``nproc`` ranks under torchrun, or (None) one plain process."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "train.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    trace_dir = workdir / "trace"
    trainer = ["-m", "fsdp_trainer", "--config", str(config_path), "--trace-dir", str(trace_dir), *(args or [])]
    if nproc is None:
        cmd = [sys.executable, *trainer]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--max-restarts",
            str(max_restarts),
            *trainer,
        ]
    # Own session, so a timeout can kill torchrun's workers too, not only torchrun.
    proc = subprocess.Popen(
        cmd,
        env=offline_env(env),
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise AssertionError(f"trainer still running after {timeout}s:\n{output[-6000:]}") from None
    return RunResult(proc.returncode, output, workdir, trace_dir)
