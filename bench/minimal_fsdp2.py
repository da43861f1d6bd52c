"""The baseline for bench/trainer_throughput.py: the smallest honest FSDP2 training loop.

It follows the pattern of PyTorch's FSDP2 tutorial and nothing more:
``fully_shard`` on every decoder layer, then on the root; AdamW created after
sharding; forward, backward, gradient clipping, step; random token ids as
data. Whatever our trainer adds on top (data pipeline, loss all-reduce,
metrics, logging, checkpoint bookkeeping) shows up as the gap between the two.

Run under torchrun; rank 0 prints one ``BENCH_RESULT {json}`` line::

    torchrun --standalone --nproc-per-node 2 bench/minimal_fsdp2.py --preset tiny --steps 30
    torchrun --standalone --nproc-per-node 2 bench/minimal_fsdp2.py --architecture DIR --steps 30

``--architecture`` takes a directory with a config.json (any transformers causal
LM whose decoder layers are ``model.model.layers``), built with random weights.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from fsdp_api.presets import PRESETS
from fsdp_api.spec import ModelSpec
from fsdp_trainer.model.llama import llama_config
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--architecture", help="a directory with a config.json, instead of --preset")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--precision", choices=["bf16", "fp32"], default="fp32")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute every layer in backward")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--warmup-steps", type=int, default=3, help="untimed first steps (the trainer's summary skips as many)"
    )
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if not 1 <= args.warmup_steps < args.steps:
        raise SystemExit("--warmup-steps must be at least 1 and below --steps")
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")

    torch.manual_seed(args.seed)
    # Built on the CPU, then fully_shard moves each rank's shards to the device.
    # The trainer's own LlamaConfig for a preset: the very same model.
    if args.architecture:
        config = AutoConfig.from_pretrained(args.architecture)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    else:
        model = LlamaForCausalLM(llama_config(ModelSpec(preset=args.preset)))
    vocab_size = model.config.vocab_size
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs = {"mp_policy": mp} if args.precision == "bf16" else {}
    layers = model.model.layers
    for i, layer in enumerate(layers):
        if args.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            layers[i] = layer = checkpoint_wrapper(layer)
        if args.compile:
            layer.compile()
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    model.to(device)  # the rotary-embedding buffers, which fully_shard leaves alone
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)

    gen = torch.Generator().manual_seed(args.seed + rank)
    tokens_per_step = args.micro_batch_size * args.seq_len * world
    start = cpu_start = 0.0
    peak_mem = 0
    for step in range(1, args.steps + 1):
        batch = torch.randint(0, vocab_size, (args.micro_batch_size, args.seq_len), generator=gen).to(device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        loss_value = loss.item()  # the tutorial's logging; also a device sync
        if step == args.warmup_steps:
            # The first steps pay for allocation, compilation and warm-up: time from their end.
            start, cpu_start = time.perf_counter(), time.process_time()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if use_cuda:
        peak_mem = torch.cuda.max_memory_allocated(device)
    else:
        import resource

        peak_mem = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if rank == 0:
        timed = args.steps - args.warmup_steps
        result = {
            "steps": timed,
            "seconds": elapsed,
            "cpu_seconds": cpu,
            "tokens_per_second": tokens_per_step * timed / elapsed if elapsed > 0 else 0.0,
            "peak_memory_bytes": peak_mem,
            "final_loss": loss_value,
        }
        print("BENCH_RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
