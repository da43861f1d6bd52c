"""MLflow: one run per training on a tracking server (spec.tracking.mlflow).

Runs on the trackers' thread (background.py), never on the training thread.
The run's id is kept in the checkpoint directory the moment the run is made,
so every later process of the training (a torchrun restart, a stall restart,
a preemption) logs to the same run. MLflow cannot replace a point, so a
resumed process skips the steps the run already holds: those are the steps
after the last checkpoint, which it trains again on the same data; the first
attempt's values stay. Each step is in the run once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsdp_api.contract import LOSS, MLFLOW_RUN_FILE
from fsdp_api.spec import MlflowSpec
from fsdp_api.trainer_config import TrainerConfig

from .background import PointsLost, SampleRows
from .http_check import NoAnswer, ask, not_now
from .sample_text import artifact_name, markdown_table
from .series import series_tag, training_identity

# MLflow's own limits on one log-batch request (mlflow/utils/validation.py).
MAX_METRICS_PER_REQUEST = 1000
MAX_PARAMS_PER_REQUEST = 100
MAX_PARAM_LENGTH = 6000
# Unless the pod's env says otherwise:
# - the client retries a failed request 7 times with a doubling backoff and waits
#   120 s for an answer (mlflow/environment_variables.py): minutes per batch while
#   a server is down. Fewer and shorter: the points wait in the queue meanwhile,
#   and close() has 30 s;
# - the client reports usage to mlflow-telemetry.io (mlflow/telemetry/): a training
#   pod talks to the tracking server it was given and nowhere else.
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
# The series whose last step tells how far an earlier process logged: every step has it.
PROGRESS_SERIES = series_tag(LOSS)
TAG_PREFIX = "fsdp."

log = logging.getLogger(__name__)


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"training": {"lr": 3e-4}}`` → ``{"training.lr": "0.0003"}``, each value cut to MLflow's limit."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            text = json.dumps(value) if isinstance(value, list | dict) else str(value)
            out[name] = text[:MAX_PARAM_LENGTH]
    return out


class MlflowTracker:
    name = "mlflow"

    def __init__(self, spec: MlflowSpec, cfg: TrainerConfig, run_file: Path, *, fresh: bool) -> None:
        self.spec = spec
        self.cfg = cfg
        self.run_file = run_file
        self.fresh = fresh  # checkpoint.resume: never: each process starts the training, and a run, afresh
        self.run_id: str | None = None
        self.url: str | None = None  # the run's page, once it is open (the status shows it)
        self.logged_through = 0  # the run's last step, logged by an earlier process
        self._client: Any = None
        self._pending: list[Any] = []  # mlflow Metric entities not sent yet
        self._pending_points = 0
        self._sent_at = 0.0
        self._last_step = 0

    @classmethod
    def from_config(cls, cfg: TrainerConfig) -> MlflowTracker:
        spec = cfg.tracking.mlflow
        assert spec is not None
        run_file = Path(cfg.checkpoint.dir) / MLFLOW_RUN_FILE
        return cls(spec, cfg, run_file, fresh=cfg.checkpoint.resume == "never")

    # --- the Tracker protocol ---------------------------------------------------------------

    def write(self, step: int, values: Mapping[str, float]) -> None:
        if self.run_id is None:
            self._open()
        if step <= self.logged_through:
            return  # the run has this step from the process before: see the module's docstring
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending += [Metric(key=tag, value=value, timestamp=now, step=step) for tag, value in values.items()]
        self._pending_points += 1
        self._last_step = max(self._last_step, step)
        if len(self._pending) >= MAX_METRICS_PER_REQUEST or time.monotonic() - self._sent_at >= self.spec.flush_seconds:
            self.flush()

    def write_samples(self, step: int, rows: SampleRows) -> None:
        if self.run_id is None:
            self._open()
        if step <= self.logged_through:
            return
        # An artifact of the run (MLflow shows Markdown files), one per step.
        self._client.log_text(self.run_id, markdown_table(step, rows), artifact_name(step))

    def flush(self) -> None:
        if not self._pending:
            return
        batch, points = self._pending, self._pending_points
        self._pending, self._pending_points, self._sent_at = [], 0, time.monotonic()
        try:
            for start in range(0, len(batch), MAX_METRICS_PER_REQUEST):
                self._client.log_batch(self.run_id, metrics=batch[start : start + MAX_METRICS_PER_REQUEST])
        except Exception as e:
            raise PointsLost(points, f"{type(e).__name__}: {first_line(e)}") from e

    def close(self) -> None:
        if self.run_id is None:
            return
        self.flush()  # a server that is down fails here, and is not asked again to end the run
        # KILLED: the process stopped early (SIGTERM, a failure); the one that resumes sets RUNNING again.
        finished = self._last_step >= self.cfg.training.max_steps
        self._client.set_terminated(self.run_id, "FINISHED" if finished else "KILLED")

    # --- the run ----------------------------------------------------------------------------

    def _open(self) -> None:
        for name, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient

        self._client = self._client or MlflowClient(tracking_uri=self.spec.uri)
        kept = None if self.fresh else self._kept_run()
        run_id, experiment = kept or self._new_run()
        if kept:
            history = self._client.get_metric_history(run_id, PROGRESS_SERIES)
            self.logged_through = max((m.step for m in history), default=0)
            self._client.update_run(run_id, status="RUNNING")
        self.run_id, self._sent_at = run_id, time.monotonic()
        self.url = f"{self.spec.uri.rstrip('/')}/#/experiments/{experiment}/runs/{run_id}"
        continued = f", continued after step {self.logged_through}" if self.logged_through else ""
        log.info("tracking: mlflow run %s%s", self.url, continued)

    def _kept_run(self) -> tuple[str, str] | None:
        """The run an earlier process of this training made, if it is still there to continue."""
        try:
            kept = json.loads(self.run_file.read_text())
        except (OSError, ValueError):
            return None
        if kept.get("uri") != self.spec.uri or kept.get("experiment") != self.spec.experiment:
            return None  # the spec moved the training to another server or experiment
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(kept["run_id"])
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None  # deleted on the server for good
            raise  # the server had a bad moment: opening again later must not start a second run
        return None if run.info.lifecycle_stage == "deleted" else (run.info.run_id, run.info.experiment_id)

    def _new_run(self) -> tuple[str, str]:
        """A new run, kept for later processes, with the config as params: (run id, experiment id)."""
        experiment = self._client.get_experiment_by_name(self.spec.experiment)
        if experiment is None or experiment.lifecycle_stage == "deleted":
            experiment_id = self._client.create_experiment(self.spec.experiment)
        else:
            experiment_id = experiment.experiment_id
        run = self._client.create_run(experiment_id, run_name=self.spec.run_name or self.cfg.job.name, tags=self.tags())
        run_id = run.info.run_id
        self._keep(run_id)
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flat_params(self.cfg.model_dump(by_alias=True, mode="json")).items()]
        for start in range(0, len(params), MAX_PARAMS_PER_REQUEST):
            self._client.log_batch(run_id, params=params[start : start + MAX_PARAMS_PER_REQUEST])
        return run_id, experiment_id

    def _keep(self, run_id: str) -> None:
        """Write the run's id next to the checkpoints at once: a crash before the first save still resumes it."""
        self.run_file.parent.mkdir(parents=True, exist_ok=True)
        kept = {"run_id": run_id, "uri": self.spec.uri, "experiment": self.spec.experiment}
        tmp = self.run_file.with_name(f".{self.run_file.name}.tmp")
        tmp.write_text(json.dumps(kept) + "\n")
        tmp.replace(self.run_file)

    def tags(self) -> dict[str, str]:
        return {f"{TAG_PREFIX}{k}": v for k, v in training_identity(self.cfg).items()}


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


# --- the pod's check, before torchrun ---------------------------------------------------------


def preflight(spec: MlflowSpec, env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the server, asked once as the client would ask it.

    A name that does not resolve, credentials refused, or an answer that is not
    MLflow's are errors: they stay wrong however long the training waits. A
    server that does not answer now is a warning (http_check.py).
    """
    import urllib.parse

    query = urllib.parse.urlencode({"experiment_name": spec.experiment})
    url = f"{spec.uri.rstrip('/')}/api/2.0/mlflow/experiments/get-by-name?{query}"
    where = f"tracking.mlflow.uri {spec.uri}"
    insecure = env.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true"
    try:
        answer = ask(url, where, headers=_auth_headers(env), insecure=insecure)
    except NoAnswer as e:
        return e.problems()
    if warning := not_now(answer, where):
        return [], [warning]
    body, status = answer.body, answer.status
    if status in (401, 403):
        sent = _auth_headers(env).get("Authorization", "").split(" ")[0]
        how = {
            "Basic": "MLFLOW_TRACKING_USERNAME/PASSWORD",
            "Bearer": "MLFLOW_TRACKING_TOKEN",
            "": "a request without credentials (set MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD, from a Secret in spec.env)",
        }[sent]
        return [f"{where} refused {how} (HTTP {status})"], []
    if status == 200 or (status == 404 and _error_code(body) == "RESOURCE_DOES_NOT_EXIST"):
        return [], []
    return [f"{where} does not answer as an MLflow tracking server (HTTP {status} from {url})"], []


def _auth_headers(env: Mapping[str, str]) -> dict[str, str]:
    """The header MLflow's client sends for the same variables, basic first (mlflow/utils/rest_utils.py)."""
    import base64

    user, password = env.get("MLFLOW_TRACKING_USERNAME"), env.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    if token := env.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {token}"}
    return {}


def _error_code(body: bytes) -> str | None:
    try:
        return json.loads(body).get("error_code")
    except (ValueError, AttributeError):
        return None
