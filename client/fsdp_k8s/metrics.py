"""The trainer's Prometheus series as numbers: what ``Client.metrics`` returns."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from fsdp_api.contract import GLOBAL_TOKENS_PER_SECOND, LABEL_LOCAL_RANK, LABEL_NODE_RANK, LOSS, MAX_STEPS, STEP
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float

    @property
    def rank(self) -> tuple[int, int]:
        """(node rank, local rank); a series without them sorts first."""

        def num(key: str) -> int:
            try:
                return int(self.labels.get(key, "0"))
            except ValueError:
                return 0

        return num(LABEL_NODE_RANK), num(LABEL_LOCAL_RANK)


@dataclass(frozen=True)
class TrainerMetrics:
    """Every sample one trainer pod serves; ``value(name)`` reads the lowest rank's, as the operator does."""

    samples: tuple[Sample, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, text: str) -> TrainerMetrics:
        found = []
        for family in text_string_to_metric_families(text):
            found += [Sample(s.name, dict(s.labels), float(s.value)) for s in family.samples]
        return cls(tuple(found))

    def value(self, name: str) -> float | None:
        """The series' value on the lowest rank that reports a finite one (global figures are the same on each)."""
        finite = [s for s in self.samples if s.name == name and math.isfinite(s.value)]
        return min(finite, key=lambda s: s.rank).value if finite else None

    def as_dict(self) -> dict[str, float]:
        """Series name -> the lowest rank's value: the figures a notebook plots."""
        return {name: v for name in sorted({s.name for s in self.samples}) if (v := self.value(name)) is not None}

    @property
    def step(self) -> int | None:
        v = self.value(STEP.name)
        return int(v) if v is not None else None

    @property
    def max_steps(self) -> int | None:
        v = self.value(MAX_STEPS.name)
        return int(v) if v is not None else None

    @property
    def loss(self) -> float | None:
        return self.value(LOSS.name)

    @property
    def tokens_per_second(self) -> float | None:
        return self.value(GLOBAL_TOKENS_PER_SECOND.name)
