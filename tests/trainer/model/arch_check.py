"""Run under torchrun by model/test_architectures.py: build each config's sharded model
exactly as the trainer does (pretrained or randomly initialised), then save
(rank 0) its gathered parameters and the logits of a probe input.

    torchrun --nproc-per-node 2 arch_check.py OUT.pt NAME=train.yaml [NAME=train.yaml ...]
"""

from __future__ import annotations

import sys

import torch
from fsdp_trainer.build import build_model, prepare
from fsdp_trainer.config import load_config
from fsdp_trainer.model.param_names import unique_parameters
from fsdp_trainer.model.shards import full_tensor
from fsdp_trainer.parallel.distributed import destroy_distributed, init_distributed


def main() -> None:
    out, runs = sys.argv[1], [arg.split("=", 1) for arg in sys.argv[2:]]
    results, started, rank = {}, False, 0
    for name, path in runs:
        prepared = prepare(load_config(path))
        if not started:
            init_distributed(prepared.world)
            started, rank = True, prepared.world.rank
        model = build_model(prepared)
        params = {n: full_tensor(p).cpu() for n, p in unique_parameters(model)}
        inputs = (torch.arange(2 * 24).view(2, 24) * 7 + 3) % model.config.vocab_size
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=inputs).logits
        results[name] = {"params": params, "inputs": inputs, "logits": logits, "class": type(model).__name__}
    if rank == 0:
        torch.save(results, out)
    destroy_distributed()


if __name__ == "__main__":
    main()
