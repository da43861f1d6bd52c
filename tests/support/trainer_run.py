"""A real trainer run in the background: torchrun, 2 CPU ranks, a small Llama, metrics on.

For tests that look at what a running trainer exposes (its /metrics endpoint,
what Prometheus scrapes from it, what a dashboard query returns)::

    with TrainerRun(tmp_path, max_steps=30) as run:
        while run.running():
            samples = run.scrape()          # None until the endpoint is up
        assert run.wait() == 0, run.output()

- ``TrainerRun(workdir, *, name="metrics-test", nproc=2, max_steps=30, overrides=None)``:
  ``overrides`` is merged into the train.yaml mapping (camelCase keys, e.g.
  ``{"training": {"evalIntervalSteps": 10}}``). The default model is the tiny
  preset shrunk further so a CPU step takes tens of milliseconds.
- ``config`` (the TrainerConfig written to ``workdir/train.yaml``), ``port``,
  ``target`` (``127.0.0.1:port``, for a Prometheus scrape config).
- ``start()``, ``running()``, ``wait(timeout)`` (exit code), ``stop()``,
  ``output()`` (the run's stdout and stderr so far).
- ``scrape() -> list[Sample] | None``: the endpoint's samples, None while it
  is not serving. ``Sample`` has ``name``, ``labels`` and ``value``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

from fsdp_api.contract import ENV_METRICS_LINGER_SECONDS
from fsdp_api.launch import torchrun_standalone, trainer_program
from fsdp_api.local_process import local_env
from fsdp_api.ports import LOOPBACK, free_port
from fsdp_api.trainer_config import TrainerConfig
from prometheus_client.parser import text_string_to_metric_families

# Small enough for ~20-50 ms steps on one CPU core per rank; the vocabulary
# stays the preset's so the embedded tokenizer fits.
SMALL_MODEL = {
    "hiddenSize": 64,
    "numLayers": 2,
    "numHeads": 4,
    "numKeyValueHeads": 2,
    "intermediateSize": 128,
}


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class TrainerRun:
    def __init__(
        self,
        workdir: Path,
        *,
        name: str = "metrics-test",
        nproc: int = 2,
        max_steps: int = 30,
        overrides: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.env = dict(env or {})
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nproc = nproc
        self.port = free_port()
        data = {
            "job": {"name": name, "namespace": "test"},
            "model": {"preset": "tiny", "config": SMALL_MODEL},
            "training": {
                "maxSteps": max_steps,
                "seqLen": 64,
                "microBatchSize": 2,
                "precision": "fp32",
                "logIntervalSteps": 1,
                "warmupSteps": 2,
            },
            "checkpoint": {"dir": str((self.workdir / "checkpoints").resolve()), "intervalSteps": 10},
            "metrics": {"enabled": True, "port": self.port},
        }
        self.config = TrainerConfig.model_validate(_merge(data, overrides or {}))
        self.config_path = self.workdir / "train.yaml"
        self.config_path.write_text(self.config.to_yaml())
        self._log_path = self.workdir / "run.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> TrainerRun:
        env = local_env(self.nproc, metrics_dir=self.workdir / "metrics-files", threads=1)
        # Short CPU runs end within a scrape or two; keep the final values scrapeable.
        env[ENV_METRICS_LINGER_SECONDS] = "3"
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        env.update(self.env)
        cmd = torchrun_standalone(self.nproc, trainer_program(self.config_path))
        with open(self._log_path, "wb") as log:
            # Own process group, so stop() reaches torchrun's workers too.
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float = 600) -> int:
        assert self._proc is not None
        return self._proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.running():
            assert self._proc is not None
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()

    def output(self) -> str:
        return self._log_path.read_text(errors="replace") if self._log_path.exists() else ""

    def scrape(self, timeout: float = 5) -> list[Sample] | None:
        try:
            with urllib.request.urlopen(f"http://{self.target}/metrics", timeout=timeout) as r:
                return parse_metrics(r.read().decode())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def __enter__(self) -> TrainerRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
