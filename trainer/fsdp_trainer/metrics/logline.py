"""Rank 0's human-readable progress: log lines, and a progress bar on a terminal."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TextIO

from fsdp_api.durations import format_duration


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def parse_bytes(figure: str) -> float:
    """``format_bytes``'s text back to bytes (to the precision it was printed with)."""
    value, unit = figure.split()
    return float(value) * 1024 ** ("B", "KiB", "MiB", "GiB", "TiB").index(unit)


@dataclass(frozen=True)
class IntervalSummary:
    """Averages over the steps since the previous log line."""

    step: int
    max_steps: int
    loss: float
    learning_rate: float
    grad_norm: float
    global_tokens_per_second: float
    tokens_per_second_per_device: float
    tflops_per_device: float
    mfu: float | None
    memory_peak_bytes: int
    data_share: float
    eta_seconds: float
    trained_share: float | None = None  # trained / processed tokens; None: all trained
    mfu_float8: float | None = None  # precision float8: against the float8 peak (mfu: the bf16 peak)
    # training.objective dpo and simpo: the last step's preference accuracy and reward margin
    preference: tuple[float, float] | None = None


def mfu_text(mfu: float, mfu_float8: float | None) -> str:
    """``MFU x%``; a float8 run names both peaks (MFU_PATTERN reads the first figure)."""
    if mfu_float8 is None:
        return f"MFU {mfu:.1%}"
    return f"MFU {mfu:.1%} of the bf16 peak, {mfu_float8:.1%} of the float8 peak"


def step_line(s: IntervalSummary) -> str:
    """One log line; ``step N/M | loss X`` stays first so scripts can parse it."""
    parts = [
        f"step {s.step}/{s.max_steps}",
        f"loss {s.loss:.4f}",
        *([] if s.preference is None else [f"acc {s.preference[0]:.0%}", f"margin {s.preference[1]:.3f}"]),
        f"lr {s.learning_rate:.2e}",
        f"gnorm {s.grad_norm:.2f}",
        f"{s.global_tokens_per_second:,.0f} tok/s ({s.tokens_per_second_per_device:,.0f}/dev)",
    ]
    if s.trained_share is not None:
        parts.append(f"{s.trained_share:.0%} trained")
    parts.append(f"{s.tflops_per_device:.3g} TFLOP/s/dev")
    if s.mfu is not None:
        parts.append(mfu_text(s.mfu, s.mfu_float8))
    parts += [
        f"mem {format_bytes(s.memory_peak_bytes)}",
        f"data {s.data_share:.1%}",
        f"ETA {format_duration(s.eta_seconds)}",
    ]
    return " | ".join(parts)


# Steps a process runs before its speed is representative (allocator warm-up, torch.compile):
# the end-of-run summary starts after them, and says so.
SUMMARY_WARMUP_STEPS = 3


@dataclass(frozen=True)
class RunSummary:
    """Steady-state throughput of a process's run: wall clock from the end of warm-up to the last step."""

    first_step: int
    last_step: int
    seconds: float
    cpu_seconds: float
    global_tokens_per_second: float
    tokens_per_second_per_device: float
    tflops_per_device: float
    mfu: float | None
    memory_peak_bytes: int
    mfu_float8: float | None = None


# ``summary_line`` read back (the benchmarks): its first part, then two of its fields.
SUMMARY_PATTERN = re.compile(
    r"^summary: steps \d+-\d+ \((?P<n>\d+) steps in (?P<seconds>[\d.]+) s wall, (?P<cpu>[\d.]+) s CPU.*$", re.MULTILINE
)
MFU_PATTERN = re.compile(r"MFU (?P<mfu>[\d.]+)%")
PEAK_MEMORY_PATTERN = re.compile(r"peak mem (?P<mem>[\d.]+ \w+)")


def summary_line(s: RunSummary) -> str:
    """The end-of-run line; SUMMARY_PATTERN, MFU_PATTERN and PEAK_MEMORY_PATTERN read it back."""
    steps = s.last_step - s.first_step + 1
    parts = [
        f"summary: steps {s.first_step}-{s.last_step} ({steps} steps in {s.seconds:.3f} s wall, "
        f"{s.cpu_seconds:.3f} s CPU of rank 0; this process's first {SUMMARY_WARMUP_STEPS} steps, "
        "its warm-up, not counted)",
        f"{s.global_tokens_per_second:,.0f} tok/s ({s.tokens_per_second_per_device:,.0f}/dev)",
        f"{s.tflops_per_device:.3g} TFLOP/s/dev",
    ]
    if s.mfu is not None:
        parts.append(mfu_text(s.mfu, s.mfu_float8))
    parts.append(f"peak mem {format_bytes(s.memory_peak_bytes)}")
    return " | ".join(parts)


class ProgressBar:
    """A one-line bar redrawn in place; log lines are printed above it."""

    WIDTH = 30

    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream = stream
        self.total = max(1, total)
        self._shown = False

    def update(self, step: int, tokens_per_second: float, eta_seconds: float) -> None:
        frac = min(1.0, step / self.total)
        filled = int(frac * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = (
            f"[{bar}] {step}/{self.total} {frac:4.0%} | {tokens_per_second:,.0f} tok/s | "
            f"ETA {format_duration(eta_seconds)}"
        )
        self.stream.write(f"\r\x1b[2K{line}")
        self.stream.flush()
        self._shown = True

    def print_above(self, text: str) -> None:
        if self._shown:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        self.stream.flush()
        self._shown = False

    def close(self) -> None:
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False
