"""A real, throwaway Prometheus server (Debian's ``prometheus`` binary), for tests and the local cluster.

It scrapes the static targets you give it every second and answers PromQL over
its HTTP API, so a test can check what a dashboard or an alert would see::

    with PrometheusServer(["127.0.0.1:9402"]) as prom:
        prom.wait_for_series('fsdp_train_step{job_name="demo"}')
        rows = prom.query("max by (job_name) (fsdp_train_step)")
        rows[0]["metric"]["job_name"], float(rows[0]["value"][1])

API (all results are the ``data.result`` lists of the Prometheus HTTP API):

- ``PrometheusServer(targets, *, scrape_interval="1s", job="fsdp-trainer", rule_files=(), evaluation_interval="1s")``:
  ``targets`` is a list of ``host:port`` (one scrape job named ``job``) or a
  dict ``{job_name: [host:port, ...]}``; ``rule_files`` are recording/alerting
  rule files to load.
- ``start()`` / ``stop()``, or use it as a context manager. ``url`` is the base URL.
- ``query(promql, at=None) -> list``: instant query (``value`` is ``[ts, "str"]``).
- ``query_range(promql, start, end, step="1s") -> list``: range query (``values``).
- ``wait_for_series(promql, *, timeout=60, predicate=None) -> list``: poll an
  instant query until it returns rows (and ``predicate(rows)`` holds); raises
  TimeoutError with the last result and the scrape targets' health.
- ``targets() -> list``: active scrape targets with ``health`` and ``lastError``.
- ``rules() -> list`` / ``alerts() -> list``: loaded rule groups and active alerts.
- ``logs() -> str``: the server's output, for failure messages.

The binary comes from ``tools/install-system-deps.sh`` (``make system-deps``);
``PROMETHEUS_BIN`` overrides its path. A missing binary raises, it never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from fsdp_api.ports import free_port

from .processes import stop_process

Rows = list[dict[str, Any]]


def prometheus_binary() -> str:
    path = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
    if not path:
        raise FileNotFoundError("prometheus is not installed: run `make system-deps` (tools/install-system-deps.sh)")
    return path


class PrometheusServer:
    """One Prometheus process on a free loopback port, with its TSDB in a temp dir."""

    def __init__(
        self,
        targets: Sequence[str] | Mapping[str, Sequence[str]],
        *,
        scrape_interval: str = "1s",
        job: str = "fsdp-trainer",
        rule_files: Sequence[str | Path] = (),
        evaluation_interval: str = "1s",
    ) -> None:
        self.jobs = (
            {job: list(targets)} if not isinstance(targets, Mapping) else {k: list(v) for k, v in targets.items()}
        )
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.rule_files = [str(Path(f).resolve()) for f in rule_files]
        self.workdir: Path | None = None
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, "PrometheusServer is not started"
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": self.rule_files,
            "scrape_configs": [
                {"job_name": name, "static_configs": [{"targets": targets}]} for name, targets in self.jobs.items()
            ],
        }

    # --- lifecycle ---------------------------------------------------------

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        binary = prometheus_binary()
        self.workdir = Path(tempfile.mkdtemp(prefix="fsdp-prometheus-"))
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        # The port is picked before Prometheus binds it; another process may
        # take it in between, so retry a few times on a fresh one.
        for attempt in range(3):
            self.port = free_port()
            self._log_path = self.workdir / f"prometheus-{attempt}.log"
            with open(self._log_path, "wb") as log:
                self._proc = subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config_path}",
                        f"--storage.tsdb.path={self.workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--storage.tsdb.retention.time=1d",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                )
            if self._wait_ready(timeout):
                return self
            if "address already in use" not in self.logs():
                break
        logs = self.logs()
        self.stop()
        raise RuntimeError(f"prometheus did not become ready:\n{logs}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        stop_process(self._proc, 15)
        self._proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")

    # --- HTTP API ----------------------------------------------------------

    def _get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{self.url}{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            # A bad query answers 400 with the parser's message: show it.
            raise RuntimeError(f"GET {url}: {e.code} {e.read().decode(errors='replace')}") from e
        if body.get("status") != "success":
            raise RuntimeError(f"GET {url}: {body}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> Rows:
        return self._get("/api/v1/query", query=promql, time=at)["result"]

    def query_range(self, promql: str, start: float, end: float, step: str | float = "1s") -> Rows:
        return self._get("/api/v1/query_range", query=promql, start=start, end=end, step=step)["result"]

    def targets(self) -> Rows:
        return self._get("/api/v1/targets")["activeTargets"]

    def rules(self) -> Rows:
        return self._get("/api/v1/rules")["groups"]

    def alerts(self) -> Rows:
        return self._get("/api/v1/alerts")["alerts"]

    def wait_for_series(
        self,
        promql: str,
        *,
        timeout: float = 60.0,
        predicate: Callable[[Rows], bool] | None = None,
        interval: float = 0.5,
    ) -> Rows:
        deadline = time.monotonic() + timeout
        rows: Rows = []
        while time.monotonic() < deadline:
            rows = self.query(promql)
            if rows and (predicate is None or predicate(rows)):
                return rows
            time.sleep(interval)
        health = [(t["scrapeUrl"], t["health"], t.get("lastError", "")) for t in self.targets()]
        raise TimeoutError(f"no (matching) series for {promql!r} in {timeout}s; last result {rows}; targets {health}")


def value(row: Mapping[str, Any]) -> float:
    """The float of an instant-query row (Prometheus sends values as strings)."""
    return float(row["value"][1])
