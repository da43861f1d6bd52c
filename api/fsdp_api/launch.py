"""How the trainer is started: the torchrun command lines.

One builder for every launch: the pods' command (the renderer), the
embedded default (``fsdp-operator run-local``), the tests and the benchmarks.
Pure functions of their arguments; nothing here starts a process. The
environment and the process hygiene of a run on this machine are in
``local_process``, the choice of free ports in ``ports``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from .contract import CHECK_COMMAND, CONFIG_FLAG, TRAINER_MODULE

TORCHRUN = "torchrun"
# The container's interpreter, from PATH (the image's venv), like torchrun.
PYTHON = "python"
# The check's option: ``VAR=VALUE``, the condition under which this pod hosts the rendezvous.
HOST_RENDEZVOUS_FLAG = "--host-rendezvous-if"


def trainer_program(config_path: str | Path, *extra: str) -> list[str]:
    """What torchrun runs on each rank: the trainer module on ``config_path``."""
    return ["-m", TRAINER_MODULE, CONFIG_FLAG, str(config_path), *extra]


def checked_launch(
    config_path: str | Path, launch: Sequence[str], *, python: str = PYTHON, host_rendezvous_if: str | None = None
) -> list[str]:
    """``launch`` preceded by the trainer's one-process config check, which starts it when the config is good.

    ``host_rendezvous_if`` (``VAR=VALUE``): where the variable has that value, the
    pod hosts the c10d rendezvous at its own address (HOST_RENDEZVOUS_FLAG).

    The check execs ``launch``, except torchrun, whose parent it stays so that
    a SIGTERM stop exits 143 (torchrun alone exits 1; see fsdp_trainer/supervisor.py).

    A bad config then ends in the check with one line per mistake (exit
    code CONFIG_ERROR_EXIT_CODE) before torchrun starts any rank. The check
    reads the node and process counts from the torchrun flags of ``launch``,
    so they are written once.
    """
    host = [HOST_RENDEZVOUS_FLAG, host_rendezvous_if] if host_rendezvous_if else []
    return [python, "-m", TRAINER_MODULE, CHECK_COMMAND, CONFIG_FLAG, str(config_path), *host, "--", *launch]


def torchrun_rendezvous(
    *,
    nnodes: str,
    nproc_per_node: int,
    endpoint: str,
    run_id: str,
    rdzv_conf: str,
    max_restarts: int,
    program: Sequence[str],
) -> list[str]:
    """A multi-node launch through a c10d rendezvous (the pods' command; ``torchrun`` from PATH)."""
    return [
        TORCHRUN,
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf={rdzv_conf}",
        f"--max-restarts={max_restarts}",
        *program,
    ]


def torchrun_standalone(
    nproc: int, program: Sequence[str], *, max_restarts: int | None = None, python: str = sys.executable
) -> list[str]:
    """A single-node launch on this machine, with this interpreter's torch (no reliance on PATH)."""
    cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    if max_restarts is not None:
        cmd += ["--max-restarts", str(max_restarts)]
    return [*cmd, *program]
