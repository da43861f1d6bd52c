"""Progress for Kubeflow Trainer: ``TrainJob.status.trainerStatus``, where the cluster enables it.

Trainer v2.3's TrainJobStatus plugin (alpha gate ``TrainJobStatus``) gives a
TrainJob's trainer containers the address of the controller's status server,
its CA, and a projected service-account token whose audience names the
TrainJob. Rank 0 posts the training's progress there (at most every
``POST_SECONDS``, at each checkpoint and at the end) as an
``UpdateTrainJobStatusRequest``; the server writes it into the TrainJob's status,
so the Kubeflow SDK and UI show our trainings like any other. Nothing to set in
the spec: the environment turns it on. It rides on the trackers' thread
(background.py), so a slow or absent server never slows a step.
"""

from __future__ import annotations

import json
import math
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from fsdp_api.contract import (
    ENV_KUBEFLOW_STATUS_CA,
    ENV_KUBEFLOW_STATUS_TOKEN,
    ENV_KUBEFLOW_STATUS_URL,
    STEP_DURATION,
)
from fsdp_api.trainer_config import TrainerConfig

from .background import PointsLost
from .series import series_tag

POST_SECONDS = 15.0
TIMEOUT_SECONDS = 5.0
# The server's limits (pkg/apis/trainer/v1alpha1/trainjob_types.go: Metric, TrainerStatus).
MAX_METRICS = 256
MAX_TEXT = 64
# Weight of the newest step in the step-time average behind the remaining time.
STEP_TIME_WEIGHT = 0.1
STEP_TIME_SERIES = series_tag(STEP_DURATION)


class TrainJobStatusReporter:
    name = "trainjob-status"

    def __init__(self, url: str, ca_file: Path, token_file: Path, max_steps: int) -> None:
        self.url = None  # no run page: the Tracker protocol's url is for trackers with one
        self.endpoint = url
        self.ca_file = ca_file
        self.token_file = token_file
        self.max_steps = max_steps
        self.step = 0
        self.values: dict[str, float] = {}
        self.step_seconds: float | None = None
        self._posted_at = 0.0
        self._posted_step = -1

    @classmethod
    def from_env(cls, cfg: TrainerConfig, env: Mapping[str, str]) -> TrainJobStatusReporter | None:
        url = env.get(ENV_KUBEFLOW_STATUS_URL)
        if not url:
            return None
        ca, token = env.get(ENV_KUBEFLOW_STATUS_CA, ""), env.get(ENV_KUBEFLOW_STATUS_TOKEN, "")
        return cls(url, Path(ca), Path(token), cfg.training.max_steps)

    # --- the Tracker protocol ---------------------------------------------------------------

    def write(self, step: int, values: Mapping[str, float]) -> None:
        if step > self.step:
            self.step = step
        self.values.update(values)
        seconds = values.get(STEP_TIME_SERIES)
        if seconds is not None and math.isfinite(seconds):
            last = self.step_seconds
            self.step_seconds = seconds if last is None else last + STEP_TIME_WEIGHT * (seconds - last)
        if time.monotonic() - self._posted_at >= POST_SECONDS:
            self.flush()

    def write_samples(self, step: int, rows: Sequence[tuple[str, str]]) -> None:
        """The TrainJob's status holds numbers only."""

    def flush(self) -> None:
        if self.step > self._posted_step:
            self._post()

    def close(self) -> None:
        self.flush()

    # --- the request ------------------------------------------------------------------------

    def status(self, now: datetime | None = None) -> dict[str, object]:
        """The ``trainerStatus`` of an UpdateTrainJobStatusRequest for what has been written so far."""
        status: dict[str, object] = {
            "progressPercentage": min(100, self.step * 100 // self.max_steps),
            "lastUpdatedTime": (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if self.step_seconds is not None:
            status["estimatedRemainingSeconds"] = round(max(0, self.max_steps - self.step) * self.step_seconds)
        metrics = [
            {"name": name[:MAX_TEXT], "value": f"{value:.6g}"}
            for name, value in sorted(self.values.items())
            if math.isfinite(value)
        ]
        if metrics:
            status["metrics"] = metrics[:MAX_METRICS]
        return status

    def _post(self) -> None:
        self._posted_at, self._posted_step = time.monotonic(), self.step
        body = json.dumps({"trainerStatus": self.status()}).encode()
        try:
            token = self.token_file.read_text().strip()  # projected: the kubelet renews it
            context = ssl.create_default_context(cafile=str(self.ca_file))
            request = urllib.request.Request(
                self.endpoint,
                data=body,
                method="POST",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS, context=context):
                pass
        except urllib.error.HTTPError as e:
            raise PointsLost(1, f"the TrainJob status server answered HTTP {e.code}: {_message(e)}") from e
        except (OSError, ssl.SSLError, ValueError) as e:
            raise PointsLost(1, f"the TrainJob status server: {type(e).__name__}: {e}") from e


def _message(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read()).get("message", ""))[:300]
    except (ValueError, AttributeError, OSError):
        return ""
