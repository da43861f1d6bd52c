"""Fine-tune a T5 model with FSDP2: a training script of your own, run by an FSDPTraining's spec.command.

The kind of job the EKS workshop runs as a hand-written PyTorchJob (t5-small,
a seq2seq task, torchrun), small enough for a CPU: it teaches a T5 to turn
number words into digits ("digits: three hundred twelve" -> "312").

torchrun starts it on every rank, with the rendezvous the operator renders.
It reads what every pod gets (docs/your-own-script.md):

- $FSDP_CHECKPOINT_DIR: the checkpoint volume; it saves there and resumes
  from the newest complete checkpoint after a restart;
- $FSDP_METRICS_PORT: reported through fsdp_trainer.metrics.script, so that
  `kubectl get fsdp` shows the step and loss.

Settings come from its own arguments (spec.args). Without --model it builds
a small random T5 (nothing is downloaded); --model takes a directory saved
with save_pretrained (e.g. t5-small on the data volume).

Run it on your machine: torchrun --standalone --nproc-per-node 2 t5_finetune.py --steps 20
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsdp_trainer.metrics.script import ScriptMetrics
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForSeq2SeqLM, ByT5Tokenizer, T5Config, T5ForConditionalGeneration

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
DONE = "COMPLETE"


def words(n: int) -> str:
    """English words of 0 <= n < 1000."""
    out = []
    if n >= 100:
        out += [ONES[n // 100], "hundred"]
        n %= 100
        if n == 0:
            return " ".join(out)
    if n >= 20:
        out.append(TENS[n // 10] + ("-" + ONES[n % 10] if n % 10 else ""))
    elif n >= 10:
        out.append(TEENS[n - 10])
    else:
        out.append(ONES[n])
    return " ".join(out)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=16, help="examples per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--model", help="a T5 directory saved with save_pretrained; default: a small random T5")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def build_model(args: argparse.Namespace, tok: ByT5Tokenizer) -> torch.nn.Module:
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    if args.model:
        return AutoModelForSeq2SeqLM.from_pretrained(args.model)
    config = T5Config(
        vocab_size=len(tok),
        d_model=128,
        d_ff=256,
        d_kv=32,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=tok.pad_token_id,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return T5ForConditionalGeneration(config)


def shard(model: torch.nn.Module) -> None:
    """FSDP2: each encoder and decoder block is a unit, the root holds the shared embedding."""
    for block in [*model.encoder.block, *model.decoder.block]:
        fully_shard(block)
    fully_shard(model)


def batch(tok: ByT5Tokenizer, numbers: list[int]) -> dict[str, torch.Tensor]:
    enc = tok([f"digits: {words(n)}" for n in numbers], padding=True, return_tensors="pt")
    labels = tok([str(n) for n in numbers], padding=True, return_tensors="pt").input_ids
    labels[labels == tok.pad_token_id] = -100  # no loss on padding
    return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "labels": labels}


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    found = []
    for d in root.glob("step-*"):
        if (d / DONE).exists() and d.name.removeprefix("step-").isdigit():
            found.append((int(d.name.removeprefix("step-")), d))
    return sorted(found)


def save(root: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
    t0 = time.perf_counter()
    path = root / f"step-{step:08d}"
    model_state, opt_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": opt_state}, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        (path / DONE).write_text(f"{step}\n")  # written last: a checkpoint without it is incomplete
        for _, old in complete_checkpoints(root)[:-2]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return time.perf_counter() - t0


def resume(root: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    found = complete_checkpoints(root)
    if not found:
        return 0
    step, path = found[-1]
    model_state, opt_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": opt_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return step


def main() -> None:
    args = parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    tok = ByT5Tokenizer()
    model = build_model(args, tok)
    shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    root = Path(os.environ.get("FSDP_CHECKPOINT_DIR", "checkpoints"))
    root.mkdir(parents=True, exist_ok=True)
    metrics = ScriptMetrics(max_steps=args.steps)
    start = resume(root, model, opt)
    if start:
        metrics.checkpoint_loaded(start)
        if rank == 0:
            print(f"resumed from step {start}", flush=True)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    model.to(device)
    model.train()
    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        # The same numbers on every rank for a step, then each rank takes its own slice.
        pool = random.Random(args.seed * 100_003 + step).sample(range(1000), args.batch_size * world)
        inputs = {k: v.to(device) for k, v in batch(tok, pool[rank::world]).items()}
        loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        tokens = int(inputs["attention_mask"].sum()) + int((inputs["labels"] != -100).sum())
        metrics.step(step, loss=mean.item(), tokens=tokens, seconds=time.perf_counter() - t0)
        if rank == 0:
            print(f"step {step} | loss {mean.item():.4f}", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            seconds = save(root, step, model, opt)
            metrics.checkpoint_saved(step, seconds=seconds)
    metrics.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
