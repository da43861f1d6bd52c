"""The reference for bench/trainer_throughput.py --accelerate: Hugging Face Accelerate's FSDP2.

A plain Accelerate training loop as its documentation describes it:
``FullyShardedDataParallelPlugin(fsdp_version=2)`` wrapping each decoder layer
(``transformer_based_wrap`` on the model's ``_no_split_modules``), a
``DataLoader`` over the same packed windows of the embedded corpus the
trainer reads, ``accelerator.backward``, gradient clipping, AdamW. Run under
torchrun; rank 0 prints one ``BENCH_RESULT {json}`` line::

    torchrun --standalone --nproc-per-node 2 bench/accelerate_fsdp2.py --architecture DIR --steps 30
    torchrun --standalone --nproc-per-node gpu bench/accelerate_fsdp2.py --preset llama3.2-1b --precision bf16 ...

``--precision bf16`` gives the plugin FSDP2's ``MixedPrecisionPolicy`` with bf16
parameters and fp32 gradient reduction, the trainer's policy for bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from fsdp_api.presets import PRESETS
from fsdp_api.spec import ModelSpec
from fsdp_trainer.data.corpus import embedded_documents
from fsdp_trainer.data.packing import encode
from fsdp_trainer.data.tokenizer import embedded_tokenizer_dir
from fsdp_trainer.model.llama import llama_config
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--architecture", help="a directory with a config.json")
    model.add_argument("--preset", choices=sorted(PRESETS), help="the trainer's preset (its own LlamaConfig)")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="fp32")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-4)
    return p.parse_args()


def windows(seq_len: int) -> torch.Tensor:
    """The embedded corpus tokenized and packed into seqLen + 1 windows, as the trainer packs it."""
    tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    stream: list[int] = []
    for doc in encode(tokenizer, list(embedded_documents())):
        stream += doc
    n = len(stream) // (seq_len + 1)
    return torch.tensor(stream[: n * (seq_len + 1)]).view(n, seq_len + 1)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("ACCELERATE_USE_FSDP", "true")
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    if args.architecture:
        config = AutoConfig.from_pretrained(args.architecture)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    else:
        model = LlamaForCausalLM(llama_config(ModelSpec(preset=args.preset)))
    precision = {}
    if args.precision == "bf16":
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        precision["mixed_precision_policy"] = policy
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=list(model._no_split_modules),
        reshard_after_forward=True,
        **precision,
    )
    accelerator = Accelerator(fsdp_plugin=plugin, cpu=not torch.cuda.is_available())
    data = windows(args.seq_len)
    loader = torch.utils.data.DataLoader(data, batch_size=args.micro_batch_size, shuffle=True, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    tokens_per_step = args.micro_batch_size * args.seq_len * accelerator.num_processes
    step, start, cpu_start, loss_value = 0, 0.0, 0.0, float("nan")
    while step < args.steps:
        for batch in loader:
            step += 1
            inputs = batch[:, :-1]
            loss = model(input_ids=inputs, labels=inputs).loss  # transformers shifts the labels itself
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            loss_value = loss.item()
            if step == args.warmup_steps:
                start, cpu_start = time.perf_counter(), time.process_time()
            if step == args.steps:
                break
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if torch.cuda.is_available():
        peak_memory = torch.cuda.max_memory_allocated()
    else:
        import resource

        peak_memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if accelerator.is_main_process:
        timed = args.steps - args.warmup_steps
        result = {
            "steps": timed,
            "seconds": elapsed,
            "cpu_seconds": cpu,
            "tokens_per_second": tokens_per_step * timed / elapsed,
            "final_loss": loss_value,
            "peak_memory_bytes": peak_memory,
            "fsdp_version": plugin.fsdp_version,
            "distributed_type": str(accelerator.distributed_type),
        }
        print("BENCH_RESULT " + json.dumps(result), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
