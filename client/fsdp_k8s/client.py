"""``Client``: an FSDPTraining from a notebook, checked here first, then submitted, watched and read back.

The offline half (``validate``, ``plan``, ``render``, ``run_local``) is the
CLI's own code; the cluster half talks to the API server with the user's
kubeconfig (or the pod's service account) and reads what the operator writes
into the status, the trainer's log and its metrics.
"""

from __future__ import annotations

import builtins
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import yaml
from fsdp_api import GROUP, KIND, PLURAL, VERSION, FSDPTraining
from fsdp_api.contract import LABEL_NODE_RANK
from fsdp_api.documents import Document, InputError, parse, read_documents, without_nulls

from .errors import ApiError, ClientError, InvalidTraining, WaitTimeout
from .export import ExportResult, start_export, wait_export
from .kube import Json, KubeApi, core_path, group_path
from .kubeconfig import Connection, load_connection
from .metrics import TrainerMetrics
from .training import TERMINAL_PHASES, Training

if TYPE_CHECKING:
    from fsdp_api.memory_plan import MemoryPlan

TrainingInput = FSDPTraining | Mapping[str, Any] | str | os.PathLike[str]
MemoryCheck = Literal["warn", "refuse", "off"]
# How long one metrics read may take through the API server, then straight from the pod.
METRICS_TIMEOUT_SECONDS = 10.0
DIRECT_METRICS_TIMEOUT_SECONDS = 3.0


class MemoryWarning(UserWarning):
    """The training's memory plan says it does not fit its GPUs (``fsdp-operator plan``)."""


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the training or its job, oldest first in ``Client.events``."""

    time: str
    type: str
    reason: str
    object: str
    message: str
    count: int = 1


def load_training(training: TrainingInput) -> tuple[FSDPTraining, Json]:
    """The validated model and the body to send (the user's own, without nulls, as ``kubectl apply`` sends it)."""
    if isinstance(training, FSDPTraining):
        body = training.model_dump(by_alias=True, exclude_none=True, exclude_unset=True, mode="json")
        body.update(apiVersion=training.api_version, kind=training.kind)
        return training, body
    if isinstance(training, Mapping):
        try:
            model, problems = parse(Document("<training>", 1, dict(training)))
        except InputError as e:
            raise InvalidTraining([str(e)]) from None
        if model is None:
            raise InvalidTraining(problems)
        return model, without_nulls(dict(training))
    try:
        docs = read_documents(str(training))
        if len(docs) != 1:
            raise InputError(f"{training}: expected one {KIND} document, the file has {len(docs)}")
        model, problems = parse(docs[0])
    except InputError as e:
        raise InvalidTraining([str(e)]) from None
    if model is None:
        raise InvalidTraining(problems)
    return model, without_nulls(docs[0].body)


class Client:
    """FSDPTrainings in one namespace of one cluster.

    ``namespace``: default the kubeconfig context's (or the pod's own).
    ``kubeconfig``/``context``: default ``$KUBECONFIG`` or ``~/.kube/config`` and
    its current context; inside a pod without one, the pod's service account.
    Nothing is read until the first call that needs the cluster, so the
    offline methods work on a laptop with no kubeconfig.
    """

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        connection: Connection | None = None,
    ) -> None:
        self._namespace = namespace
        self._kubeconfig = kubeconfig
        self._context = context
        self._connection = connection
        self._api: KubeApi | None = None

    # --- the connection ---------------------------------------------------------------

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            self._api = KubeApi(self._connection or load_connection(self._kubeconfig, self._context))
        return self._api

    @property
    def namespace(self) -> str:
        return self._namespace or self.api.connection.namespace

    def _path(self, name: str | None = None, sub: str | None = None, namespace: str | None = None) -> str:
        return group_path(GROUP, VERSION, PLURAL, namespace or self.namespace, name, sub)

    # --- offline: the CLI's checks, on Python objects ------------------------------------

    def validate(self, training: TrainingInput, memory: MemoryCheck = "warn") -> FSDPTraining:
        """The training as the API server would accept it; ``InvalidTraining`` names every problem.

        ``memory``: a plan that does not fit its GPUs warns (``MemoryWarning``),
        refuses (``InvalidTraining``) or is not checked (``off``).
        """
        model, _ = load_training(training)
        self._check_memory(model, memory)
        return model

    def plan(self, training: TrainingInput) -> MemoryPlan:
        """The per-GPU memory plan (``fsdp-operator plan``): ``.fits``, ``.summary()``, ``.to_dict()``."""
        from fsdp_api.memory_plan import plan_memory

        return plan_memory(load_training(training)[0].spec)

    def render(self, training: TrainingInput) -> list[Json]:
        """The objects the operator creates for it (``fsdp-operator render``)."""
        from fsdp_operator.render import render

        model, _ = load_training(training)
        if not model.metadata.name:
            raise InvalidTraining([f"every {KIND} needs metadata.name to be rendered"])
        return render(model)

    def run_local(
        self,
        training: TrainingInput,
        *,
        nproc: int = 2,
        steps: int | None = None,
        output_dir: str | os.PathLike[str] | None = None,
    ) -> int:
        """Train it on this machine's CPU (``fsdp-operator run-local``); torchrun's exit code."""
        from fsdp_operator.local import run_local

        _, body = load_training(training)
        with tempfile.TemporaryDirectory(prefix="fsdp-k8s-local-") as tmp:
            spec_file = Path(tmp) / "training.yaml"
            spec_file.write_text(yaml.safe_dump(body, sort_keys=False))
            try:
                return run_local(
                    spec_file, nproc=nproc, output_dir=Path(output_dir) if output_dir else None, steps=steps
                )
            except InputError as e:
                raise InvalidTraining([str(e)]) from None

    def _check_memory(self, model: FSDPTraining, memory: MemoryCheck) -> None:
        if memory == "off":
            return
        from fsdp_api.memory_plan import plan_memory

        plan = plan_memory(model.spec)
        if plan.fits is False:
            line = f"{KIND} {model.metadata.name or model.metadata.generate_name!r}: {plan.summary()}"
            if memory == "refuse":
                raise InvalidTraining([line])
            warnings.warn(line, MemoryWarning, stacklevel=3)

    # --- the cluster ---------------------------------------------------------------------

    def submit(self, training: TrainingInput, memory: MemoryCheck = "warn") -> Training:
        """Create it (validated here first, so a mistake costs no API call and no GPU); the created training."""
        model, body = load_training(training)
        self._check_memory(model, memory)
        meta = body.setdefault("metadata", {})
        namespace = meta.get("namespace") or self.namespace
        if self._namespace and meta.get("namespace") and meta["namespace"] != self._namespace:
            raise InvalidTraining(
                [f"metadata.namespace is {meta['namespace']!r}, and this client works in {self._namespace!r}"]
            )
        meta["namespace"] = namespace
        return Training.of(self.api.create(self._path(namespace=namespace), body))

    def get(self, name: str) -> Training:
        try:
            return Training.of(self.api.get(self._path(name)))
        except ApiError as e:
            if e.status == 404:
                raise ClientError(f"{KIND} {self.namespace}/{name} not found") from None
            raise

    # From here on, ``list`` in the class body names this method: later annotations say builtins.list.
    def list(self) -> list[Training]:
        return [Training.of(body) for body in self.api.list(self._path())]

    def wait(
        self,
        name: str,
        phases: Iterable[str] = TERMINAL_PHASES,
        *,
        timeout: float = 3600.0,
        poll_seconds: float = 2.0,
        progress: bool | Callable[[Training], None] = False,
    ) -> Training:
        """Poll until the training reaches one of ``phases``; it, or ``WaitTimeout`` naming where it stood.

        A training that fails while waiting for another phase raises
        ``ClientError`` with the operator's message. ``progress``: True shows a
        bar (tqdm, in a terminal or a notebook) or a line per change; a
        callable gets each new state.
        """
        wanted = tuple(phases)
        show = progress if callable(progress) else (_ProgressDisplay(name) if progress else None)
        deadline = time.monotonic() + timeout
        last: Training | None = None
        try:
            while True:
                current = self.get(name)
                if show is not None and (last is None or current.summary() != last.summary()):
                    show(current)
                last = current
                if current.phase in wanted:
                    return current
                if current.phase == "Failed":
                    raise ClientError(f"{KIND} {self.namespace}/{name} failed: {current.status.message}")
                if time.monotonic() >= deadline:
                    raise WaitTimeout(
                        f"{KIND} {self.namespace}/{name} did not reach {' or '.join(wanted)} within {timeout:g} s: "
                        f"{current.summary()}"
                    )
                time.sleep(poll_seconds)
        finally:
            if isinstance(show, _ProgressDisplay):
                show.close()

    def suspend(self, name: str) -> Training:
        """Stop its pods (the trainer saves a checkpoint on SIGTERM); ``resume`` continues from it."""
        return self._set_suspend(name, True)

    def resume(self, name: str) -> Training:
        return self._set_suspend(name, False)

    def _set_suspend(self, name: str, suspend: bool) -> Training:
        self.get(name)  # a clear "not found" before the patch
        return Training.of(self.api.merge_patch(self._path(name), {"spec": {"suspend": suspend}}))

    def delete(self, name: str, *, wait: bool = False, timeout: float = 120.0) -> None:
        """Delete it; its job, pods and ConfigMap go with it, the checkpoint volume stays."""
        try:
            self.api.delete(self._path(name))
        except ApiError as e:
            if e.status == 404:
                raise ClientError(f"{KIND} {self.namespace}/{name} not found") from None
            raise
        deadline = time.monotonic() + timeout
        while wait and self.api.get_or_none(self._path(name)) is not None:
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"{KIND} {self.namespace}/{name} still exists {timeout:g} s after its deletion")
            time.sleep(0.5)

    # --- its export -------------------------------------------------------------------------

    def export(
        self,
        name: str,
        to: str,
        *,
        step: int | None = None,
        dtype: str = "float32",
        fmt: str = "merged",
        memory: str | None = None,
        wait: bool = True,
        timeout: float = 3600.0,
    ) -> ExportResult | str:
        """Export its newest (or ``step``'s) checkpoint as a Hugging Face model under ``to`` (s3://...), in a Job.

        With ``wait`` the Job's end (``ExportResult``), else the Job's name (``wait_export`` follows it).
        """
        job = start_export(self, name, to, step=step, dtype=dtype, fmt=fmt, memory=memory)
        return self.wait_export(job, timeout=timeout) if wait else job

    def wait_export(self, job: str, *, timeout: float = 3600.0) -> ExportResult:
        return wait_export(self, job, timeout=timeout)

    # --- what its pods say ------------------------------------------------------------------

    def pods(self, name: str) -> builtins.list[Json]:
        """The training's trainer pods, by pod index (several of one index while a restarted one replaces another)."""
        return self._pods(self.get(name))

    def pod(self, name: str, rank: int = 0) -> Json:
        """The newest pod of node rank ``rank``; ``ClientError`` saying where the training stands when it has none.

        The node rank is torchrun's, which is not the pod's index: its c10d
        rendezvous numbers the nodes in the order of their host names and
        process ids. Where the job has several pods, the one whose metrics
        carry ``node_rank="<rank>"`` is it; before any serves them, the pod
        of that index.
        """
        return self._pod(self.get(name), rank)

    def _pods(self, training: Training) -> builtins.list[Json]:
        backend = training.backend
        pods = self.api.list(
            core_path("pods", training.namespace), label_selector=f"{backend.job_label}={training.job_name}"
        )
        return sorted(pods, key=lambda p: (_rank_of(p, backend.index_label), _created(p)))

    def _pod(self, training: Training, rank: int) -> Json:
        return self._pod_and_metrics(training, rank)[0]

    def _pod_and_metrics(self, training: Training, rank: int) -> tuple[Json, TrainerMetrics | None]:
        """The pod of node rank ``rank``, and its metrics where they were read to find it."""
        pods = self._pods(training)
        index = training.backend.index_label
        newest = {_rank_of(p, index): p for p in pods}  # sorted by creation within an index: the last one wins
        if len(newest) > 1 and self._metrics_port(training) is not None:
            # The pod of that index first: on most clusters the host names sort like the indices.
            for pod in sorted(newest.values(), key=lambda p: _rank_of(p, index) != rank):
                try:
                    figures = self._read_metrics(training, pod)
                except ClientError:
                    continue
                if any(s.rank[0] == rank for s in figures.samples if LABEL_NODE_RANK in s.labels):
                    return pod, figures
        if rank not in newest:
            raise ClientError(
                f"{KIND} {training.namespace}/{training.name} has no pod of node rank {rank} now ({training.summary()})"
            )
        return newest[rank], None

    @overload
    def logs(
        self, name: str, rank: int = 0, *, follow: Literal[False] = False, tail_lines: int | None = None
    ) -> str: ...

    @overload
    def logs(
        self, name: str, rank: int = 0, *, follow: Literal[True], tail_lines: int | None = None
    ) -> Iterator[str]: ...

    def logs(
        self, name: str, rank: int = 0, *, follow: bool = False, tail_lines: int | None = None
    ) -> str | Iterator[str]:
        """The trainer's log on node rank ``rank`` (one pod holds all its GPUs' ranks).

        ``follow``: an iterator of lines as they come, until the container ends.
        """
        training = self.get(name)
        pod = self._pod(training, rank)
        container = training.backend.container
        path = core_path("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], "log")
        query = {"container": container, "tailLines": tail_lines}
        if follow:
            return self.api.lines(path, {**query, "follow": True})
        return self.api.text(path, query)

    def metrics(self, name: str) -> TrainerMetrics:
        """Node rank 0's Prometheus series (the ones the operator reads): ``.step``, ``.loss``, ``.as_dict()``.

        Read through the API server's pod proxy (works from outside the cluster,
        needs ``pods/proxy``), else from the pod's address (inside the cluster).
        """
        training = self.get(name)
        if self._metrics_port(training) is None:
            raise ClientError(f"{KIND} {training.namespace}/{name} has spec.metrics.enabled: false")
        pod, figures = self._pod_and_metrics(training, 0)
        return figures if figures is not None else self._read_metrics(training, pod)

    def _metrics_port(self, training: Training) -> int | None:
        """The trainer's metrics port; None where ``spec.metrics.enabled`` is false."""
        metrics = (training.body.get("spec") or {}).get("metrics") or {}
        if metrics.get("enabled") is False:
            return None
        from fsdp_api.contract import METRICS_PORT

        return int(metrics.get("port", METRICS_PORT))

    def _read_metrics(self, training: Training, pod: Json) -> TrainerMetrics:
        port = self._metrics_port(training)
        assert port is not None
        meta = pod["metadata"]
        proxy = core_path("pods", meta["namespace"], f"{meta['name']}:{port}", "proxy/metrics")
        try:
            return TrainerMetrics.parse(self.api.text(proxy, timeout=METRICS_TIMEOUT_SECONDS))
        except ClientError as proxied:
            ip = (pod.get("status") or {}).get("podIP")
            if not ip:
                raise ClientError(f"cannot read the metrics of {meta['name']}: {proxied}") from None
            try:
                return TrainerMetrics.parse(_direct_metrics(ip, port))
            except ClientError as direct:
                raise ClientError(
                    f"cannot read the metrics of {meta['name']}: through the API server: {proxied}; "
                    f"from {ip}:{port}: {direct}"
                ) from None

    def events(self, name: str) -> builtins.list[Event]:
        """The Events about the training and its job, oldest first: what ``kubectl describe`` lists."""
        training = self.get(name)
        out = []
        for involved in sorted({name, training.job_name}):
            found = self.api.list(
                core_path("events", training.namespace), field_selector=f"involvedObject.name={involved}"
            )
            out += [_event(e) for e in found]
        return sorted(out, key=lambda e: e.time)


def _created(pod: Json) -> str:
    return str(pod["metadata"].get("creationTimestamp", ""))


def _rank_of(pod: Json, label: str) -> int:
    try:
        return int((pod["metadata"].get("labels") or {}).get(label, "-1"))
    except ValueError:
        return -1


def _direct_metrics(ip: str, port: int) -> str:
    import urllib.error
    import urllib.request

    host = f"[{ip}]" if ":" in ip else ip
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=DIRECT_METRICS_TIMEOUT_SECONDS) as r:
            return r.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        raise ClientError(str(getattr(e, "reason", e))) from None


def _event(e: Json) -> Event:
    involved = e.get("involvedObject") or {}
    when = e.get("lastTimestamp") or e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp") or ""
    return Event(
        time=str(when),
        type=str(e.get("type", "")),
        reason=str(e.get("reason", "")),
        object=f"{involved.get('kind', '?')}/{involved.get('name', '?')}",
        message=str(e.get("message", "")),
        count=int(e.get("count") or 1),
    )


class _ProgressDisplay:
    """A tqdm bar over the steps where tqdm is installed (tqdm.auto: a widget in a notebook); else a line per change."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.bar: Any = None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            self._tqdm = None
        else:
            self._tqdm = tqdm

    def __call__(self, training: Training) -> None:
        if self._tqdm is None:
            print(training.summary(), file=sys.stderr, flush=True)
            return
        if self.bar is None:
            self.bar = self._tqdm(total=training.max_steps, desc=self.name, unit="step")
        step = training.status.step or 0
        self.bar.update(max(0, step - self.bar.n))
        post = {"phase": training.phase}
        if training.status.loss is not None:
            post["loss"] = f"{training.status.loss:.4f}"
        self.bar.set_postfix(post, refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
