"""Stopping the processes the local cluster starts: the one shutdown every component gets."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen[bytes] | None, timeout: float) -> int | None:
    """SIGTERM, wait ``timeout`` seconds for a graceful exit, then SIGKILL; the exit code (None: no process)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
