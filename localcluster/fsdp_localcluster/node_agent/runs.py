"""One container's runs in the node agent: its process, its log, its termination, and how it is killed.

A container's processes are found by a marker variable in their environment
(``CONTAINER_MARKER``), so a whole container can be killed even after its
processes re-parent or start sessions of their own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .client import Obj, now

# Every process of a container carries this variable, so that the whole
# container can be found and killed even after its processes re-parent or start
# new sessions (torchrun starts its workers in their own sessions).
CONTAINER_MARKER = "NODE_AGENT_CONTAINER"


def container_pids(marker: str) -> list[int]:
    """PIDs of every live process whose environment carries ``CONTAINER_MARKER=marker``."""
    needle = f"{CONTAINER_MARKER}={marker}\0".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read():
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


# The kubelet's FallbackToLogsOnError message: at most the last 80 lines of the
# log, and of those the last 2048 bytes (kubernetes pkg/kubelet/container/runtime.go,
# MaxContainerTerminationMessageLogLines/-LogLength).
TERMINATION_LOG_LINES = 80
TERMINATION_LOG_BYTES = 2048


def log_tail(path: Path, lines: int = TERMINATION_LOG_LINES, limit: int = TERMINATION_LOG_BYTES) -> str:
    """The end of a container log as a termination message: the last ``lines`` lines, then the last ``limit`` bytes."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            # 80 lines of a log rarely exceed 64 KiB; a longer tail is cut to ``limit`` bytes anyway.
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read()
    except OSError:
        return ""
    tail = b"".join(data.splitlines(keepends=True)[-lines:])
    return tail[-limit:].decode(errors="replace")


@dataclass
class ContainerRun:
    """One container of a pod: its current process and the history the status needs."""

    spec: Obj
    init: bool
    log_dir: Path
    marker_base: str
    restart_count: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    last_terminated: Obj | None = None
    terminated: Obj | None = None
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    next_start: float = 0.0
    attempts: int = 0
    dns_wait_since: float | None = None
    # Image mode: what removes this attempt's container once its processes are gone.
    cleanup: list[str] | None = None

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def marker(self) -> str:
        return f"{self.marker_base}/{self.name}/{self.attempts}"

    @property
    def next_marker(self) -> str:
        """The marker the next ``start`` gives (an image-mode container carries it inside too)."""
        return f"{self.marker_base}/{self.name}/{self.attempts + 1}"

    def log_path(self, attempt: int | None = None) -> Path:
        return self.log_dir / f"{self.name}.{self.attempts if attempt is None else attempt}.log"

    def start(self, argv: list[str], env: dict[str, str], cwd: Path, cleanup: list[str] | None = None) -> None:
        self.attempts += 1
        self.cleanup = cleanup
        env = {**env, CONTAINER_MARKER: self.marker}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path().open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started_at, self.terminated, self.waiting = now(), None, None

    @property
    def container_id(self) -> str:
        """``podman://<name>`` for an image-mode container, ``local://<pid>`` for a process."""
        if self.cleanup is not None:
            return f"podman://{self.cleanup[-1]}"
        assert self.proc is not None
        return f"local://{self.proc.pid}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reap(self) -> Obj | None:
        """If the main process exited: kill the rest of the container, record and return its termination."""
        if self.proc is None or self.proc.poll() is None:
            return None
        rc, container_id = self.proc.returncode, self.container_id
        self.kill_all()
        code = 128 - rc if rc < 0 else rc
        self.terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.started_at,
            "finishedAt": now(),
            "containerID": container_id,
        }
        if rc < 0:
            self.terminated["signal"] = -rc
        if code != 0 and self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            # No message file here (the container has no /dev of its own): the log tail, as the kubelet takes it.
            message = log_tail(self.log_path())
            if message:
                self.terminated["message"] = message
        self.proc = None
        return self.terminated

    def signal_main(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill_all(self) -> None:
        """SIGKILL every process of this container (a container's processes die with it)."""
        for _ in range(3):
            pids = container_pids(self.marker)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        if self.proc is not None:
            self.proc.wait()
        if self.cleanup is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(self.cleanup, capture_output=True, timeout=60)
            self.cleanup = None

    def status(self, image: str) -> Obj:
        st: Obj = {
            "name": self.name,
            "image": image,
            "imageID": "",
            "ready": self.running and not self.init,
            "restartCount": self.restart_count,
            "started": self.running,
        }
        if self.running:
            assert self.proc is not None
            st["containerID"] = self.container_id
            st["state"] = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None:
            st["containerID"] = self.terminated["containerID"]
            st["state"] = {"terminated": self.terminated}
        else:
            reason, message = self.waiting or ("ContainerCreating", "")
            st["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        if self.last_terminated is not None:
            st["lastState"] = {"terminated": self.last_terminated}
        return st
