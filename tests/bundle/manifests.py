"""Build the deployable bundle with the real tools and walk the objects it yields.

Every manifest the project ships is produced here the way a user produces it:
``kubectl kustomize`` for the overlays, ``helm template`` for the chart, the
project's renderer for FSDPTraining examples. Builds are cached per session
because several test modules inspect the same output.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from fsdp_localcluster.binaries import tool_path

REPO_ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO_ROOT / "kustomize"
CHART = REPO_ROOT / "charts" / "fsdp-operator"
MONITORING = KUSTOMIZE / "components" / "monitoring"
DASHBOARD = MONITORING / "dashboards" / "fsdp-training.json"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
FSDP_SOURCE = KUSTOMIZE / "overlays" / "fsdp" / "source" / "fsdptraining.yaml"

# Overlays a user applies with `kubectl kustomize DIR | kubectl apply -f -`.
OVERLAYS = (
    "default",
    "overlays/clusterwide",
    "overlays/fsdp",
    "overlays/karpenter",
    "overlays/monitoring",
    "overlays/operator-with-monitoring",
    "overlays/trainjob",
    "overlays/trainer-v2-only",
)

Obj = dict[str, Any]


def run(cmd: Sequence[str | Path], *, cwd: Path = REPO_ROOT, input: str | None = None) -> str:
    """Run a tool; on failure raise with its stderr so the test output says why."""
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, input=input, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {res.returncode}\n{res.stderr}\n{res.stdout}")
    return res.stdout


# libyaml's loader when PyYAML was built with it: the CRDs make these builds large.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_all(text: str) -> list[Obj]:
    return [d for d in yaml.load_all(text, Loader=_Loader) if d]


@functools.cache
def kustomize_text(path: str) -> str:
    return run([tool_path("kubectl"), "kustomize", KUSTOMIZE / path])


def kustomize(path: str) -> list[Obj]:
    """Objects of ``kubectl kustomize kustomize/<path>`` (fresh copies: callers may mutate them)."""
    return load_all(kustomize_text(path))


def helm_args(values: Mapping[str, str] | None = None, namespace: str | None = None) -> list[str]:
    args = [f"--namespace={namespace}"] if namespace else []
    for key, value in (values or {}).items():
        args += ["--set", f"{key}={value}"]
    return args


@functools.cache
def _helm_template(release: str, args: tuple[str, ...]) -> str:
    return run([tool_path("helm"), "template", release, CHART, *args])


def helm_template(
    values: Mapping[str, str] | None = None,
    *,
    namespace: str | None = None,
    release: str = "fsdp-operator",
    include_crds: bool = False,
) -> list[Obj]:
    args = helm_args(values, namespace) + (["--include-crds"] if include_crds else [])
    return load_all(_helm_template(release, tuple(args)))


def render_training(path: Path) -> list[Obj]:
    """The renderer's objects for the FSDPTraining(s) in ``path``."""
    from fsdp_api import FSDPTraining
    from fsdp_operator.render import render

    out: list[Obj] = []
    for doc in load_all(path.read_text()):
        if doc.get("kind") == "FSDPTraining":
            out += render(FSDPTraining.model_validate(doc))
    return out


def example_files() -> list[Path]:
    """FSDPTraining examples shipped with the project (whatever examples/ holds, plus the overlay's source)."""
    examples = sorted((REPO_ROOT / "examples").glob("*.yaml"))
    own_script = REPO_ROOT / "examples" / "your-own-script" / "fsdptraining.yaml"
    return [p for p in [*examples, own_script, FSDP_SOURCE] if "kind: FSDPTraining" in p.read_text()]


# --- walking objects -------------------------------------------------------------


def pod_specs(obj: Obj) -> Iterator[tuple[str, Obj]]:
    """(where, pod spec) for every pod template in ``obj``, whatever its kind."""
    kind = obj.get("kind", "")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        yield "", spec
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield "spec.template.spec", spec["template"]["spec"]
    elif kind == "CronJob":
        yield "spec.jobTemplate.spec.template.spec", spec["jobTemplate"]["spec"]["template"]["spec"]
    elif kind == "PyTorchJob":
        for role, replica in (spec.get("pytorchReplicaSpecs") or {}).items():
            yield f"spec.pytorchReplicaSpecs.{role}.template.spec", replica["template"]["spec"]


def containers(obj: Obj) -> Iterator[tuple[str, Obj, Obj]]:
    """(where, container, pod spec) for every container and init container of ``obj``."""
    for where, pod in pod_specs(obj):
        for field in ("initContainers", "containers"):
            for c in pod.get(field) or []:
                yield f"{where}.{field}[{c.get('name')}]", c, pod


def ident(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind')} {ns}{meta.get('name')}"


# Labels/annotations that only say "Helm made this"; the kustomize build has none of them.
HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "app.kubernetes.io/instance",
)
HELM_ANNOTATIONS = ("helm.sh/resource-policy", "meta.helm.sh/release-name", "meta.helm.sh/release-namespace")


def strip_helm(obj: Any) -> Any:
    """A copy of ``obj`` without Helm's bookkeeping labels and annotations, at every depth
    (pod templates and selectors carry labels too)."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            # A Service's spec.selector is a plain label map too.
            plain_selector = (
                key == "selector" and isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
            )
            if (key in ("labels", "annotations", "matchLabels") or plain_selector) and isinstance(value, dict):
                drop = HELM_LABELS if key != "annotations" else HELM_ANNOTATIONS
                value = {k: v for k, v in value.items() if k not in drop}
                if not value:
                    continue
            out[key] = strip_helm(value)
        return out
    if isinstance(obj, list):
        return [strip_helm(v) for v in obj]
    return obj


def by_ident(objs: Sequence[Obj]) -> dict[str, Obj]:
    out: dict[str, Obj] = {}
    for o in objs:
        key = ident(o)
        assert key not in out, f"two objects named {key}"
        out[key] = o
    return out


METRIC_NAME = re.compile(r"\b((?:fsdp|DCGM)_[A-Za-z0-9_]+)\b")


def metric_names(promql: str) -> set[str]:
    """Metric names an expression reads (our trainer's and dcgm-exporter's)."""
    return set(METRIC_NAME.findall(promql))
