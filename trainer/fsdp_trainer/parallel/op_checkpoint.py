"""``activationCheckpointing: op``: inside every decoder layer, keep the matmuls' outputs and recompute the rest.

The expensive results of a layer are its matmuls (the projections), its
attention kernel and its collectives; the cheap ones are everything between
them: norms, rotary embeddings, activations, residual adds, casts. Full
checkpointing throws all of them away and runs the whole layer again in
backward (a third more compute); this keeps the expensive ones and recomputes
only the cheap ones, for about half the activation memory of none at a few
percent of compute. It is torchtitan's op-level selective checkpointing (its
"op" option, ``torchtitan/distributed/activation_checkpoint.py``), made of
torch's own ``create_selective_checkpoint_contexts``: the policy sees every
aten op the layer runs and answers save or recompute.

On every layer, by op type: any architecture's layer is matmuls, attention and
cheap ops in between. The attention kernels listed are SDPA's fused ones; a
layer whose attention runs as plain matmuls (an explicit mask on the CPU's
math path) keeps its projections and recomputes its attention scores, which is
what a memory-lean policy should do with a seq x seq tensor.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts


def _ops(namespace: Any, names: tuple[str, ...]) -> set[Any]:
    """The ``.default`` overloads of the ops this torch has (a build without one just lacks it)."""
    return {getattr(namespace, name).default for name in names if hasattr(namespace, name)}


# Projections (a Linear is mm, or addmm with a bias; float8's is _scaled_mm) and the experts of a
# mixture of experts (transformers' grouped_mm kernel).
MATMULS = ("mm", "addmm", "_scaled_mm", "_grouped_mm")
# SDPA's fused kernels: their output and log-sum-exp are what attention's backward reads.
ATTENTION = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)
# Tensor parallelism's collectives: recomputing one would communicate again.
COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")


def saved_ops() -> frozenset[Any]:
    import torch.distributed._functional_collectives

    return frozenset(
        _ops(torch.ops.aten, MATMULS) | _ops(torch.ops.aten, ATTENTION) | _ops(torch.ops._c10d_functional, COLLECTIVES)
    )


def _context() -> Any:
    saved = saved_ops()

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if func in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def op_checkpoint(module: nn.Module) -> nn.Module:
    """``module`` under the op policy: its matmul, attention and collective outputs saved, the rest recomputed."""
    return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=_context)
