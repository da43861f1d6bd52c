"""One FSDPTraining as the client reads it back: its phase, typed status, and where its pods are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fsdp_api.contract import BACKENDS, PYTORCHJOB, JobBackend
from fsdp_api.status import Condition, FSDPTrainingStatus

Json = dict[str, Any]
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Training:
    """An FSDPTraining from the API server: ``status`` is the operator's, typed by the API package."""

    body: Json
    status: FSDPTrainingStatus

    @classmethod
    def of(cls, body: Json) -> Training:
        # Extra or future fields are kept in ``body``; the typed view reads what this version knows.
        return cls(body, FSDPTrainingStatus.model_validate(body.get("status") or {}))

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"].get("namespace", "default"))

    @property
    def phase(self) -> str:
        return self.status.phase

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def max_steps(self) -> int | None:
        steps = ((self.body.get("spec") or {}).get("training") or {}).get("maxSteps")
        return int(steps) if steps is not None else None

    @property
    def backend(self) -> JobBackend:
        return BACKENDS.get((self.body.get("spec") or {}).get("backend", PYTORCHJOB.name), PYTORCHJOB)

    @property
    def job_name(self) -> str:
        return self.status.job_name or self.name

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.status.conditions if c.type == type_), None)

    def summary(self) -> str:
        """One line: phase, step of max, loss, time left; what ``wait`` prints when there is no progress bar."""
        s = self.status
        parts = [f"{self.namespace}/{self.name}: {self.phase}"]
        if s.step is not None:
            parts.append(f"step {s.step}/{self.max_steps or '?'}")
        if s.loss is not None:
            parts.append(f"loss {s.loss:.4f}")
        if s.remaining and self.phase == "Running":
            parts.append(f"{s.remaining} left")
        if s.message and self.phase not in ("Running", "Succeeded"):
            parts.append(s.message)
        return " | ".join(parts)
