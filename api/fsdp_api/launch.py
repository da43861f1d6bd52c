"""How the trainer is started: the torchrun command lines and the local environment.

One builder for every launch: the pods' command (the renderer), the
embedded default (``fsdp-operator run-local``), the tests and the benchmarks.
Pure functions of their arguments; nothing here starts a process.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .contract import CHECK_COMMAND, CONFIG_FLAG, ENV_METRICS_ADDR, ENV_METRICS_DIR, RDZV_PORT, TRAINER_MODULE

TORCHRUN = "torchrun"
# The container's interpreter, from PATH (the image's venv), like torchrun.
PYTHON = "python"
LOOPBACK = "127.0.0.1"
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


# Where free_port looks first: below the kernel's ephemeral range (Linux's default starts at
# 32768), above the ports services are usually configured on; never torch's own defaults
# (the rendezvous port, MASTER_PORT's), which processes bind without asking.
PORT_FLOOR = 20000
TORCH_DEFAULT_PORTS = frozenset({RDZV_PORT, 29500})
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_FREE_PORT_TRIES = 200


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands out to ``bind(0)`` and to outgoing connections (Linux's default where unreadable)."""
    try:
        low, high = (int(field) for field in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing is bound to right now, outside the kernel's ephemeral range where there is room.

    A port the kernel picks for ``bind(0)`` comes from the range it also takes the
    source port of every outgoing connection from: one picked now and bound by a
    child process seconds later (a torchrun, an etcd, a metrics server) can be taken
    meanwhile by any client's connection, and that bind fails. A port outside the
    range is only ever taken by an explicit bind, which the check here sees.
    """
    low, high = ephemeral_port_range()
    spans = [(PORT_FLOOR, low - 1), (high + 1, 65535)]
    ports = [
        port
        for first, last in spans
        if last - first >= 1000
        for port in range(first, last + 1)
        if port not in TORCH_DEFAULT_PORTS
    ]
    for port in random.sample(ports, min(len(ports), _FREE_PORT_TRIES)):
        if port_is_free(port, host):
            return port
    with socket.socket() as s:  # no room outside the range (or all taken): the kernel's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


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
