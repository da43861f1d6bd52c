"""``activationCheckpointing: op``: backward recomputes a layer's cheap ops, never its matmuls, and the
gradients are those of no checkpointing. (Its memory is in the memory-plan accuracy test.)"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
import torch
from fsdp_trainer.parallel.parallelize import apply_activation_checkpointing
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

from tests.trainer.model.architectures import ARCHITECTURES


class _Ops(TorchDispatchMode):
    """Counts the aten ops run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _backward_ops(model: torch.nn.Module, ids: torch.Tensor) -> tuple[Counter[str], dict[str, torch.Tensor]]:
    loss = model(input_ids=ids, labels=ids).loss
    with _Ops() as ops:
        loss.backward()
    grads = {n.replace("._checkpoint_wrapped_module", ""): p.grad.clone() for n, p in model.named_parameters()}
    return ops.counts, grads


@pytest.mark.parametrize("name", ["llama", "qwen3", "mixtral"])
def test_op_recomputes_the_cheap_ops_and_no_matmul(name: str) -> None:
    torch.manual_seed(0)
    # As the trainer builds it: no key/value cache (a cache updated in forward would differ in the recompute).
    config = AutoConfig.for_model(name, **ARCHITECTURES[name], use_cache=False)
    base = AutoModelForCausalLM.from_config(config).train()
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    runs = {}
    for mode in ("none", "op", "full"):
        model = copy.deepcopy(base)
        assert apply_activation_checkpointing(model, mode) == (0 if mode == "none" else 2)
        runs[mode] = _backward_ops(model, ids)
    (none, grads), (op, op_grads), (full, _) = runs["none"], runs["op"], runs["full"]
    # Full runs each layer's forward again: its projections (and a mixture's grouped expert GEMMs) too; op none.
    for matmul in ("mm", "_grouped_mm") if name == "mixtral" else ("mm",):
        assert op[matmul] == none[matmul] < full[matmul], (matmul, none[matmul], op[matmul], full[matmul])
    # The norms' rsqrt and the MLP's silu come back in both.
    for cheap in ("rsqrt", "silu"):
        assert none[cheap] < op[cheap] == full[cheap], (cheap, none[cheap], op[cheap], full[cheap])
    assert grads.keys() == op_grads.keys()
    for key, grad in grads.items():
        torch.testing.assert_close(op_grads[key], grad, rtol=0, atol=1e-6, msg=key)
