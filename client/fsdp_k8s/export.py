"""A training's export on the cluster: a Job that runs ``fsdp-train export`` where its checkpoints are.

``start_export`` renders the Job from the live FSDPTraining (the renderer's
``export_job``) and creates it; ``wait_export`` follows it to the end and
reads back its pod's last words: the export's output line, or its one-line
error.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsdp_api import FSDPTraining
from fsdp_api.object_keys import s3_uri_problem
from fsdp_api.spec.values import QUANTITY_PATTERN
from pydantic import ValidationError

from .errors import ClientError, WaitTimeout
from .kube import Json, core_path

if TYPE_CHECKING:
    from .client import Client

# The label the Job controller puts on a Job's pods (Kubernetes >= 1.27; older ones set job-name only).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_JOB_NAME_LABEL = "job-name"


@dataclass(frozen=True)
class ExportResult:
    """How an export Job ended: ``output`` written, or ``message`` saying why not."""

    job: str
    namespace: str
    output: str
    succeeded: bool
    message: str


def jobs_path(namespace: str, name: str | None = None) -> str:
    return f"/apis/batch/v1/namespaces/{namespace}/jobs" + (f"/{name}" if name else "")


def start_export(
    client: Client,
    name: str,
    to: str,
    *,
    step: int | None = None,
    dtype: str = "float32",
    fmt: str = "merged",
    memory: str | None = None,
) -> str:
    """Create the export Job of training ``name``; its name. ``ClientError`` in one line when it cannot be."""
    from fsdp_operator.render.export_job import ExportRefused, export_job

    problem = s3_uri_problem(to)
    if problem is not None:
        raise ClientError(f"--to: {to} {problem}: the export Job writes to S3 (a new prefix)")
    if memory is not None and re.fullmatch(QUANTITY_PATTERN, memory) is None:
        raise ClientError(f"--memory: {memory!r} is not a Kubernetes quantity (e.g. 64Gi)")
    training = client.get(name)
    body = training.body
    try:
        model = FSDPTraining.model_validate(
            {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "metadata": {"name": training.name, "namespace": training.namespace},
                "spec": body.get("spec") or {},
            }
        )
    except ValidationError as e:  # a spec this client's version does not know (a newer operator's)
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        why = f"its spec is not one this client reads: {where}: {first['msg']} (use the operator's version's client)"
        raise ClientError(f"{training.namespace}/{training.name}: {why}") from None
    suffix = time.strftime("%Y%m%d%H%M%S", time.gmtime())
    try:
        job = export_job(model, to, suffix=suffix, step=step, dtype=dtype, fmt=fmt, memory=memory, uid=_uid(body))
    except ExportRefused as e:
        raise ClientError(f"{training.namespace}/{training.name}: {e}") from None
    created = client.api.create(jobs_path(training.namespace), job)
    return str(created["metadata"]["name"])


def wait_export(client: Client, job: str, *, timeout: float = 3600.0, poll_seconds: float = 2.0) -> ExportResult:
    """Follow export Job ``job`` (in the client's namespace) until it ends; ``WaitTimeout`` past ``timeout``."""
    namespace = client.namespace
    deadline = time.monotonic() + timeout
    while True:
        body = client.api.get(jobs_path(namespace, job))
        ended = _ended(body)
        if ended is not None:
            annotations = body["metadata"].get("annotations") or {}
            output = next((v for k, v in annotations.items() if k.endswith("/export-output")), "")
            return ExportResult(job, namespace, output, ended, _last_words(client, namespace, job))
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"export Job {namespace}/{job} did not finish within {timeout:g} s")
        time.sleep(poll_seconds)


def _uid(body: Json) -> str | None:
    uid = body["metadata"].get("uid")
    return str(uid) if uid else None


def _ended(job: Json) -> bool | None:
    """True: complete; False: failed; None: still running."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            return cond["type"] == "Complete"
    return None


def _last_words(client: Client, namespace: str, job: str) -> str:
    """The export pod's termination message (its last log lines), or its log's tail."""
    pods = client.api.list(core_path("pods", namespace), label_selector=f"{JOB_NAME_LABEL}={job}")
    pods = pods or client.api.list(core_path("pods", namespace), label_selector=f"{LEGACY_JOB_NAME_LABEL}={job}")
    if not pods:
        return "its pod is gone"
    pod = pods[-1]
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        message = ((status.get("state") or {}).get("terminated") or {}).get("message")
        if message:
            return str(message).strip()
    try:
        path = core_path("pods", namespace, pod["metadata"]["name"], "log")
        return client.api.text(path, {"tailLines": 20}).strip()
    except ClientError as e:
        return f"its log cannot be read: {e}"
