"""Memory figures of this rank: CUDA allocator peaks on GPU, resident set size on CPU."""

from __future__ import annotations

import os
import resource
import sys

import torch


def peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def memory_bytes(device: torch.device) -> tuple[int, int]:
    """(peak, reserved): CUDA max allocated / max reserved, or peak / current RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    return peak_rss_bytes(), current_rss_bytes()
