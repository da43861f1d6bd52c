"""The values one step's ranks exchange, each in a named slot: one all-reduce, one host sync, read back by name."""

from __future__ import annotations

import torch
import torch.distributed as dist


class StepReductions:
    """Slots filled during a step, then exchanged once.

    ``sum`` slots are summed over every rank in one all-reduce (gloo has no
    average: a mean is a sum divided by the count); ``read`` slots are this
    rank's own values, fetched in the same host transfer, so the step waits
    for the device once. A slot is a scalar or a vector; its values come back
    as a list of floats under its name.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._summed: dict[str, torch.Tensor] = {}
        self._read: dict[str, torch.Tensor] = {}

    def sum(self, name: str, value: torch.Tensor | float) -> None:
        self._summed[self._fresh(name)] = self._flat(value)

    def read(self, name: str, value: torch.Tensor | float) -> None:
        self._read[self._fresh(name)] = self._flat(value)

    def exchange(self) -> dict[str, list[float]]:
        """Every slot's values: the summed ones over every rank, the read ones as this rank has them."""
        names = [*self._summed, *self._read]
        parts: list[torch.Tensor] = []
        if self._summed:
            summed = torch.cat(list(self._summed.values()))
            dist.all_reduce(summed)
            parts.append(summed)
        parts += self._read.values()
        flat = torch.cat(parts).tolist() if parts else []
        sizes = [t.numel() for t in (*self._summed.values(), *self._read.values())]
        out, at = {}, 0
        for name, size in zip(names, sizes, strict=True):
            out[name], at = flat[at : at + size], at + size
        self._summed, self._read = {}, {}
        return out

    def _fresh(self, name: str) -> str:
        if name in self._summed or name in self._read:
            raise ValueError(f"step reduction slot {name!r} is filled twice")
        return name

    def _flat(self, value: torch.Tensor | float) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(float(value), device=self.device)
        return value.detach().to(device=self.device, dtype=torch.float32).reshape(-1)
