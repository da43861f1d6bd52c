"""Applying activation checkpointing, torch.compile and FSDP2 to the model.

The units are the model's decoder blocks (``model.architecture.decoder_units``:
its ``_no_split_modules``), whatever the architecture. Order matters, as in
torchtitan: float8 swaps the blocks' Linear layers first (``float8.py``),
tensor parallelism splits the blocks' projections over the tensor-parallel
ranks (``tensor_parallel.py``), expert parallelism splits the experts over
the expert-parallel ranks (``expert_parallel.py``), activation checkpointing wraps each decoder layer next,
torch.compile compiles the (wrapped) layers (``compile.py``), and ``fully_shard`` goes on each
split experts module (its own group, on the experts' mesh), each layer and
then on the root, so every layer is one all-gather / reduce-scatter
group and the root group holds the embeddings, final norm and output head.
All of this happens on the meta device, before any storage exists.

What ``fsdp.shardingStrategy`` means (the mesh, ``reshard_after_forward``,
whether FSDP is used at all) is decided by ``fsdp_api.parallel_plan.ParallelPlan``; this module
only applies it. The root module is never resharded after forward: its
parameters (embedding and head) are the first needed in backward anyway.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator

import torch
from fsdp_api.parallel_plan import ParallelPlan
from fsdp_api.precision import compute_dtype
from fsdp_api.trainer_config import TrainerConfig
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from transformers import PreTrainedModel

from ..model.architecture import decoder_units
from .compile import CompileReport, apply_compile
from .expert_parallel import apply_expert_parallel, expert_parallel_modules
from .float8 import Float8Report, apply_float8
from .op_checkpoint import op_checkpoint
from .plan import ExpertMesh, data_parallel_mesh, tensor_parallel_mesh
from .tensor_parallel import apply_tensor_parallel

log = logging.getLogger(__name__)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    return [unit.module for unit in decoder_units(model)]


def apply_activation_checkpointing(model: PreTrainedModel, mode: str) -> int:
    """Recompute layer activations in backward; returns how many layers were wrapped.

    selective wraps every other layer (0, 2, 4, ...): about half the
    activation memory of none for about half the recompute cost of full.
    op wraps every layer in a policy that keeps its matmuls' outputs and
    recomputes the cheap ops between them (``op_checkpoint.py``).
    """
    if mode == "none":
        return 0
    if mode == "op":
        units = decoder_units(model)
        for unit in units:
            unit.replace(op_checkpoint(unit.module))
        return len(units)
    wrapped = 0
    for i, unit in enumerate(decoder_units(model)):
        if mode == "full" or i % 2 == 0:
            # Non-reentrant checkpointing handles keyword arguments and no_grad
            # inputs. The RNG state is preserved: an architecture with dropout
            # must drop the same units in the recomputation.
            unit.replace(checkpoint_wrapper(unit.module, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
            wrapped += 1
    return wrapped


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    if compute_dtype(precision) == "bf16":
        # bf16 compute and all-gathers, fp32 gradient reduction: summing
        # gradients over many ranks in bf16 loses too many bits.
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(
    model: PreTrainedModel,
    mesh: DeviceMesh,
    plan: ParallelPlan,
    precision: str,
    expert_mesh: ExpertMesh | None = None,
) -> None:
    mp_policy = mixed_precision(precision)
    offload_policy = CPUOffloadPolicy() if plan.fsdp.cpu_offload else OffloadPolicy()
    if expert_mesh is not None:
        _shard_experts(model, expert_mesh, plan, mp_policy, offload_policy)
    for layer in decoder_layers(model):
        fully_shard(
            layer,
            mesh=mesh,
            reshard_after_forward=plan.reshard_after_forward,
            mp_policy=mp_policy,
            offload_policy=offload_policy,
        )
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy, offload_policy=offload_policy)


def _shard_experts(
    model: PreTrainedModel,
    expert_mesh: ExpertMesh,
    plan: ParallelPlan,
    mp_policy: MixedPrecisionPolicy,
    offload_policy: OffloadPolicy,
) -> None:
    """Each split experts module its own FSDP group over the experts' FSDP ranks.

    Its gradient sums the tokens of every rank FSDP averages a dense layer
    over (the dispatch's backward brings them to the expert's rank), so it is
    divided by that count (the data-parallel ranks times the context ranks),
    not by the experts' FSDP group: the same average a dense layer gets.

    FSDP divides by another factor than its group through PREMUL_SUM, which
    gloo rejects (and NCCL zeroes in bf16 before torch 2.13,
    pytorch/pytorch#190747): sum over the group, then divide locally. Only
    when each expert is sharded (``efsdp > 1``): without a reduce-scatter FSDP
    already divides after its all-reduce over the hybrid replicas, and a
    forced sum would divide twice (transformers'
    ``apply_fully_sharded_data_parallelism`` says the same).
    """
    fsdp_mesh = expert_mesh.fsdp
    for module in expert_parallel_modules(model):
        fully_shard(
            module,
            mesh=fsdp_mesh,
            reshard_after_forward=plan.reshard_after_forward,
            mp_policy=mp_policy,
            offload_policy=offload_policy,
        )
        assert isinstance(module, FSDPModule)
        module.set_gradient_divide_factor(float(math.prod(plan.fsdp_shape)))
        if expert_mesh.shards_experts:
            module.set_force_sum_reduction_for_comms(True)


def apply_prefetch(model: PreTrainedModel, depth: int) -> None:
    """Explicit prefetch: layer i all-gathers the next ``depth`` layers in forward
    and the previous ``depth`` in backward, instead of FSDP's implicit one-ahead."""
    if depth <= 0:
        return
    layers: list[FSDPModule] = []
    for module in decoder_layers(model):
        assert isinstance(module, FSDPModule)  # apply_fsdp sharded every decoder layer
        layers.append(module)
    for i, layer in enumerate(layers):
        forward = layers[i + 1 : i + 1 + depth]
        backward = layers[max(0, i - depth) : i][::-1]
        if forward:
            layer.set_modules_to_forward_prefetch(forward)
        if backward:
            layer.set_modules_to_backward_prefetch(backward)


def parallelize(
    model: PreTrainedModel,
    cfg: TrainerConfig,
    plan: ParallelPlan,
    mesh: DeviceMesh | None,
    device: torch.device | None = None,
    compile_report: CompileReport | None = None,
    float8_report: Float8Report | None = None,
    expert_mesh: ExpertMesh | None = None,
) -> PreTrainedModel:
    """Everything that wraps the meta model, in the order that works (``mesh``: None without FSDP).

    ``float8_report``, if given, is filled in with the layers float8 converted and kept.
    """
    if cfg.training.precision == "float8":
        recipe = cfg.training.effective_float8_recipe()
        done = apply_float8(model, recipe, device or torch.device("cpu"), fsdp=mesh is not None)
        if float8_report is not None:
            float8_report.converted, float8_report.skipped = done.converted, done.skipped
    tp_mesh = tensor_parallel_mesh(mesh, plan) if mesh is not None else None
    if tp_mesh is not None:
        apply_tensor_parallel(model, tp_mesh)
    if expert_mesh is not None:
        apply_expert_parallel(model, expert_mesh.ep, expert_mesh.shared_batch)
    wrapped = apply_activation_checkpointing(model, cfg.training.activation_checkpointing)
    if wrapped:
        log.info("activation checkpointing (%s) on %d layers", cfg.training.activation_checkpointing, wrapped)
    if compile_report is not None:
        apply_compile(model, compile_report)
    if mesh is not None:
        apply_fsdp(model, data_parallel_mesh(mesh, plan), plan, cfg.training.precision, expert_mesh)
        apply_prefetch(model, plan.fsdp.prefetch)
    return model


def is_fsdp(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def reshard(model: nn.Module) -> None:
    """Free parameters a no-grad forward left gathered (the root, shard_grad_op layers)."""
    if is_fsdp(model):
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Skip (False) or do (True) the gradient reduce-scatter/all-reduce of the next backward.

    Off for all but the last micro-batch of an accumulated step: gradients
    accumulate unsharded locally and are reduced once.
    """
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)


@contextlib.contextmanager
def compute_context(model: nn.Module, precision: str, device: torch.device) -> Iterator[None]:
    """bf16 autocast for the plain (non-FSDP) model; FSDP's policy casts by itself."""
    if compute_dtype(precision) == "bf16" and not is_fsdp(model):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            yield
    else:
        yield
