"""Mixture-of-experts: transformers' expert kernels against its per-expert loop, on this machine's device.

One Mixtral-shaped model (hidden 512, 8 experts of width 1024, 2 per token,
4 layers, random weights), the same batch, one forward and backward per
repeat; each of ``model.expertsImplementation``'s choices (``grouped_mm``,
``batched_mm``) is timed against ``eager`` (the model's own loop over its
experts) in the same run, and its gradients must equal eager's (so the
faster one computes the same thing). Prints a Markdown table for
docs/benchmarks.md.

    python bench/moe_experts.py [--repeats 5] [--tokens 2048] [--dry-run]
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")
SHAPE = {
    "vocab_size": 4096,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 4096,
    "use_cache": False,
}
DRY = {**SHAPE, "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1, "vocab_size": 256}


# batched_mm gathers every token's experts' weights (gate_up and down) before one batched matmul: a training
# batch's worth is many GiB, which is why it is an inference kernel; beyond this it is not run.
GATHER_LIMIT = 4 << 30


def gathered_weight_bytes(shape: dict, tokens: int) -> int:
    per_expert = 3 * shape["intermediate_size"] * shape["hidden_size"]
    return tokens * shape["num_experts_per_tok"] * per_expert * 4


def model_of(implementation: str, shape: dict, device: str) -> torch.nn.Module:
    config = AutoConfig.for_model("mixtral", **shape)
    config._experts_implementation = implementation
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(device).train()


def step_seconds(model: torch.nn.Module, ids: torch.Tensor, repeats: int) -> tuple[float, dict[str, torch.Tensor]]:
    """The median seconds of a forward and backward (after one warm-up), and the last gradients."""
    times = []
    for i in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        if ids.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        if ids.is_cuda:
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return sorted(times)[len(times) // 2], grads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tokens", type=int, default=2048, help="tokens per batch (rows of 512)")
    p.add_argument("--dry-run", action="store_true", help="a one-layer toy shape, 1 repeat: that the path runs")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape, repeats, tokens = (DRY, 1, 64) if args.dry_run else (SHAPE, args.repeats, args.tokens)
    seq = min(512, tokens)
    ids = torch.randint(0, shape["vocab_size"], (tokens // seq, seq), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    rows, baseline, skipped = [], None, []
    for implementation in IMPLEMENTATIONS:
        gathered = gathered_weight_bytes(shape, tokens)
        if implementation == "batched_mm" and gathered > GATHER_LIMIT:
            skipped.append(f"batched_mm: not run, it would gather {gathered / 2**30:.1f} GiB of expert weights")
            continue
        seconds, grads = step_seconds(model_of(implementation, shape, device), ids, repeats)
        if baseline is None:
            baseline = (seconds, grads)
        worst = max((grads[n] - baseline[1][n]).abs().max().item() for n in grads)
        rows.append((implementation, seconds, baseline[0] / seconds, worst))
    print(f"Mixtral-shaped, {shape['num_local_experts']} experts x top-{shape['num_experts_per_tok']}, "
          f"{tokens} tokens, {device} ({torch.get_num_threads()} threads), median of {repeats}")  # fmt: skip
    print("| experts | forward+backward | tokens/s | vs eager | max abs grad diff |")
    print("| --- | --- | --- | --- | --- |")
    for implementation, seconds, speedup, worst in rows:
        print(
            f"| {implementation} | {seconds * 1000:.1f} ms | {tokens / seconds:,.0f} | {speedup:.2f}x | {worst:.1e} |"
        )
        assert worst <= 1e-4, f"{implementation}'s gradients differ from eager's by {worst}"
    for line in skipped:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
