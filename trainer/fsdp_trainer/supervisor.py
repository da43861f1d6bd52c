"""The container's PID 1 around torchrun: signals passed on once, and the exit code the ranks earned.

``fsdp-train check -- torchrun ...`` runs the config check and then, instead
of exec'ing torchrun, stays its parent (``supervise``; torchrun's agent is a
fork of the check where it is this interpreter's, forked_torchrun.py): torchrun exits 1 on
SIGTERM whatever its ranks did, and the container must exit 143
(``STOPPED_EXIT_CODE``) when they saved and stopped. Which signals are passed
on and what the exit codes mean are the contract's (``fsdp_api.contract``),
shared with ``fsdp-operator run-local``'s launcher.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from fsdp_api.contract import FORWARDED_SIGNALS, STOPPED_EXIT_CODE, signal_exit_code
from fsdp_api.local_process import sigterm_when_parent_dies

from .forked_torchrun import ForkedTorchrun, own_torchrun

# What supervise starts: torchrun forked from this process, or a program (subprocess.Popen).
Launch = ForkedTorchrun | subprocess.Popen[bytes]

# Set by ``supervise`` for the ranks of the torchrun it runs: a rank that stops
# cleanly on SIGTERM (its checkpoint saved) leaves ``rank-<RANK>`` there.
ENV_STOP_DIR = "FSDP_TRAINER_STOP_DIR"


def stop_before_the_launch(signum: int, _frame: FrameType | None) -> None:
    """A signal during the check: nothing has started and nothing is to save, so stop now.

    The check is the container's PID 1, and PID 1 has no default action for
    SIGTERM: without a handler the kubelet's SIGTERM is dropped, the check
    goes on to start torchrun, and the pod trains until the grace period ends
    in SIGKILL, with no checkpoint on the way out (seen on a real kubelet).
    """
    print(
        f"fsdp-train: {signal.Signals(signum).name} during the config check, before torchrun started: "
        f"nothing to save; exit {signal_exit_code(signum)}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(signal_exit_code(signum))  # no child, no open checkpoint: nothing to unwind


def stop_on_signals_before_the_launch() -> None:
    """Install ``stop_before_the_launch`` for the forwarded signals (``supervise`` replaces it with its forwarder).

    First, before the check's imports and reads; an exec'd command gets the
    default dispositions back.
    """
    for s in FORWARDED_SIGNALS:
        signal.signal(s, stop_before_the_launch)


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
        self._proc: Launch | None = None
        self._held: list[int] = []

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._proc is None:
            self._held.append(signum)  # arrived while torchrun was being started
        else:
            self._send(signum)

    def attach(self, proc: Launch) -> None:
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
            # torchrun's group is its own: a kill -9 of ours (run-local's, an OOM kill) must still stop it.
            orphaned = sigterm_when_parent_dies(os.getpid())
            env = {**os.environ, ENV_STOP_DIR: stops}
            args = own_torchrun(command)
            proc: Launch = (
                ForkedTorchrun(args, env, before_run=orphaned)
                if args is not None
                else subprocess.Popen(command, env=env, process_group=0, preexec_fn=orphaned)
            )
            forwarder.attach(proc)
            returncode = proc.wait()  # retried after each handler (PEP 475)
            stopped = len(list(Path(stops).glob("rank-*")))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    status = exit_status(returncode, bool(forwarder.received), stopped, local_ranks)
    if status == STOPPED_EXIT_CODE:
        # Under torchrun's SignalException traceback, which is expected here.
        name = signal.Signals(forwarder.received[0]).name
        print(f"fsdp-train: all {stopped} local rank(s) saved and stopped on {name}; exit {status}", file=sys.stderr)
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
    return signal_exit_code(-returncode) if returncode < 0 else returncode
