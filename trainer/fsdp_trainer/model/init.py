"""Random initialisation with the architecture's own ``_init_weights``, on sharded parameters.

transformers initialises a model module by module (children before parents)
with its ``_init_weights``, which knows the architecture's scheme (GPT-2's
scaled residual projections, Gemma's zero-centred norms, MoE expert tensors,
rotary buffers). Those functions expect whole tensors, and an FSDP2 model
holds only this rank's shards. So the model is initialised one unit at a
time (each decoder block, then everything outside them): the unit's
parameters are swapped for full, plain tensors, its modules are initialised
in transformers' order with the random generator seeded by (seed, module
name), and each rank keeps its piece. Every rank draws the same full tensors,
so the model is the same for any world size or sharding strategy: a sharded
run is comparable with a single-process one.

Non-persistent buffers (rotary frequencies, embedding scales) are garbage
after ``to_empty``; ``reset_buffers`` recomputes them with the same
``_init_weights`` while the parameters are swapped for meta tensors, so
loaded weights are never touched.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from transformers import PreTrainedModel

from .architecture import decoder_units
from .param_names import base_name
from .shards import copy_full_into

InitFn = Callable[[nn.Module], None]


def seed_for(seed: int, name: str) -> int:
    """A generator seed for the tensors drawn under ``name``: the same on every rank and world size."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _post_order(module: nn.Module, name: str, init: InitFn, skip: set[int]) -> Iterator[tuple[str, nn.Module, InitFn]]:
    """(name, module, its init function), children before parents, as transformers applies them.

    A nested PreTrainedModel brings its own ``_init_weights``; modules in
    ``skip`` (the other units) are left out with their subtrees.
    """
    if isinstance(module, PreTrainedModel):
        init = module._init_weights
    for child_name, child in module.named_children():
        if id(child) not in skip:
            yield from _post_order(child, f"{name}.{child_name}" if name else child_name, init, skip)
    yield name, module, init


@contextlib.contextmanager
def _swapped(modules: list[nn.Module], replacement: Callable[[nn.Parameter], torch.Tensor]) -> Iterator[None]:
    """Temporarily replace the modules' own parameters (a tied one by a single replacement)."""
    saved: list[tuple[nn.Module, str, nn.Parameter]] = []
    made: dict[int, nn.Parameter] = {}
    try:
        for module in modules:
            for pname, param in list(module._parameters.items()):
                if param is None:
                    continue
                if id(param) not in made:
                    made[id(param)] = nn.Parameter(replacement(param), requires_grad=False)
                saved.append((module, pname, param))
                module._parameters[pname] = made[id(param)]
        yield
    finally:
        for module, pname, param in saved:
            module._parameters[pname] = param


def _seed_name(module_name: str) -> str:
    """The module's name in the plain model: a LoRA-wrapped layer's base draws what it would unwrapped."""
    return base_name(f"{module_name}.")[:-1] if module_name else module_name


def _unit_roots(model: PreTrainedModel) -> list[nn.Module]:
    return [unit.module for unit in decoder_units(model)]


@torch.no_grad()
def init_weights(model: PreTrainedModel, seed: int, device: torch.device) -> None:
    """Fill freshly materialised (``to_empty``) parameters and buffers, deterministically for ``seed``."""
    layers = _unit_roots(model)
    layer_ids = {id(m) for m in layers}
    prefix = {id(m): name for name, m in model.named_modules()}
    # The root unit goes last: what it ties (the output head to the
    # embedding) may be reached from it only.
    plan = [(m, _seed_name(prefix[id(m)]), layer_ids - {id(m)}) for m in layers]
    plan.append((model, "", layer_ids))
    done: set[int] = set()
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        for root, root_name, skip in plan:
            order = list(_post_order(root, root_name, model._init_weights, skip))
            modules = [m for _, m, _ in order]
            fulls: dict[int, tuple[nn.Parameter, torch.Tensor]] = {}

            def full_for(param: nn.Parameter, fulls: dict = fulls) -> torch.Tensor:
                # NaN until initialised: a parameter the architecture's init
                # does not reach is an error, not a silent zero or garbage.
                tensor = torch.full(param.shape, float("nan"), device=device, dtype=torch.float32)
                fulls[id(param)] = (param, tensor)
                return tensor

            with _swapped(modules, full_for):
                for name, module, init in order:
                    torch.manual_seed(seed_for(seed, _seed_name(name)))
                    init(module)
            names = {
                id(p): f"{_seed_name(n)}.{pn}" if n else pn for n, m, _ in order for pn, p in m._parameters.items()
            }
            for key, (param, full) in fulls.items():
                if key in done:
                    continue
                if torch.isnan(full).any():
                    raise RuntimeError(
                        f"{type(model).__name__}._init_weights leaves {names.get(key, '?')} uninitialised"
                    )
                copy_full_into(param, full)
                done.add(key)


@torch.no_grad()
def reset_buffers(model: PreTrainedModel) -> None:
    """Recompute the buffers ``to_empty`` left as garbage, without touching any parameter."""
    order = list(_post_order(model, "", model._init_weights, set()))
    # Every module, not only those holding buffers: a parent may write its
    # children's buffers (Falcon-H1's model fills each mixer's muP vector).
    # With the parameters on meta, the rest of each init costs nothing.
    with _swapped([m for _, m, _ in order], lambda p: torch.empty(p.shape, device="meta")):
        for _, module, init in order:
            init(module)
