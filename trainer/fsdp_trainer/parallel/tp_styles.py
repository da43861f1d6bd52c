"""The tensor-parallel styles of transformers' plans, as torch ``ParallelStyle`` objects.

transformers names a style per module in ``base_model_tp_plan``; each name here
builds the torch style that computes the same thing (read against
``transformers/distributed/tensor_parallel.py``, 5.23, where transformers
registers its own versions of these names):

- ``colwise``: the output features split, the output left split (the next
  ``rowwise`` takes it so);
- ``rowwise``: the input features split, the partial outputs summed by one
  all-reduce;
- ``colwise_gather_output``: split like ``colwise``, the output all-gathered,
  for a module whose output is sliced or chunked next (Phi-3's fused
  ``qkv_proj`` and ``gate_up_proj``) or normalised over its full width
  (OLMo 2's q/k norms);
- ``rowwise_split_input``: split like ``rowwise`` behind such a gathered
  output: each rank takes its slice of the whole input, with no communication;
- ``replicated_with_grad_allreduce``: a norm between a ``colwise`` and a
  ``rowwise`` projection that normalises each head on its own (Qwen3's and
  Gemma 3's q/k norms): its weight is whole on every rank, but each rank's
  gradient covers only its heads, so the gradients are summed over the group.

The MoE styles (``packed_colwise`` experts, ``moe_tp_experts``,
``ep_dispatch_experts`` ...) split experts, which is expert parallelism's
work, not this module's; a plan that uses them is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel


class ReplicatedNormWithGradSum(ParallelStyle):
    """A norm's weight replicated on the tensor-parallel group, its gradient summed over it.

    The weight becomes a ``Replicate`` DTensor and the norm's input (this rank's
    heads, a plain tensor) a DTensor sharded on a dimension other than the
    normalised last one, so the norm runs locally and DTensor's backward turns
    the weight's per-rank partial gradient into the whole one (one all-reduce).
    Any dimension before the last gives the same sums; the heads' or the
    sequence's, depending on whether the model normalises before or after its
    transpose. Under FSDP the weight is then sharded over the data-parallel
    ranks as any other 2-D DTensor, and DCP saves it whole.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module,
            device_mesh,
            partition_fn=_replicate_parameters,
            # torch's annotation says these return None; a returned value replaces the input/output.
            input_fn=cast(Any, _local_input_as_split),
            output_fn=cast(Any, _local_output),
        )


def _replicate_parameters(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
    for key, param in list(module.named_parameters(recurse=False)):
        replicated = nn.Parameter(DTensor.from_local(param, mesh, [Replicate()], run_check=False), param.requires_grad)
        module.register_parameter(key, replicated)


def _local_input_as_split(module: nn.Module, inputs: tuple[object, ...], mesh: DeviceMesh) -> tuple[object, ...]:
    hidden, *rest = inputs
    if isinstance(hidden, DTensor) or not isinstance(hidden, torch.Tensor) or hidden.ndim < 2:
        return inputs
    return (DTensor.from_local(hidden, mesh, [Shard(hidden.ndim - 2)], run_check=False), *rest)


def _local_output(module: nn.Module, output: object, mesh: DeviceMesh) -> object:
    return output.to_local() if isinstance(output, DTensor) else output


STYLES: dict[str, Callable[[], ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
    "replicated_with_grad_allreduce": ReplicatedNormWithGradSum,
}
