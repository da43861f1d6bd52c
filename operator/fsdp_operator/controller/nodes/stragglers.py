"""Stragglers: the rank its peers keep waiting for, read from every pod's own metrics.

At each step's start every rank enters a tiny all-reduce once its batch is
ready, and the trainer counts per rank how much later than the first rank it
arrived (``fsdp_train_rank_lateness_seconds``). A rank on a slow node arrives
last, step after step. Each node check reads that counter, with the rank's
step-duration sum and count, from every pod of a running training and
compares it with the previous read: a window. A rank that kept its peers
waiting for at least ``MARGIN`` of the job's step time, in
``PERSISTENT_WINDOWS`` windows in a row of at least ``MIN_WINDOW_STEPS`` steps
each, makes its node a suspect (docs/operator.md, "Stragglers"). One slow
step (a garbage collection, a slow save) is diluted in its window and does
not repeat in the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fsdp_api.contract import RANK_LATENESS, STEP_DURATION

from ..progress import RankKey, per_rank

# The share of the step time the peers wait for one rank before it counts as straggling.
MARGIN = 0.2
PERSISTENT_WINDOWS = 2
# Fewer steps than this since the last read: the window grows until the next check.
MIN_WINDOW_STEPS = 3

LATENESS_SERIES = RANK_LATENESS.series()[0]
DURATION_SUM, DURATION_COUNT = f"{STEP_DURATION.name}_sum", f"{STEP_DURATION.name}_count"


@dataclass(frozen=True)
class RankCounters:
    """One rank's cumulative counters, as read from its pod."""

    lateness: float  # seconds its peers waited for it, summed over steps
    busy: float  # the sum of its step durations
    steps: float  # the steps it measured
    pod: str = ""
    node: str = ""


def rank_counters(text: str, pod: str = "", node: str = "") -> dict[RankKey, RankCounters]:
    """The straggler counters of every rank in one pod's exposition (ranks without all three are left out)."""
    seen = per_rank(text, (LATENESS_SERIES, DURATION_SUM, DURATION_COUNT))
    return {
        key: RankCounters(v[LATENESS_SERIES], v[DURATION_SUM], v[DURATION_COUNT], pod, node)
        for key, v in seen.items()
        if len(v) == 3
    }


@dataclass
class RankWindow:
    base: RankCounters  # the read the current window starts from
    closed: int = 0  # windows judged since the rank's process started
    flagged: int = 0  # windows in a row at or above the margin
    share: float = 0.0  # of the last window: the peers' wait for it / the job's step time
    late_per_step: float = 0.0


@dataclass
class StragglerWatch:
    """What the node checks remember of one training's ranks between reads."""

    ranks: dict[RankKey, RankWindow] = field(default_factory=dict)

    def update(self, reads: Mapping[RankKey, RankCounters]) -> None:
        """Close the windows that have enough steps; a rank whose counters went back (a new process) starts over."""
        closing: dict[RankKey, tuple[float, float]] = {}  # key -> (lateness, step time), per step
        for key, now in reads.items():
            known = self.ranks.get(key)
            if known is None or now.steps < known.base.steps or now.lateness < known.base.lateness:
                self.ranks[key] = RankWindow(now)
                continue
            steps = now.steps - known.base.steps
            if steps >= MIN_WINDOW_STEPS:
                closing[key] = ((now.lateness - known.base.lateness) / steps, (now.busy - known.base.busy) / steps)
        if not closing:
            return
        # The job's step time is its slowest rank's: the ones that waited include the wait.
        step_time = max(busy for _, busy in closing.values())
        for key, (late, _) in closing.items():
            window = self.ranks[key]
            window.share = late / step_time if step_time > 0 else 0.0
            window.late_per_step = late
            window.closed += 1
            window.flagged = window.flagged + 1 if window.share >= MARGIN else 0
            window.base = reads[key]

    @property
    def judged(self) -> bool:
        """Whether any window closed: before that, nothing can be said either way."""
        return any(w.closed for w in self.ranks.values())

    def evidence(self) -> dict[str, list[str]]:
        """Per node: a line for each of its ranks straggling persistently."""
        out: dict[str, list[str]] = {}
        for (node_rank, local_rank), w in sorted(self.ranks.items()):
            if w.flagged >= PERSISTENT_WINDOWS and w.base.node:
                out.setdefault(w.base.node, []).append(
                    f"straggler: node rank {node_rank}, local rank {local_rank} (pod {w.base.pod}) kept its peers "
                    f"waiting {w.share:.0%} of the step time ({w.late_per_step:.2f} s per step), "
                    f"{w.flagged} checks in a row"
                )
        return out
