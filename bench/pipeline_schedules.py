"""Pipeline schedules on this machine's CPU: the idle share of a step, measured, against the schedule's own count.

One untied Llama-shaped model (hidden 256, 8 layers, vocabulary 4096, random
weights) trains on micro-batches of 2 rows of 256 tokens: first in one
process (every layer, the micro-batches one after another: the work of a
step, T1), then split into 2 stages on 2 gloo ranks with the trainer's own
stage models (``fsdp_trainer.parallel.pipeline``) and each schedule of
``parallelism.pipelineSchedule`` (Tp). With the work shared evenly a stage
would take T1 / 2; what it takes beyond that is the step's idle share,
``1 - T1 / (2 Tp)``: the bubble, and the activations' sends. The count a
schedule implies is ``(p - 1) / (m + p - 1)`` for p stages and m
micro-batches. Prints a Markdown table for docs/benchmarks.md.

    python bench/pipeline_schedules.py [--steps 6] [--micro-batches 2 4 8] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

SHAPE = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "use_cache": False,
}
DRY = {**SHAPE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256}
ROWS, SEQ = 2, 256
SCHEDULES = ("1F1B", "GPipe")


def _model(shape: dict[str, object], device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **shape))


def _batches(m: int, vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (ROWS, SEQ), generator=g) for _ in range(m)]


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def one_process(shape: dict[str, object], m: int, steps: int) -> float:
    """Seconds per step of every layer on one process (after one warm-up step)."""
    model = _model(shape)
    batches = _batches(m, int(shape["vocab_size"]))  # type: ignore[call-overload]
    times = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        for ids in batches:
            _loss(model(input_ids=ids).logits, ids).backward()
        if step:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def stage_worker(shape: dict[str, object], m: int, steps: int, out: Path) -> None:
    """One rank of the 2-stage runs (under torchrun): median seconds per step of each schedule, written by rank 0."""
    import torch.distributed as dist
    from fsdp_trainer.parallel.pipeline import StageForward, stage_model, stage_of
    from fsdp_trainer.step.pipeline import SCHEDULES as BY_NAME
    from torch.distributed.pipelining import PipelineStage

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    full = _model(shape)
    meta = _model(shape, "meta")
    stage = stage_of(meta, rank, world)
    part = stage_model(meta, stage)
    part.to_empty(device="cpu")
    part.load_state_dict({k: v for k, v in full.state_dict().items() if k in part.state_dict()}, strict=False)
    for name, buffer in full.named_buffers():  # rotary tables: not in the state dict
        if name in dict(part.named_buffers()):
            part.get_buffer(name).copy_(buffer)
    StageForward(part, stage).install()
    batches = _batches(m, int(shape["vocab_size"]))  # type: ignore[call-overload]
    seconds = {}
    for schedule in SCHEDULES:
        pipeline_stage = PipelineStage(part, stage.index, stage.count, torch.device("cpu"))
        runner = BY_NAME[schedule](pipeline_stage, m, loss_fn=_loss, scale_grads=False)
        times = []
        for step in range(steps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            runner.step(
                arg_mbs=[(b,) for b in batches] if stage.first else None,
                kwarg_mbs=[{"tokens": b} for b in batches],
                target_mbs=batches if stage.last else None,
                losses=[],
                return_outputs=False,
            )
            dist.barrier()
            if step:
                times.append(time.perf_counter() - t0)
        seconds[schedule] = sorted(times)[len(times) // 2]
    if rank == 0:
        out.write_text(json.dumps(seconds))
    dist.destroy_process_group()


def two_stages(shape: dict[str, object], m: int, steps: int, dry: bool) -> dict[str, float]:
    """Seconds per step of each schedule with 2 stages on 2 ranks (one torchrun launch for all)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seconds.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
               "--worker", str(m), str(steps), str(out)] + (["--dry-run"] if dry else [])  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return {k: float(v) for k, v in json.loads(out.read_text()).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--dry-run", action="store_true", help="a tiny model, 2 steps: the path only")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = DRY if args.dry_run else SHAPE
    if args.worker:
        m, steps, out = args.worker
        stage_worker(shape, int(m), int(steps), Path(out))
        return
    steps = 2 if args.dry_run else args.steps
    torch.set_num_threads(1)  # as each stage's rank runs
    print("| schedule | micro-batches | one process (s/step) | 2 stages (s/step) | idle, measured | (p-1)/(m+p-1) |")
    print("|---|---|---|---|---|---|")
    for m in args.micro_batches:
        t1 = one_process(shape, m, steps)
        for schedule, tp in two_stages(shape, m, steps, args.dry_run).items():
            idle = 1 - t1 / (2 * tp)
            print(f"| {schedule} | {m} | {t1:.3f} | {tp:.3f} | {idle:.0%} | {1 / (m + 1):.0%} |", flush=True)


if __name__ == "__main__":
    main()
