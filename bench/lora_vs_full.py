"""LoRA against full fine-tuning of the same pretrained model: tokens/s, memory, checkpoints.

CPU (what `make bench` runs): a Qwen2-shaped model of about 25M parameters
(hidden 512, 8 layers, tied embeddings; random weights saved with
transformers' ``save_pretrained`` as the "pretrained" base, the embedded
tokenizer beside them), 2 gloo ranks, seqLen 256, the embedded corpus. Each
repeat runs full fine-tuning, then LoRA (rank 16 on every projection),
alternating so background load hits both alike. Reported per run:

- steady-state tokens/s (the trainer's summary line: wall clock after the
  first 3 steps) and the ratio LoRA / full;
- rank 0's peak RSS (CPU; the summary line) and each rank's exact bytes of
  parameter shards and optimizer state (the trace's memory event);
- the checkpoint's size on disk and the seconds the loop was blocked saving it
  (the trace's checkpoint events: the mean over the run's saves).

    python bench/lora_vs_full.py [--steps 30] [--repeats 2] [--rank 16]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import yaml
from fsdp_api.launch import torchrun_standalone, trainer_program
from fsdp_api.local_process import local_env
from fsdp_trainer.metrics.logline import PEAK_MEMORY_PATTERN, SUMMARY_PATTERN

REPO = Path(__file__).resolve().parents[1]

TOKENIZER = REPO / "trainer" / "fsdp_trainer" / "assets" / "tokenizer"
BASE = {
    "vocab_size": 4160,  # the embedded tokenizer (4097 tokens), rounded up to a multiple of 64
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}
SEQ_LEN, MICRO_BATCH, NPROC = 256, 2, 2


def build_base(path: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **BASE)).save_pretrained(path)
    for file in TOKENIZER.iterdir():
        shutil.copy(file, path / file.name)
    return path


def config(base: Path, workdir: Path, steps: int, rank: int | None) -> dict:
    cfg = {
        "job": {"name": "bench-lora", "namespace": "bench"},
        "model": {"pretrained": str(base)},
        "training": {
            "maxSteps": steps,
            "seqLen": SEQ_LEN,
            "microBatchSize": MICRO_BATCH,
            "precision": "fp32",
            "learningRate": 2e-4 if rank else 2e-5,
            "logIntervalSteps": 10,
        },
        "checkpoint": {"dir": str(workdir / "checkpoints"), "intervalSteps": 10, "resume": "never"},
        "metrics": {"enabled": False},
    }
    if rank:
        cfg["peft"] = {"rank": rank}
    return cfg


def run(base: Path, workdir: Path, steps: int, rank: int | None, tag: str) -> dict:
    work = workdir / tag
    work.mkdir(parents=True)
    path = work / "train.yaml"
    path.write_text(yaml.safe_dump(config(base, work, steps, rank), sort_keys=False))
    trace = work / "trace"
    cmd = torchrun_standalone(NPROC, trainer_program(path, "--trace-dir", str(trace)))
    done = subprocess.run(cmd, env=local_env(NPROC, threads=1), capture_output=True, text=True, check=False)
    (workdir / f"{tag}.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{tag} exited {done.returncode}; output in {workdir / f'{tag}.log'}")
    m = SUMMARY_PATTERN.search(done.stdout)
    mem = PEAK_MEMORY_PATTERN.search(m[0]) if m else None
    events = [json.loads(line) for line in (trace / "trace-rank0.jsonl").read_text().splitlines()]
    memory = [next(e for e in _events(trace, r) if e["event"] == "memory") for r in range(NPROC)]
    saves = [e for e in events if e["event"] == "checkpoint"]
    start = next(e for e in events if e["event"] == "start")
    tokens = int(m["n"]) * SEQ_LEN * MICRO_BATCH * NPROC
    shutil.rmtree(work)
    return {
        "tokens_per_s": tokens / float(m["seconds"]),
        "peak_rss": mem["mem"] if mem else "",
        "param_bytes": max(x["param_bytes"] for x in memory),
        "optim_bytes": max(x["optim_bytes"] for x in memory),
        "checkpoint_bytes": saves[-1]["bytes"],
        "save_seconds": statistics.mean(e["seconds"] for e in saves),
        "trainable": start["trainable_params"],
        "params": start["num_params"],
    }


def _events(trace: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (trace / f"trace-rank{rank}.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    base = build_base(workdir / "base")
    results: dict[str, list[dict]] = {"full": [], "lora": []}
    for i in range(args.repeats):
        results["full"].append(run(base, workdir, args.steps, None, f"full-{i}"))
        results["lora"].append(run(base, workdir, args.steps, args.rank, f"lora-{i}"))
    rows = []
    for key, label in (
        ("tokens_per_s", "tokens/s (2 ranks)"),
        ("optim_bytes", "optimizer state bytes per rank"),
        ("param_bytes", "parameter bytes per rank"),
        ("checkpoint_bytes", "checkpoint bytes"),
        ("save_seconds", "save seconds (mean)"),
    ):
        full = statistics.median(r[key] for r in results["full"])
        lora = statistics.median(r[key] for r in results["lora"])
        rows.append((label, full, lora, lora / full))
    print(
        f"model: {results['full'][0]['params']:,} parameters; LoRA rank {args.rank}: "
        f"{results['lora'][0]['trainable']:,} trainable"
    )
    print(f"{'':34} {'full':>14} {'LoRA':>14} {'LoRA/full':>10}")
    for label, full, lora, ratio in rows:
        print(f"{label:34} {full:>14,.3f} {lora:>14,.3f} {ratio:>10.3f}")
    print(
        "peak RSS rank 0: full",
        [r["peak_rss"] for r in results["full"]],
        "LoRA",
        [r["peak_rss"] for r in results["lora"]],
    )
    out = REPO / "runs" / "bench-lora.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"per-run figures in {out}")
    shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
