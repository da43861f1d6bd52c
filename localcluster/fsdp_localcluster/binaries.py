"""Where the local cluster's binaries and data come from: the repository, the build script, the vendored CRDs.

etcd, kube-apiserver, kubectl, helm, kube-scheduler, kube-controller-manager,
the Kubeflow training operator, Kueue, Kubeflow Trainer v2 and JobSet are
built from Go modules by ``tools/build-binaries.sh`` (versions in ``tools/versions.env``; see
``docs/test-cluster.md``) into a cache; ``tool_path`` finds (and builds) one.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

# The package is used from its checkout (an editable install): the repository
# holds the build script, the kustomize bundle and the examples it needs.
REPO_ROOT = Path(__file__).resolve().parents[2]
FETCH_CRDS_SCRIPT = REPO_ROOT / "tools" / "fetch-karpenter-crds.sh"
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-binaries.sh"
# The binaries a TestCluster needs; helm is included so one build covers the suite.
CLUSTER_TOOLS = ("etcd", "kube-apiserver", "kubectl", "helm")


# Set by `make test-unit`: the unit tier runs on the virtualenv alone, so nothing here
# builds, fetches or hands out a binary (tests/conftest.py, the `integration` marker).
ENV_UNIT_TIER = "FSDP_UNIT_TIER"


class ToolBuildError(RuntimeError):
    """tools/build-binaries.sh failed; the message carries the tail of its output."""


def _refuse_in_unit_tier(what: str) -> None:
    if os.environ.get(ENV_UNIT_TIER):
        raise ToolBuildError(
            f"the unit tier ({ENV_UNIT_TIER} is set) has no {what}: a test that needs it is an "
            "integration test (tests/conftest.py marks by folder, fixture and marker; or @pytest.mark.integration)"
        )


# Third-party CRDs and reference data, vendored byte-identical from their upstream releases
# (crds/README.md names each file's repository, tag and commit): a plain clone needs nothing beside it.
VENDORED_CRDS = Path(__file__).resolve().parent / "crds"


def vendored_crds(name: str) -> Path:
    """The folder of one vendored set (``kubeflow-training-operator-v1``, ``karpenter``, ``dcgm-exporter``, ...)."""
    path = VENDORED_CRDS / name
    if not path.is_dir():
        raise FileNotFoundError(f"no vendored CRDs {name!r} under {VENDORED_CRDS}")
    return path


def ensure_tools(names: Sequence[str] = CLUSTER_TOOLS) -> None:
    """Build ``names`` if missing (a fast no-op when cached); raise ToolBuildError on failure.

    All names go to one script run so that tools from the same Go module (for
    example kube-apiserver and kubectl) are compiled by one ``go build``.
    """
    _refuse_in_unit_tier(" ".join(names))
    fd, name = tempfile.mkstemp(prefix="fsdp-build-binaries-", suffix=".log")
    log = Path(name)
    with os.fdopen(fd, "w") as out:
        rc = subprocess.call(["bash", str(BUILD_SCRIPT), *names], stdout=out, stderr=subprocess.STDOUT)
    if rc == 0:
        log.unlink()
    else:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:])
        raise ToolBuildError(
            f"{BUILD_SCRIPT} {' '.join(names)} failed (exit {rc}); it needs the Go toolchain "
            f"(go on PATH or /usr/local/go/bin/go) and the Go module proxy. Full log: {log}\n{tail}"
        )


@functools.cache
def karpenter_crds(variable: str) -> Path:
    """The CRD directory of the Karpenter version pinned as ``variable`` in tools/versions.env.

    Fetched from the Go module proxy on first use (tools/fetch-karpenter-crds.sh),
    then cached like the binaries.
    """
    _refuse_in_unit_tier(f"Karpenter CRDs ({variable})")
    res = subprocess.run(["bash", str(FETCH_CRDS_SCRIPT)], capture_output=True, text=True)
    if res.returncode != 0:
        raise ToolBuildError(
            f"{FETCH_CRDS_SCRIPT} failed (exit {res.returncode}); it needs the Go module proxy:\n{res.stderr[-2000:]}"
        )
    out = subprocess.run(
        ["bash", str(FETCH_CRDS_SCRIPT), "--print-path", variable], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


@functools.cache
def tool_path(name: str, build: bool = True) -> Path:
    """Absolute path of a binary (``etcd``, ``kube-apiserver``, ``kubectl``, ``helm``, ...).

    The location comes from the build script itself, so versions and the cache
    layout live in one place (tools/versions.env, tools/build-binaries.sh).
    With ``build`` (the default) a missing binary is built first.
    """
    _refuse_in_unit_tier(name)
    if build:
        ensure_tools([name])
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-path", name], check=True, capture_output=True, text=True
    ).stdout.strip()
    path = Path(out)
    if not os.access(path, os.X_OK):
        raise ToolBuildError(f"{name} is not built at {path}; run {BUILD_SCRIPT} {name}")
    return path


def training_operator_source() -> Path:
    """The training operator's module source at the pinned version (for its upstream manifests)."""
    return module_source("training-operator", "github.com/kubeflow/training-operator")


def kueue_source() -> Path:
    """Kueue's module source at the pinned version (its CRDs and webhook manifests)."""
    return module_source("kueue", "sigs.k8s.io/kueue")


def trainer_source() -> Path:
    """Kubeflow Trainer v2's module source at the pinned version (its CRDs and webhook manifests)."""
    return module_source("trainer-controller-manager", "github.com/kubeflow/trainer/v2")


def jobset_source() -> Path:
    """JobSet's module source at the pinned version (its CRD and webhook manifests)."""
    return module_source("jobset", "sigs.k8s.io/jobset")


def module_source(tool: str, module: str) -> Path:
    """The source of the Go ``module`` that ``tool`` was built from, at the pinned version.

    Resolved from the build's throwaway module, so it is the version that was
    built; ``go mod download`` is a no-op when the module cache has it.
    """
    binary = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-path", tool], check=True, capture_output=True, text=True
    ).stdout.strip()
    go = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    out = subprocess.run(
        [go, "mod", "download", "-json", module],
        cwd=Path(binary).parent.parent / "src",
        env={**os.environ, "GOFLAGS": "-mod=mod", "GOWORK": "off"},
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(json.loads(out.stdout)["Dir"])
