"""Trainer launches forked from one process that has imported the trainer once: the trainer tests' fast path.

A cold launch (``python -m torch.distributed.run ... -m fsdp_trainer``, as
the pods run it) spends about 6 s of CPU per process importing torch and
transformers' modeling stack before its first step: once in torchrun, then
again in every rank. The trainer tests launch about a hundred times, so the
imports were most of their time (docs/e2e.md, "Where the suite's time goes").

A warm launch runs the real torchrun, unchanged, with two of its own options,
``--start-method fork --run-path warm_rank.py``, inside a child forked from a
server that imported everything once. torchrun's agent then forks the ranks
from that child, and they find the trainer in ``sys.modules``. Everything
after the import (rendezvous, process groups, restarts, signals, exit codes)
is torchrun's and the trainer's own code path.

The harness launches warm only where nothing read at import time can differ
from a cold launch: the environment must be the server's, except the
variables the trainer reads while it runs (``RUNTIME_ENV``). A test that
changes anything else (a ``sitecustomize`` shim, a compiler override) gets a
cold launch, and so do the tests of the launch itself (check, supervisor,
SIGTERM), which run the pods' command.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from fsdp_api.contract import ENV_TRAINER_FAULT

RANK_ENTRY = Path(__file__).with_name("warm_rank.py")
# Read when the trainer runs, never at import (or not at all: pytest's name of the running
# test): a launch may differ here and still be warm.
RUNTIME_ENV = frozenset({ENV_TRAINER_FAULT, "PYTEST_CURRENT_TEST"})
# What a rank imports, so that a forked rank imports nothing of weight itself.
PRELOAD = (
    "torch.distributed.run",
    "fsdp_trainer.__main__",
    "fsdp_trainer.train",
    "fsdp_trainer.config",
    "transformers.models.llama.modeling_llama",
    "peft",
    "tensorboardX",
)
_MESSAGE = 1 << 20


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in RUNTIME_ENV}


class WarmLauncher:
    """A server process with the trainer imported, forking one launch per request."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = _comparable(env)  # what a launch's environment is compared with
        self._dir = tempfile.mkdtemp(prefix="fsdp-warm-")
        self.socket_path = os.path.join(self._dir, "launch.sock")
        self._server = subprocess.Popen(
            [sys.executable, __file__, self.socket_path], env=self.env, stdout=subprocess.PIPE, text=True
        )
        ready = self._server.stdout.readline() if self._server.stdout else ""
        if ready.strip() != "ready":
            self.close()
            raise RuntimeError(f"the warm launcher did not start (exit {self._server.poll()})")
        atexit.register(self.close)

    def accepts(self, env: dict[str, str]) -> bool:
        return self._server.poll() is None and _comparable(env) == self.env

    def run(
        self, argv: list[str], *, torchrun: bool, env: dict[str, str], cwd: Path, timeout: float
    ) -> tuple[int, str]:
        """``argv`` as torchrun's arguments (or the trainer's, for one plain process); its exit code and output."""
        request = json.dumps({"argv": argv, "torchrun": torchrun, "env": env, "cwd": str(cwd)}).encode()
        with tempfile.TemporaryFile() as out, socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.connect(self.socket_path)
            socket.send_fds(conn, [request], [out.fileno()])
            pid = json.loads(conn.recv(_MESSAGE))["pid"]
            deadline = time.monotonic() + timeout
            returncode: int | None = None
            try:
                conn.settimeout(timeout)
                reply = conn.recv(_MESSAGE)
                # An empty reply: the launch's process died without saying how (a test's kill, a crash).
                returncode = json.loads(reply)["returncode"] if reply else -signal.SIGKILL
            except TimeoutError:
                # Before the kill, what each process of the launch was doing: its state and kernel wait
                # channel, and (SIGUSR1, faulthandler) every Python thread's stack, into the output.
                processes, pids = _processes_of(pid)
                for each in pids:  # one at a time: dumps written at once would interleave
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(each, signal.SIGUSR1)
                    time.sleep(0.5)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self._wait_gone(pid, deadline + 30)
            out.seek(0)
            output = out.read().decode(errors="replace")
        if returncode is None:
            raise TimeoutError(f"{output}\nthe launch's processes at the timeout:\n{processes}")
        return returncode, output

    @staticmethod
    def _wait_gone(pgid: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)

    def close(self) -> None:
        if self._server.poll() is None:
            self._server.kill()
            self._server.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.socket_path)
            os.rmdir(self._dir)


def _processes_of(pgid: int) -> tuple[str, list[int]]:
    """One line per process of group ``pgid`` (pid, state, kernel wait channel, command line), and their pids."""
    lines, pids = [], []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
            if int(fields[2]) != pgid:
                continue
            wchan = (entry / "wchan").read_text().strip() or "-"
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            lines.append(f"  pid {entry.name} state {fields[0]} wchan {wchan}: {cmdline[:200]}")
            pids.append(int(entry.name))
    return "\n".join(sorted(lines)) or "  none left", sorted(pids)


_launcher: WarmLauncher | None = None


def warm_launcher(env: dict[str, str], baseline: dict[str, str]) -> WarmLauncher | None:
    """The shared server for ``baseline`` (a launch's environment with nothing added); None where
    ``env`` rules a warm launch out.

    The test process's own environment drifts: libraries set variables when a test imports them
    (torch's inductor sets TORCHINDUCTOR_CACHE_DIR, and after an in-process compile a pointer in
    _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR). A server started before would then refuse every
    launch, so a changed baseline starts a new server instead.
    """
    global _launcher
    if os.environ.get("FSDP_TESTS_COLD_LAUNCH") == "1":
        return None
    wanted = _comparable(baseline)
    if _launcher is None or _launcher._server.poll() is not None or _launcher.env != wanted:
        if _launcher is not None:
            _launcher.close()
        _launcher = WarmLauncher(wanted)
    return _launcher if _launcher.accepts(env) else None


# The server side: runs in its own process (``python warm_launch.py SOCKET``).


def _unbuffered(fd: int) -> io.TextIOWrapper:
    # What ``python -u`` gives torchrun's ranks: every write reaches the file at once, so a
    # killed rank loses no line.
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True, errors="backslashreplace")


def _launch(argv: list[str], torchrun: bool) -> int:
    try:
        if torchrun:
            from torch.distributed.run import main as torchrun_main

            sys.argv = ["torchrun", *argv]
            torchrun_main(argv)
            return 0
        from fsdp_trainer.__main__ import main as trainer_main

        sys.argv = [str(RANK_ENTRY), *argv]
        return trainer_main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        # torchrun's own ending when a rank failed: its traceback and exit 1.
        traceback.print_exc()
        return 1


def _child(conn: socket.socket, request: dict, out_fd: int) -> None:
    os.setsid()  # the harness kills the launch's process group on a timeout
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in (1, 2):
        os.dup2(out_fd, fd)
    os.close(out_fd)
    sys.stdout, sys.stderr = _unbuffered(1), _unbuffered(2)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # The harness's SIGUSR1 before it kills a launch that ran over its time: every thread's stack, in
    # this process and in the ranks torchrun forks from it (they inherit the handler and stderr).
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    conn.sendall(json.dumps({"pid": os.getpid()}).encode())
    code = _launch(request["argv"], request["torchrun"])
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"returncode": code}).encode())
    os._exit(code & 0xFF)


def serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the launches reap themselves
    parent = os.getppid()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        server.bind(path)
        server.listen()
        server.settimeout(1.0)
        print("ready", flush=True)
        while os.getppid() == parent:  # the test process is gone: so is its server
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            message, fds, _, _ = socket.recv_fds(conn, _MESSAGE, 1)
            sys.stdout.flush()
            if os.fork() == 0:
                server.close()
                _child(conn, json.loads(message), fds[0])
            conn.close()
            for fd in fds:
                os.close(fd)


if __name__ == "__main__":
    serve(sys.argv[1])
