"""``fsdp-train check``: the whole configuration, checked once, before torchrun starts a rank.

The ranks check it again (they need what ``prepare`` builds), but a mistake
found there is reported by every rank and then wrapped by torchrun's elastic
agent in a ChildFailedError traceback. Run first, in the container's own
process, the check prints only the ``field: message`` lines and exits 2, and
the pod's termination message (FallbackToLogsOnError) carries exactly those
lines to the operator. With a command after ``--``, a passing check is
replaced by that command (exec: same process, signals and exit code); when
that command is torchrun, its --nnodes and --nproc-per-node are the ones
checked, and the check stays as torchrun's parent instead (see
``supervise``): torchrun exits 1 on SIGTERM whatever its ranks did, and the
container must exit 143 when they saved and stopped.

    fsdp-train check --config train.yaml -- torchrun --nnodes=2 --nproc-per-node=8 ...
    fsdp-train check --config train.yaml --nnodes 2:4 --nproc-per-node 8
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from fsdp_api.contract import CHECK_COMMAND as COMMAND

from .errors import ConfigError

if TYPE_CHECKING:
    from .parallel.distributed import WorldInfo

# Set by ``supervise`` for the ranks of the torchrun it runs: a rank that stops
# cleanly on SIGTERM (its checkpoint saved) leaves ``rank-<RANK>`` there.
ENV_STOP_DIR = "FSDP_TRAINER_STOP_DIR"
# What a rank that stopped cleanly on SIGTERM exits with (128 + SIGTERM), and so the container.
STOPPED_EXIT_CODE = 128 + signal.SIGTERM
# What the container's runtime (SIGTERM) or a terminal (SIGINT, SIGHUP) sends the check; torchrun gets them.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def node_counts(nnodes: str) -> list[int]:
    """torchrun's --nnodes value (``N`` or ``MIN:MAX``) as the node counts the job may run with."""
    try:
        low, _, high = nnodes.partition(":")
        first, last = int(low), int(high or low)
    except ValueError:
        raise ConfigError([f"--nnodes: {nnodes!r} is not N or MIN:MAX"]) from None
    if first < 1 or last < first:
        raise ConfigError([f"--nnodes: {nnodes!r} is not N or MIN:MAX with 1 <= MIN <= MAX"])
    return list(range(first, last + 1))


def processes_per_node(value: str) -> int:
    """torchrun's --nproc-per-node: a count, or ``gpu``/``cpu``/``auto`` resolved on this node as torchrun does."""
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value in ("gpu", "cpu", "auto"):
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if value == "gpu" and gpus == 0:
            raise ConfigError(["--nproc-per-node: gpu, but this node has no GPU"])
        return gpus if gpus and value != "cpu" else os.cpu_count() or 1
    raise ConfigError([f"--nproc-per-node: {value!r} is not a positive count, gpu, cpu or auto"])


def check(config: str, nnodes: str, nproc_per_node: int) -> str:
    """Check ``config`` for every world size the launch allows; the one-line summary, or ConfigError."""
    from .config import load_config
    from .model.architecture import count_parameters
    from .model.lora import count_trainable
    from .parallel.distributed import world_from_env
    from .parallel.plan import ParallelPlan
    from .train import prepare

    counts = node_counts(nnodes)
    cfg = load_config(config)

    def world(nodes: int) -> WorldInfo:
        ranks = nodes * nproc_per_node
        env = {
            "RANK": "0",
            "WORLD_SIZE": str(ranks),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": str(nproc_per_node),
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": str(nodes),
        }
        return world_from_env(env)

    # The model, data and checkpoint checks do not depend on the world size:
    # the whole check runs once, the mesh check for each size an elastic job may reach.
    prepared = prepare(cfg, world(counts[0]))
    errors: list[str] = []
    for nodes in counts[1:]:
        w = world(nodes)
        errors += [f"{e} (with {nodes} nodes)" for e in ParallelPlan(cfg.fsdp, w.world_size, nproc_per_node).errors()]
    if errors:
        raise ConfigError(errors)
    sizes = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    params = f"{count_parameters(prepared.model):,} parameters"
    if prepared.adapted:
        params += f" ({count_trainable(prepared.model):,} trainable: LoRA on {len(prepared.adapted)} modules)"
    return (
        f"configuration ok: {type(prepared.model).__name__}, {params}, "
        f"seqLen {prepared.seq_len}, {sizes} node(s) x {nproc_per_node} process(es)"
    )


def torchrun_arguments(command: list[str]) -> list[str] | None:
    """The arguments of a torchrun command line (``torchrun ...`` or ``python -m torch.distributed.run ...``)."""
    if command and Path(command[0]).name == "torchrun":
        return command[1:]
    if command[1:3] == ["-m", "torch.distributed.run"]:
        return command[3:]
    return None


def launch_shape(command: list[str]) -> tuple[str | None, str | None]:
    """--nnodes and --nproc-per-node of a torchrun launch, read by torchrun's own parser; (None, None) otherwise.

    The pods' command names the node count once, in torchrun's flags (the
    kustomize overlay patches only that), and the check follows it.
    """
    args = torchrun_arguments(command)
    if args is None:
        return None, None
    from torch.distributed.run import get_args_parser

    parsed, _ = get_args_parser().parse_known_args(args)
    return str(parsed.nnodes), str(parsed.nproc_per_node)


def _stop_before_the_launch(signum: int, _frame: FrameType | None) -> None:
    """A signal during the check: nothing has started and nothing is to save, so stop now.

    The check is the container's PID 1, and PID 1 has no default action for
    SIGTERM: without a handler the kubelet's SIGTERM is dropped, the check
    goes on to start torchrun, and the pod trains until the grace period ends
    in SIGKILL, with no checkpoint on the way out (seen on a real kubelet).
    """
    print(
        f"fsdp-train: {signal.Signals(signum).name} during the config check, before torchrun started: "
        f"nothing to save; exit {128 + signum}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(128 + signum)  # no child, no open checkpoint: nothing to unwind


def check_main(argv: list[str]) -> int:
    # First, before the check's imports and reads: see _stop_before_the_launch.
    # ``supervise`` replaces these with its forwarder before torchrun starts;
    # an exec'd command gets the default dispositions back.
    for s in FORWARDED_SIGNALS:
        signal.signal(s, _stop_before_the_launch)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(
        prog=f"fsdp-train {COMMAND}",
        description="Check train.yaml as torchrun would run it; then run the command after --, if any.",
    )
    parser.add_argument("--config", required=True, help="train.yaml (the job's ConfigMap)")
    parser.add_argument("--nnodes", help="N or MIN:MAX (default: the torchrun command's, else 1)")
    parser.add_argument("--nproc-per-node", help="N, gpu, cpu or auto (default: the torchrun command's, else 1)")
    args = parser.parse_args(argv)
    nnodes, nproc = launch_shape(command)
    nnodes, nproc = args.nnodes or nnodes or "1", args.nproc_per_node or nproc or "1"
    summary = check(args.config, nnodes, processes_per_node(nproc))
    print(f"fsdp-train: {summary}", file=sys.stderr, flush=True)
    if not command:
        return 0
    sys.stdout.flush()
    try:
        if torchrun_arguments(command) is not None:
            return supervise(command, processes_per_node(nproc))
        os.execvp(command[0], command)
    except OSError as e:
        print(f"fsdp-train: cannot run {command[0]}: {e.strerror or e}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


def record_stop(step: int, env: Mapping[str, str] = os.environ) -> None:
    """Tell a supervising check that this rank stopped cleanly on SIGTERM after saving ``step``.

    Best effort: without the record the container exits 1 (torchrun's code)
    instead of 143, which is still a failure to Kubernetes.
    """
    directory = env.get(ENV_STOP_DIR)
    if directory:
        with contextlib.suppress(OSError):
            (Path(directory) / f"rank-{env.get('RANK', '0')}").write_text(f"{step}\n")


class _Forwarder:
    """A signal handler that passes each signal on to the launch, once it has started."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._held: list[int] = []

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._proc is None:
            self._held.append(signum)  # arrived while torchrun was being started
        else:
            self._send(signum)

    def attach(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        while self._held:
            self._send(self._held.pop(0))

    def _send(self, signum: int) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signum)


def supervise(command: list[str], local_ranks: int) -> int:
    """Run the torchrun ``command`` as a child; its exit code, or 143 when every local rank stopped cleanly.

    Why not exec: on SIGTERM torchrun's agent passes the signal to the ranks,
    waits for them (up to TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s by default, then SIGKILL), and re-raises its
    SignalException, so torchrun exits 1 even when every rank saved the
    checkpoint of its step and exited 143 (torch/distributed/elastic/agent/
    server/api.py ``run``, launcher/api.py ``launch_agent``). Their exit codes
    are not passed on, so the ranks report a clean stop in ``ENV_STOP_DIR``
    (``record_stop``) and this process, the container's PID 1, turns that into 143.

    torchrun runs in a process group of its own, so it gets each signal exactly
    once, from here, whether the signal came to this process alone (the
    kubelet's, to PID 1) or to its whole group (a terminal's Ctrl-C,
    run-local's killpg): a second SIGTERM would cut torchrun's wait for the
    ranks' save short. torchrun starts every rank in a session of its own, so
    the ranks get it only from torchrun, as before.
    """
    forwarder = _Forwarder()
    previous = {s: signal.signal(s, forwarder) for s in FORWARDED_SIGNALS}
    try:
        with tempfile.TemporaryDirectory(prefix="fsdp-stop-") as stops:
            proc = subprocess.Popen(command, env={**os.environ, ENV_STOP_DIR: stops}, process_group=0)
            forwarder.attach(proc)
            returncode = proc.wait()  # retried after each handler (PEP 475)
            stopped = len(list(Path(stops).glob("rank-*")))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    status = exit_status(returncode, bool(forwarder.received), stopped, local_ranks)
    if status == STOPPED_EXIT_CODE:
        # Under torchrun's SignalException traceback, which is expected here.
        print(f"fsdp-train: all {stopped} local rank(s) saved and stopped on SIGTERM; exit {status}", file=sys.stderr)
    return status


def exit_status(returncode: int, signalled: bool, stopped: int, local_ranks: int) -> int:
    """The container's exit code from torchrun's and the ranks' stop records.

    143 only when a signal came and every local rank saved and stopped: one
    that failed instead leaves torchrun's non-zero code. A rank stops only
    after the checkpoint of its step is complete on every rank, so this node's
    records suffice.
    """
    if signalled and stopped >= local_ranks:
        return STOPPED_EXIT_CODE
    # A child killed by a signal: the shell's convention, as Kubernetes reports it.
    return 128 - returncode if returncode < 0 else returncode
