"""The trainer's fault-injection hook (``FSDP_TRAINER_FAULT``): its grammar, read by every side.

``<point>:<step>[:<rank>[:<action>]]``: rank ``rank`` (0 unless given) acts
when it reaches ``point`` at ``step``, in the first torchrun attempt only.
The tests use it to kill, hang or slow a rank on purpose. It lives here, not
in the trainer, so that ``validate`` and the API server refuse a malformed
value (it would otherwise fail in every rank at every step) and can say what
a well-formed one will do to the run.

Every action fires at one step, except ``slow<s>``, which sleeps after every
step from that step on: a persistently slow rank (the straggler tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

POINTS = {
    "after_step": "after step {step}'s update, before anything is saved",
    "during_save": "while saving step {step}'s checkpoint (shards written, not yet marked complete)",
    "during_upload": (
        "while uploading step {step}'s checkpoint to checkpoint.remote (its files sent, its part list not yet)"
    ),
}
# Actions: kill (SIGKILL, as a node loss or OOM kill), hang (never return), sleep<s> (a slow but live rank),
# slow<s> (sleep at this point of every step from then on: a straggler).
PATTERN = (
    r"^(after_step|during_save|during_upload):[0-9]{1,9}"
    r"(:[0-9]{1,6}(:(kill|hang|(sleep|slow)[0-9]{1,6}([.][0-9]+)?))?)?$"
)
GRAMMAR = (
    "<point>:<step>[:<rank>[:<action>]] with point after_step, during_save or during_upload, "
    "action kill, hang, sleep<seconds> or slow<seconds>"
)


@dataclass(frozen=True)
class Fault:
    point: str
    step: int
    rank: int = 0
    action: str = "kill"

    @property
    def persistent(self) -> bool:
        """slow<s>: it acts at every step from ``step`` on, not once."""
        return self.action.startswith("slow")

    def seconds(self) -> float:
        """How long sleep<s> and slow<s> sleep (0 for the other actions)."""
        return float(re.sub(r"^(sleep|slow)", "", self.action)) if self.action.startswith(("sleep", "slow")) else 0.0

    def describe(self) -> str:
        where = POINTS[self.point].format(step=self.step)
        if self.persistent:
            return (
                f"rank {self.rank} sleeps {self.seconds():g} s {where}, and at the same point of every later step, "
                "in the first attempt only"
            )
        verb = {"kill": "is killed (SIGKILL)", "hang": "hangs"}.get(self.action, f"sleeps {self.seconds():g} s")
        return f"rank {self.rank} {verb} {where}, in the first attempt only"


def parse_fault(value: str) -> Fault:
    """The fault a value names; ValueError with the grammar when it is malformed."""
    if not re.match(PATTERN, value):
        raise ValueError(f"{value!r} is not {GRAMMAR}")
    parts = value.split(":")
    defaults = ["", "", "0", "kill"]
    point, step, rank, action = parts + defaults[len(parts) :]
    return Fault(point, int(step), int(rank), action)
