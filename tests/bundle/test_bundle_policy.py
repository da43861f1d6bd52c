"""Security and hygiene policy over every manifest the project ships or renders.

Sources: every kustomize overlay, ``helm template`` with defaults and with
every optional part on, and the renderer's output for each FSDPTraining
example. Rules: images pinned (no ``:latest``, no untagged), no privileged
containers or privilege escalation, non-root everywhere, capabilities
dropped with only IPC_LOCK added back (EFA memory registration, documented
in docs/troubleshooting.md), requests and limits on every container, a
read-only root filesystem, no host namespaces or hostPath volumes.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest

from tests.bundle.manifests import (
    OVERLAYS,
    Obj,
    containers,
    example_files,
    helm_template,
    ident,
    kustomize,
    pod_specs,
    render_training,
)

# Capabilities a container may add, and why.
ALLOWED_CAPABILITIES = {"IPC_LOCK": "EFA pins (registers) memory with the NIC beyond RLIMIT_MEMLOCK"}
ALL_FEATURES = {
    "monitoring.enabled": "true",
    "serviceMonitor.enabled": "true",
    "createNamespace": "true",
    "karpenter.enabled": "true",
    "karpenter.clusterName": "policy-test",
}
IMAGE = re.compile(r"^(?P<repo>[^@\s]+?)(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


@functools.cache
def sources() -> dict[str, list[Obj]]:
    """Read-only: shared by every test of this module."""
    out = {f"kustomize {o}": kustomize(o) for o in OVERLAYS}
    out["helm template (defaults)"] = helm_template(namespace="fsdp-system", include_crds=True)
    out["helm template (all features)"] = helm_template(ALL_FEATURES, namespace="fsdp-system", include_crds=True)
    for path in example_files():
        out[f"render {path.name}"] = render_training(path)
    return out


def image_problem(image: str) -> str | None:
    m = IMAGE.match(image)
    if not m or ("/" not in image and not m.group("tag") and not m.group("digest")):
        return f"unparseable image {image!r}"
    # A port in the registry (host:5000/x) is not a tag: only the last path element counts.
    last = image.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in last:
        return f"image {image!r} has no tag or digest"
    if last.split("@")[0].endswith(":latest"):
        return f"image {image!r} uses :latest"
    return None


def violations(obj: Obj) -> list[str]:
    """Policy violations of one object (empty: compliant)."""
    found: list[str] = []
    for where, pod in pod_specs(obj):
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(flag):
                found.append(f"{where}: {flag}")
        for vol in pod.get("volumes") or []:
            if "hostPath" in vol:
                found.append(f"{where}: hostPath volume {vol['name']}")
        psc = pod.get("securityContext") or {}
        if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            found.append(f"{where}: pod securityContext.seccompProfile is not RuntimeDefault")
    for where, c, pod in containers(obj):
        psc = pod.get("securityContext") or {}
        sc = c.get("securityContext") or {}
        if problem := image_problem(c.get("image", "")):
            found.append(f"{where}: {problem}")
        if sc.get("privileged"):
            found.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation is not false")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            found.append(f"{where}: runAsNonRoot is not true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            found.append(f"{where}: runAsUser 0")
        if sc.get("readOnlyRootFilesystem") is not True:
            found.append(f"{where}: readOnlyRootFilesystem is not true")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"{where}: capabilities.drop lacks ALL")
        extra = set(caps.get("add") or []) - ALLOWED_CAPABILITIES.keys()
        if extra:
            found.append(f"{where}: adds capabilities {sorted(extra)}")
        res = c.get("resources") or {}
        if not res.get("requests"):
            found.append(f"{where}: no resource requests")
        if not res.get("limits"):
            found.append(f"{where}: no resource limits")
        elif "memory" not in res["limits"]:
            found.append(f"{where}: no memory limit")
    return found


@pytest.mark.parametrize("source", sorted(sources()))
def test_policy(source: str) -> None:
    objs = sources()[source]
    assert objs, f"{source} yields nothing"
    problems = [f"{ident(o)}: {v}" for o in objs for v in violations(o)]
    assert not problems, "\n".join(problems)


def test_the_policy_checks_real_workloads() -> None:
    """Guard against a vacuous pass: the sources contain the operator and trainer containers."""
    names: dict[str, Any] = {}
    for objs in sources().values():
        for o in objs:
            for _, c, _ in containers(o):
                names.setdefault(c["name"], []).append(ident(o))
    assert "operator" in names and "pytorch" in names
    # EFA jobs add IPC_LOCK, and only that.
    efa = [
        c
        for objs in sources().values()
        for o in objs
        for _, c, _ in containers(o)
        if "vpc.amazonaws.com/efa" in (c.get("resources", {}).get("limits") or {})
    ]
    assert efa and all(c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"] for c in efa)


def test_the_policy_catches_violations() -> None:
    bad = {
        "kind": "Deployment",
        "metadata": {"name": "bad"},
        "spec": {
            "template": {
                "spec": {
                    "hostNetwork": True,
                    "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                    "containers": [
                        {"name": "a", "image": "nginx:latest", "securityContext": {"privileged": True}},
                        {
                            "name": "b",
                            "image": "registry:5000/team/app",
                            "securityContext": {
                                "runAsNonRoot": True,
                                "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
                            },
                            "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
                        },
                    ],
                }
            }
        },
    }
    found = "\n".join(violations(bad))
    for expected in (
        "hostNetwork",
        "hostPath volume root",
        "seccompProfile",
        "[a]: image 'nginx:latest' uses :latest",
        "[a]: privileged",
        "[a]: runAsNonRoot is not true",
        "[a]: no resource requests",
        "[b]: image 'registry:5000/team/app' has no tag or digest",
        "[b]: adds capabilities ['SYS_ADMIN']",
        "[b]: no memory limit",
    ):
        assert expected in found, f"{expected!r} not reported:\n{found}"
    assert image_problem("ghcr.io/fsdp-k8s/trainer:0.1.0") is None
    assert image_problem("registry:5000/x/y@sha256:" + "a" * 64) is None
