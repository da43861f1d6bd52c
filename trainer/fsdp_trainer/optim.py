"""AdamW, the learning-rate schedule and gradient clipping.

The optimizer is built on the sharded (DTensor) parameters, so its state is
sharded like them. Weight decay skips 1-D parameters (RMSNorm weights): decaying
a norm's gain towards zero only fights the normalisation.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from fsdp_api.spec import TrainingSpec
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

BETAS = (0.9, 0.95)
EPS = 1e-8


def build_optimizer(model: nn.Module, spec: TrainingSpec, device: torch.device) -> torch.optim.AdamW:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": spec.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # fused is a single kernel per step on CUDA; foreach (multi-tensor) is the
    # fast path elsewhere. Both are numerically the plain AdamW update.
    impl = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=spec.learning_rate, betas=BETAS, eps=EPS, **impl)


def lr_factor(step: int, *, warmup_steps: int, max_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak learning rate for the ``step``-th optimizer step (0-based).

    Linear warm-up to the peak over ``warmup_steps``, then a cosine decay that
    reaches ``min_ratio`` at the last step.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, max_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, spec: TrainingSpec) -> LambdaLR:
    warmup = spec.effective_warmup_steps()

    def factor(step: int) -> float:
        return lr_factor(step, warmup_steps=warmup, max_steps=spec.max_steps, min_ratio=spec.min_learning_rate_ratio)

    return LambdaLR(optimizer, factor)


def restore_schedule(optimizer: torch.optim.Optimizer, scheduler: LambdaLR, spec: TrainingSpec, step: int) -> None:
    """Put the schedule at ``step`` after a resume, with the hyperparameters of the config.

    Loading the optimizer's state dict brings back the saved param-group
    hyperparameters; the learning rate is instead a function of the step and
    the current config, so a run resumed with a longer maxSteps (or another
    peak) follows the new schedule from the next step on.
    """
    for group, decay in zip(optimizer.param_groups, (spec.weight_decay, 0.0), strict=True):
        group["initial_lr"] = spec.learning_rate
        group["weight_decay"] = decay
        group["betas"] = BETAS
    scheduler.base_lrs = [spec.learning_rate] * len(optimizer.param_groups)
    scheduler.last_epoch = step
    lrs = [base * fn(step) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports; LRScheduler has no public setter


def clip_gradients(model: nn.Module, max_norm: float, stages: int = 1) -> torch.Tensor:
    """Clip to ``max_norm`` (0: measure only) and return the global gradient norm.

    On DTensor gradients the per-shard norms are combined across ranks before
    the clip coefficient is computed, so the norm (and the clipping) is that of
    the whole model's gradient, not of this rank's shard; the tests compare it
    with a single-process run. The result stays on the device (no host sync).
    ``stages``: the pipeline stages, whose ranks hold different parameters of one model.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = total_norm(grads, stages)
    if max_norm > 0:
        # The coefficient multiplies each rank's own pieces: a plain tensor and DTensors
        # on several meshes cannot meet in one DTensor op.
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        locals_ = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        torch._foreach_mul_(locals_, coef.to(locals_[0].device))
    return norm


def total_norm(grads: list[torch.Tensor], stages: int = 1) -> torch.Tensor:
    """The 2-norm of all of ``grads`` together, on every rank (one all-reduce).

    Each rank sums the squares of its own pieces, per kind of layout, and one
    all-reduce over the world adds them up; a piece that several ranks hold
    (FSDP's replicate dimension, or a whole parameter on each of its
    tensor-parallel peers, whose mesh leaves them out) is then divided by its
    number of copies. One collective whatever the meshes: the split
    projections' gradients live on the data x tensor mesh, the rest on the
    data-parallel mesh only. Under pipelining each stage's ranks hold other
    parameters: the same all-reduce adds the stages' squares, and a piece's
    copies are counted within its stage (``stages``: the pipeline degree).
    """
    if not grads:
        return torch.zeros(())
    groups: dict[int, list[torch.Tensor]] = {}
    for grad in grads:
        copies, local = 1, grad
        if isinstance(grad, DTensor):
            mesh, local = grad.device_mesh, grad.to_local()
            copies = (dist.get_world_size() if dist.is_initialized() else 1) // (mesh.size() * stages)
            copies *= math.prod(mesh.size(i) for i, p in enumerate(grad.placements) if p.is_replicate())
        groups.setdefault(copies, []).append(local)
    # One slot per copy count, the same on every rank: pipeline stages hold other parameters, so a
    # rank's own counts (and their order) need not be its peers'.
    world = dist.get_world_size() if dist.is_initialized() else 1
    squares = torch.zeros(world + 1, device=grads[0].device, dtype=torch.float32)
    for copies, pieces in groups.items():
        squares[copies] += torch.stack(torch._foreach_norm(pieces)).float().pow(2).sum()
    if world > 1 and any(isinstance(g, DTensor) for g in grads):
        dist.all_reduce(squares)
    counts = torch.arange(world + 1, dtype=squares.dtype, device=squares.device).clamp(min=1)
    return (squares / counts).sum().sqrt()
