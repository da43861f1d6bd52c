"""Launching the real trainer (torchrun on CPU, gloo) on tiny, fully controlled inputs.

The inputs are built offline in the test: a word-level tokenizer saved as a
Hugging Face tokenizer directory (so ``AutoTokenizer`` loads it from a local
path, as it would a hub snapshot) and jsonl documents over its words.
"Aligned" documents are exactly one packed window long, which makes the
global batch identical for any world size (each window is one document), so a
sharded run can be compared step by step with a single process. The
parity runs (``ParityRuns``, one per sharding variant in ``VARIANTS``) are
launched on first use and shared by the tests that read them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from fsdp_api.contract import ENV_TRAINER_FAULT
from fsdp_api.launch import torchrun_standalone, trainer_program
from fsdp_api.local_process import local_env
from fsdp_trainer.parallel.distributed import WorldInfo
from fsdp_trainer.trace import read_trace

from tests.trainer.warm_launch import RANK_ENTRY, warm_launcher

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
    """A local launch's environment (CPU, one thread per rank), with no hub access and no fault injected."""
    env = local_env(1, threads=1)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop(ENV_TRAINER_FAULT, None)
    env.update(extra or {})
    return env


def warm_torchrun(nproc: int, entry: Path, args: list[str], *, max_restarts: int | None = None) -> list[str]:
    """torchrun's arguments for a warm launch: the standalone launch, its ranks forked, ``entry`` run in them."""
    options = torchrun_standalone(nproc, [], max_restarts=max_restarts)[3:]
    return [*options, "--start-method", "fork", "--run-path", str(entry), *args]


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
    trainer = trainer_program(config_path, "--trace-dir", str(trace_dir), *(args or []))
    launch_env = offline_env(env)
    launcher = warm_launcher(launch_env, offline_env())
    if launcher is not None:
        # The same torchrun and trainer, forked from a process that imported them once (warm_launch.py).
        trainer_args = trainer[2:]  # after "-m fsdp_trainer"
        if nproc is None:
            argv = trainer_args
        else:
            argv = warm_torchrun(nproc, RANK_ENTRY, trainer_args, max_restarts=max_restarts)
        try:
            returncode, output = launcher.run(
                argv, torchrun=nproc is not None, env=launch_env, cwd=workdir, timeout=timeout
            )
        except TimeoutError as e:
            raise AssertionError(f"trainer still running after {timeout}s:\n{str(e)[-30000:]}") from None
        return RunResult(returncode, output, workdir, trace_dir)
    if nproc is None:
        cmd = [sys.executable, *trainer]
    else:
        cmd = torchrun_standalone(nproc, trainer, max_restarts=max_restarts)
    returncode, output = run_cold(cmd, env=launch_env, cwd=workdir, timeout=timeout, what="trainer")
    return RunResult(returncode, output, workdir, trace_dir)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it.

    Its own process group is not enough: torchrun starts each worker in a session
    of its own, and a worker left alive keeps the output pipe open (the test would
    then wait on it for ever).
    """
    parent_of: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent_of[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    tree, frontier = [pid], [pid]
    while frontier:
        below = frontier.pop()
        children = [child for child, parent in parent_of.items() if parent == below]
        tree += children
        frontier += children
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def run_cold(cmd: list[str], *, env: dict[str, str], cwd: Path, timeout: float, what: str) -> tuple[int, str]:
    """``cmd`` as a fresh process; its exit code and output (stdout and stderr together)."""
    # Own session, so a timeout can kill torchrun's workers too, not only torchrun.
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        output, _ = proc.communicate()
        raise AssertionError(f"{what} still running after {timeout}s:\n{output[-6000:]}") from None
    return proc.returncode, output


def run_script(script: Path, args: list[str], *, cwd: Path, nproc: int = 2, timeout: float = 300) -> tuple[int, str]:
    """A test's own rank script under torchrun (``nproc`` ranks, the offline environment); exit code and output.

    Warm where it can be (warm_launch.py: the ranks fork from a process that
    has imported torch and the trainer), cold otherwise, as ``launch``.
    """
    env = offline_env()
    launcher = warm_launcher(env, env)
    if launcher is not None:
        argv = warm_torchrun(nproc, script, args)
        try:
            return launcher.run(argv, torchrun=True, env=env, cwd=cwd, timeout=timeout)
        except TimeoutError as e:
            raise AssertionError(f"{script.name} still running after {timeout}s:\n{str(e)[-6000:]}") from None
    cmd = torchrun_standalone(nproc, [str(script), *args])
    return run_cold(cmd, env=env, cwd=cwd, timeout=timeout, what=script.name)


def cpu_world(world_size: int = 2, local_world_size: int = 2) -> WorldInfo:
    """A place in a CPU job, for the checks that run before any process group."""
    return WorldInfo(
        rank=0,
        world_size=world_size,
        local_rank=0,
        local_world_size=local_world_size,
        node_rank=0,
        num_nodes=max(1, world_size // local_world_size),
        device=torch.device("cpu"),
        backend="gloo",
    )


# Sharding variants compared with the single-process reference: the FSDP
# section, plus training overrides. The global batch is always 8 windows:
# 2 ranks x micro batch 2 x 2 accumulation steps (the reference: 1 x 4 x 2).
VARIANTS: dict[str, dict[str, dict]] = {
    "full": {"fsdp": {"shardingStrategy": "full"}},
    "shard_grad_op": {"fsdp": {"shardingStrategy": "shard_grad_op"}},
    "no_shard": {"fsdp": {"shardingStrategy": "no_shard"}},
    "hybrid_2x1": {"fsdp": {"shardingStrategy": "hybrid", "shardGroupSize": 1}},
    "hybrid_1x2": {"fsdp": {"shardingStrategy": "hybrid", "shardGroupSize": 2}},
    "full_ac_prefetch": {
        "fsdp": {"shardingStrategy": "full", "prefetch": 1},
        "training": {"activationCheckpointing": "selective"},
    },
    "full_ac_op": {"fsdp": {"shardingStrategy": "full"}, "training": {"activationCheckpointing": "op"}},
}


class ParityRuns:
    """20-step runs on the aligned data, launched on first use and shared by the tests."""

    def __init__(self, root: Path, inputs: dict[str, Path]) -> None:
        self.root, self.inputs = root, inputs
        self._done: dict[str, RunResult] = {}

    def config(self, name: str) -> dict:
        variant = VARIANTS.get(name, {})
        training = {
            "microBatchSize": 4 if name == "reference" else 2,
            "gradAccumSteps": 2,
            "evalIntervalSteps": 10,
            "evalSteps": 2,
            **variant.get("training", {}),
        }
        return base_config(
            self.root / name,
            self.inputs["aligned"],
            self.inputs["tokenizer"],
            training=training,
            fsdp=variant.get("fsdp", {}),
            checkpoint={"intervalSteps": 10},
        )

    def get(self, name: str) -> RunResult:
        if name not in self._done:
            nproc = None if name == "reference" else 2
            self._done[name] = launch(self.root / name, self.config(name), nproc=nproc).check()
        return self._done[name]
