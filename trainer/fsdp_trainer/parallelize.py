"""Applying activation checkpointing, torch.compile and FSDP2 to the model.

Order matters, as in torchtitan: activation checkpointing wraps each decoder
layer first, torch.compile compiles the (wrapped) layers, and ``fully_shard``
goes on each layer and then on the root, so every layer is one all-gather /
reduce-scatter group and the root group holds the embeddings, final norm and
output head. All of this happens on the meta device, before any storage exists.

``fsdp.shardingStrategy`` maps onto FSDP2 as follows (see distributed.mesh_shape):

- full: 1-D mesh, ``reshard_after_forward=True``: parameters are freed after
  each layer's forward and re-gathered for backward (ZeRO-3).
- shard_grad_op: 1-D mesh, ``reshard_after_forward=False``: gathered
  parameters stay until backward; gradients and optimizer state are sharded
  (ZeRO-2 memory for parameters during the step, one all-gather fewer).
- no_shard: 2-D mesh (replicate=W, shard=1): nothing is sharded, gradients are
  all-reduced, i.e. DDP; kept on FSDP2 so one train loop and one checkpoint
  format serve every strategy.
- hybrid: 2-D mesh (replicate=W/G, shard=G), ``reshard_after_forward=True``:
  ZeRO-3 inside each group of G ranks (a node by default), replication across.

The root module is never resharded after forward: its parameters (embedding
and head) are the first needed in backward anyway.

A single process with no CPU offload gets no FSDP at all (a plain module):
that is the non-sharded reference the parity tests compare against.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from fsdp_api.trainer_config import TrainerConfig
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from transformers import LlamaForCausalLM

log = logging.getLogger(__name__)


def decoder_layers(model: LlamaForCausalLM) -> nn.ModuleList:
    return model.model.layers


def apply_activation_checkpointing(model: LlamaForCausalLM, mode: str) -> int:
    """Recompute layer activations in backward; returns how many layers were wrapped.

    selective wraps every other layer (0, 2, 4, ...): about half the
    activation memory of none for about half the recompute cost of full.
    """
    if mode == "none":
        return 0
    layers = decoder_layers(model)
    wrapped = 0
    for i, layer in enumerate(layers):
        if mode == "full" or i % 2 == 0:
            # Non-reentrant checkpointing handles keyword arguments and no_grad
            # inputs; no RNG state to preserve since Llama has no dropout.
            layers[i] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False)
            wrapped += 1
    return wrapped


def apply_compile(model: LlamaForCausalLM) -> None:
    """torch.compile each decoder layer in place (parameter names unchanged).

    Per layer rather than the whole model: all layers share one compiled graph,
    compile time stays flat in depth, and FSDP's hooks stay between layers.
    """
    for layer in decoder_layers(model):
        layer.compile()


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    if precision == "bf16":
        # bf16 compute and all-gathers, fp32 gradient reduction: summing
        # gradients over many ranks in bf16 loses too many bits.
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model: LlamaForCausalLM, mesh: DeviceMesh, cfg: TrainerConfig) -> None:
    strategy = cfg.fsdp.sharding_strategy
    reshard = strategy != "shard_grad_op"
    kwargs = {
        "mesh": mesh,
        "mp_policy": mixed_precision(cfg.training.precision),
        "offload_policy": CPUOffloadPolicy() if cfg.fsdp.cpu_offload else OffloadPolicy(),
    }
    for layer in decoder_layers(model):
        fully_shard(layer, reshard_after_forward=reshard, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)


def apply_prefetch(model: LlamaForCausalLM, depth: int) -> None:
    """Explicit prefetch: layer i all-gathers the next ``depth`` layers in forward
    and the previous ``depth`` in backward, instead of FSDP's implicit one-ahead."""
    if depth <= 0:
        return
    layers = list(decoder_layers(model))
    for i, layer in enumerate(layers):
        forward = layers[i + 1 : i + 1 + depth]
        backward = layers[max(0, i - depth) : i][::-1]
        if forward:
            layer.set_modules_to_forward_prefetch(forward)
        if backward:
            layer.set_modules_to_backward_prefetch(backward)


def uses_fsdp(world_size: int, cfg: TrainerConfig) -> bool:
    return world_size > 1 or cfg.fsdp.cpu_offload


def parallelize(model: LlamaForCausalLM, mesh: DeviceMesh | None, cfg: TrainerConfig) -> LlamaForCausalLM:
    """Everything that wraps the meta model, in the order that works."""
    wrapped = apply_activation_checkpointing(model, cfg.training.activation_checkpointing)
    if wrapped:
        log.info("activation checkpointing (%s) on %d layers", cfg.training.activation_checkpointing, wrapped)
    if cfg.training.compile:
        apply_compile(model)
    if mesh is not None:
        apply_fsdp(model, mesh, cfg)
        apply_prefetch(model, cfg.fsdp.prefetch)
    return model


def is_fsdp(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


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
    if precision == "bf16" and not is_fsdp(model):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            yield
    else:
        yield
