"""Weights & Biases: one run per training (spec.tracking.wandb), online or offline.

Runs on the trackers' thread (background.py), never on the training thread.
The run's id is chosen and kept in the checkpoint directory before the run is
opened, so every later process of the training (a torchrun restart, a stall
restart, a preemption) opens the same id with ``resume="allow"``. W&B keeps a
run's steps increasing and cannot replace a point, so a resumed process skips
the steps the run already holds (the steps after the last checkpoint, trained
again on the same data; the first attempt's values stay): online it asks the
server where the run stopped (``Run.starting_step``), offline it reads the
run's earlier files (wandb_log.py). Each step is in the run once.

Offline, each process writes its own folder, ``<checkpoint.dir>/wandb/
offline-run-<time>-<id>``; ``wandb sync`` of them all uploads one run.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsdp_api.contract import ENV_WANDB_API_KEY, WANDB_RUN_FILE, WANDB_SUBDIR
from fsdp_api.spec import WandbSpec
from fsdp_api.trainer_config import TrainerConfig

from .background import SampleRows
from .http_check import NoAnswer, ask, not_now
from .sample_text import SAMPLES_TAG
from .series import training_identity
from .wandb_log import LogReader, last_step, steps

# Unless the pod's env says otherwise (spec.env):
# - the client reports its own errors to Sentry (WANDB_ERROR_REPORTING, wandb/env.py):
#   a training pod talks to the tracking server it was given and nowhere else;
# - its system-metrics sampler also asks cloud metadata endpoints (the settings'
#   x_stats_*_base_url); the GPUs' and nodes' series are Prometheus's here
#   (docs/metrics.md). WANDB_X_DISABLE_STATS=false turns W&B's own charts back on.
# - the service writes an offline run's file every 15 s by default
#   (x_transaction_log_flush_interval): a killed process would lose up to 15 s of
#   points, steps before its last checkpoint among them, which the resumed process
#   does not log again. Every quarter second, and a checkpoint waits for it (``flush``).
CLIENT_DEFAULTS = {
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_X_DISABLE_STATS": "true",
    "WANDB_X_TRANSACTION_LOG_FLUSH_INTERVAL": "0.25",
}
# How long a checkpoint's flush waits for an offline run's file to hold its step.
FLUSH_WAIT_SECONDS = 4.0
FLUSH_POLL_SECONDS = 0.05
# The identity of the training, under this key of the run's config.
IDENTITY_KEY = "fsdp"
RUN_ID_LENGTH = 8

log = logging.getLogger(__name__)


class WandbTracker:
    name = "wandb"

    def __init__(self, spec: WandbSpec, cfg: TrainerConfig, folder: Path, *, fresh: bool) -> None:
        self.spec = spec
        self.cfg = cfg
        self.folder = folder  # W&B writes <folder>/wandb/...
        self.run_file = folder / WANDB_RUN_FILE
        self.fresh = fresh  # checkpoint.resume: never: each process starts the training, and a run, afresh
        self.url: str | None = None  # the run's page (online), once it is open
        self.logged_through = 0  # the run's last step, logged by an earlier process
        self._run: Any = None
        self._last_step = 0
        self._committed = 0  # the last step whose row W&B has been told is complete
        self._file: LogReader | None = None  # offline: this process's run file, read as it grows
        self._on_disk = 0  # offline: the last step that file holds

    @classmethod
    def from_config(cls, cfg: TrainerConfig) -> WandbTracker:
        spec = cfg.tracking.wandb
        assert spec is not None
        return cls(spec, cfg, Path(cfg.checkpoint.dir), fresh=cfg.checkpoint.resume == "never")

    # --- the Tracker protocol ---------------------------------------------------------------

    def write(self, step: int, values: Mapping[str, float]) -> None:
        if self._run is None:
            self._open()
        if step <= self.logged_through:
            return  # the run has this step from the process before: see the module's docstring
        if step <= self._committed:
            return  # W&B refuses points for a completed row (only a bug of ours would send them)
        self._run.log(dict(values), step=step)
        self._last_step = max(self._last_step, step)

    def write_samples(self, step: int, rows: SampleRows) -> None:
        if self._run is None:
            self._open()
        if step <= self.logged_through or step <= self._committed:
            return
        import wandb

        table = wandb.Table(columns=["prompt", "completion"], data=[list(row) for row in rows])
        self._run.log({SAMPLES_TAG: table}, step=step)
        self._last_step = max(self._last_step, step)

    def flush(self) -> None:
        """Complete the last step's row; offline, wait until the run's file holds it.

        Called at each checkpoint (background.Tracking.sync): a process killed later
        then loses only steps after the checkpoint, which the resumed one logs again.
        W&B completes a step's row when a later step arrives, so the last row is
        completed here; nothing for that step comes after a checkpoint.
        """
        if self._run is None or self._last_step <= self._committed:
            return
        self._run.log({}, step=self._last_step, commit=True)
        self._committed = self._last_step
        if self.spec.mode == "offline":
            self._wait_on_disk(self._last_step)

    def close(self) -> None:
        if self._run is None:
            return
        finished = self._last_step >= self.cfg.training.max_steps
        if not finished:
            self._run.mark_preempting()  # stopped early (SIGTERM, a failure): the next process resumes it
        self._run.finish(exit_code=0 if finished else 1)
        self._run = None

    # --- the run ----------------------------------------------------------------------------

    def _open(self) -> None:
        for name, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        import wandb

        kept = None if self.fresh else self._kept_id()
        run_id = kept or new_run_id()
        if not kept:
            self._keep(run_id)  # before the run exists: a crash during init still resumes this id
        server: dict[str, Any] = {"base_url": self.spec.base_url} if self.spec.base_url else {}
        # console off: rank 0's output stays the pod's log, not a copy W&B wraps and uploads.
        settings = wandb.Settings(console="off", silent=True, **server)
        self._run = wandb.init(
            project=self.spec.project,
            entity=self.spec.entity,
            name=self.spec.run_name or self.cfg.job.name,
            id=run_id,
            resume="allow",
            mode=self.spec.mode,
            dir=str(self.folder),
            config={**self.cfg.model_dump(by_alias=True, mode="json"), IDENTITY_KEY: training_identity(self.cfg)},
            settings=settings,
        )
        if kept:
            online = self._run.starting_step - 1 if self._run.starting_step else 0
            self.logged_through = max(online, last_step(self.folder / WANDB_SUBDIR, run_id))
        self.url = self._run.url if self.spec.mode == "online" else None
        if self.spec.mode == "offline":
            self._file = LogReader(Path(self._run.dir).parent / f"run-{run_id}.wandb")
        where = self.url or f"{self.folder / WANDB_SUBDIR} (offline run {run_id}; upload with `wandb sync`)"
        continued = f", continued after step {self.logged_through}" if self.logged_through else ""
        log.info("tracking: wandb run %s%s", where, continued)

    def _wait_on_disk(self, step: int) -> None:
        assert self._file is not None
        deadline = time.monotonic() + FLUSH_WAIT_SECONDS
        while self._on_disk < step and time.monotonic() < deadline:
            self._on_disk = max([self._on_disk, *steps(self._file.new_records())])
            if self._on_disk < step:
                time.sleep(FLUSH_POLL_SECONDS)

    def _kept_id(self) -> str | None:
        """The run an earlier process of this training opened, if it logged to the same project."""
        try:
            kept = json.loads(self.run_file.read_text())
        except (OSError, ValueError):
            return None
        same = kept.get("project") == self.spec.project and kept.get("entity") == self.spec.entity
        return kept.get("run_id") if same else None  # the spec moved the training to another project

    def _keep(self, run_id: str) -> None:
        self.run_file.parent.mkdir(parents=True, exist_ok=True)
        kept = {"run_id": run_id, "project": self.spec.project, "entity": self.spec.entity}
        tmp = self.run_file.with_name(f".{self.run_file.name}.tmp")
        tmp.write_text(json.dumps(kept) + "\n")
        tmp.replace(self.run_file)


def new_run_id() -> str:
    """A run id as W&B makes them: 8 base-36 digits."""
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
    return "".join(secrets.choice(alphabet) for _ in range(RUN_ID_LENGTH))


# --- the pod's check, before torchrun ---------------------------------------------------------

VIEWER_QUERY = b'{"query": "query Viewer { viewer { id } }"}'


def preflight(spec: WandbSpec, env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(errors, warnings): online, whether the key is there and the server takes it; offline, nothing to ask.

    The key is checked as W&B's client sends it: basic auth, user ``api``, to
    the server's GraphQL endpoint, asking who the key belongs to.
    """
    if spec.mode == "offline":
        return [], []
    key = env.get(ENV_WANDB_API_KEY, "")
    ref = spec.api_key_secret
    if not key:
        source = f"the Secret {ref.name!r}, key {ref.key!r}" if ref else ENV_WANDB_API_KEY
        why = "the Secret or its key is missing or empty"
        return [f"tracking.wandb.apiKeySecret: no W&B API key from {source} ({why})"], []
    from wandb.sdk.lib.urls import DEFAULT_BASE_URL

    base = (spec.base_url or env.get("WANDB_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
    where = f"tracking.wandb: the W&B server {base}"
    headers = {
        "Authorization": "Basic " + base64.b64encode(f"api:{key}".encode()).decode(),
        "Content-Type": "application/json",
    }
    try:
        answer = ask(f"{base}/graphql", where, headers=headers, data=VIEWER_QUERY)
    except NoAnswer as e:
        return e.problems()
    if warning := not_now(answer, where):
        return [], [warning]
    if answer.status in (401, 403):
        return [f"{where} refused the API key from {ref.name if ref else ENV_WANDB_API_KEY} (HTTP {answer.status})"], []
    if answer.status == 200 and _has_viewer(answer.body):
        return [], []
    return [f"{where} does not answer as a W&B server (HTTP {answer.status} from {base}/graphql)"], []


def _has_viewer(body: bytes) -> bool:
    try:
        return "viewer" in (json.loads(body).get("data") or {})
    except (ValueError, AttributeError):
        return False
