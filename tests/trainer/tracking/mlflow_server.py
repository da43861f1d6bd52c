"""MLflow's own tracking server on loopback (the `mlflow` package's `mlflow server`), and a resolver stand-in.

The stand-in makes a name fail to resolve the same way on every machine: the
check tells "no such name" (an error) from "try again" (a warning).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from fsdp_api.ports import free_port
from fsdp_localcluster.wait import tail, wait_until_answers

START_SECONDS = 120.0  # a fresh SQLite store is migrated first: about 15 s on the 2-core machine


class MlflowServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        command = [
            str(Path(sys.executable).with_name("mlflow")),
            "server",
            f"--backend-store-uri=sqlite:///{self.root / 'store.db'}",
            f"--artifacts-destination={self.root / 'artifacts'}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            "--workers=1",
        ]
        # Its background job runners (GenAI evaluation) are not what a training uses: two processes, not ten.
        # No usage reports to mlflow-telemetry.io: tests reach nothing but loopback.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(command, stdout=out, stderr=out, env=env, start_new_session=True)
        try:
            wait_until_answers(self._process, f"{self.uri}/health", START_SECONDS, "mlflow server", self.log)
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        self._process = None

    def tail(self, lines: int = 30) -> str:
        return tail(self.log, lines)
