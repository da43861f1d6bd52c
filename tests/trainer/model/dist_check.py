"""Run under torchrun by model/test_init.py: build the sharded model exactly as the
trainer does, then gather every parameter and save them (rank 0) with the
logits of a probe input, so the test can compare with a single process.

    torchrun --nproc-per-node 2 dist_check.py train.yaml OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from fsdp_trainer.build import build_model, prepare
from fsdp_trainer.config import load_config
from fsdp_trainer.model.param_names import unique_parameters
from fsdp_trainer.model.shards import full_tensor
from fsdp_trainer.parallel.distributed import destroy_distributed, init_distributed


def main() -> None:
    cfg = load_config(sys.argv[1])
    out = Path(sys.argv[2])
    prepared = prepare(cfg)
    init_distributed(prepared.world)
    model = build_model(prepared)
    full = {name: full_tensor(p).cpu() for name, p in unique_parameters(model)}
    inputs = torch.arange(24).view(2, 12) % model.config.vocab_size
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=inputs).logits
    if prepared.world.rank == 0:
        torch.save(
            {
                "params": full,
                "inputs": inputs,
                "logits": logits,
                "buffers": {name: b.cpu() for name, b in model.named_buffers()},
                "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
            },
            out,
        )
    destroy_distributed()


if __name__ == "__main__":
    main()
