"""A run on this machine: its environment, and its children stopped when it dies."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from .contract import ENV_METRICS_ADDR, ENV_METRICS_DIR
from .ports import LOOPBACK


def local_env(
    nproc: int,
    *,
    metrics_dir: str | Path | None = None,
    base: Mapping[str, str] | None = None,
    cpu: bool = True,
    threads: int | None = None,
) -> dict[str, str]:
    """The environment of a local run: CPU only, metrics on loopback, a fair share of the cores.

    ``threads`` pins OMP_NUM_THREADS; otherwise one inherited from ``base``
    is kept, and the cores are split between the ranks.
    """
    env = dict(os.environ if base is None else base)
    if cpu:
        # The local path is the CPU path, even on a GPU workstation.
        env["CUDA_VISIBLE_DEVICES"] = ""
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, nproc))))
    env[ENV_METRICS_ADDR] = LOOPBACK
    if metrics_dir is not None:
        env[ENV_METRICS_DIR] = str(metrics_dir)
    return env


# prctl(2) option: the signal the kernel sends a process when the thread that started it exits.
PR_SET_PDEATHSIG = 1


def sigterm_when_parent_dies(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGTERM when ``parent`` dies, even by SIGKILL (Linux's parent-death signal).

    A launch whose child lives in a process group of its own (run-local's
    check, the check's torchrun) would otherwise leave it training, with
    nobody to report to, after ``kill -9`` of the parent or its group, or an
    OOM kill. SIGTERM stops the ranks as usual: the checkpoint of their step,
    then exit. The parent must start the child from its main thread (the
    signal follows the thread that forked). Elsewhere than Linux: nothing.
    """

    def arm() -> None:
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm
