"""torchrun's agent forked from the pod's check instead of started as a second interpreter.

The check (``fsdp-train check -- torchrun ...``) has imported torch already,
to build the model on the meta device; a fresh ``torchrun`` process imports it
again before its agent does anything (3-4 s of CPU, and its own few hundred MB).
Forked, the agent starts at once and shares those pages. It is still
torchrun's own ``main`` with the same arguments and environment, in a process
(and process group) of its own that the check supervises as before; its ranks
are still started fresh by torchrun, so nothing of the check's state reaches a
rank.

Forking after torch's import is what every DataLoader worker does: the
check starts no Python thread of its own (torch's and transformers' idle pool
threads are not carried into the child, nothing of theirs is used there), it
creates no CUDA context (``torch.cuda.device_count`` reads NVML), and the
agent runs no tensor code. A torchrun that is not this interpreter's (another
``torchrun`` on PATH) is started as a program, as before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from fsdp_api.contract import FORWARDED_SIGNALS


def own_torchrun(command: list[str]) -> list[str] | None:
    """torchrun's arguments when ``command`` runs this interpreter's torchrun; None for anything else."""
    if command[1:3] == ["-m", "torch.distributed.run"]:
        # Not resolved: a virtualenv's python is a link to the base interpreter, whose packages differ.
        found = shutil.which(command[0])
        same = found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)
        return command[3:] if same else None
    if command and Path(command[0]).name == "torchrun":
        found = shutil.which(command[0])
        ours = Path(sys.executable).parent / "torchrun"
        return command[1:] if found and Path(found).resolve() == ours.resolve() else None
    return None


class ForkedTorchrun:
    """torchrun's ``main(args)`` in a forked child: ``pid``, ``send_signal`` and ``wait`` as a Popen has them."""

    def __init__(self, args: list[str], env: Mapping[str, str], before_run: Callable[[], None]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:
            _run_child(args, env, before_run)  # never returns

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)  # retried after each signal handler (PEP 475)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _run_child(args: list[str], env: Mapping[str, str], before_run: Callable[[], None]) -> None:
    code = 1
    try:
        os.setpgid(0, 0)  # a group of its own, as the program launch has (supervisor.py says why)
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)  # the check's forwarder is not torchrun's
        before_run()
        os.environ.clear()
        os.environ.update(env)
        from torch.distributed.run import main

        sys.argv = ["torchrun", *args]
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        # What `torchrun` prints and returns when its agent raises (a rank failed, a signal).
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code & 0xFF)
