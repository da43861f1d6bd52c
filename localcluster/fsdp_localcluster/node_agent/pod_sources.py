"""What a pod reads from the API server and from its own object, as the kubelet would.

Downward-API fields, resource fields, ConfigMap and Secret keys, projected
volumes and service-account tokens: ``PodSources`` answers them for one pod
(``PodWorker`` in pods.py builds one when it needs them, from the pod as last
seen). A missing source is ``NotReady``, retried, with the kubelet's reason.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fsdp_api.pod_resources import parse_quantity

from .client import ApiError, KubeAPI, Obj

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# The kubelet's waiting reason for a container whose env or mounts reference a
# missing Secret/ConfigMap (key): retried, and shown until the object appears.
CONFIG_ERROR = "CreateContainerConfigError"


class NotReady(Exception):
    """A pod or container cannot start yet (missing ConfigMap, unbound claim...); retried."""

    def __init__(self, message: str, reason: str = "ContainerCreating") -> None:
        super().__init__(message)
        self.reason = reason


def claim_path(api: KubeAPI, namespace: str, claim: str) -> Path:
    """The local folder behind a PersistentVolumeClaim (raises NotReady while unbound)."""
    pvc = api.get_or_none(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
    if pvc is None:
        raise NotReady(f'persistentvolumeclaim "{claim}" not found')
    volume = (pvc.get("spec") or {}).get("volumeName")
    if not volume or (pvc.get("status") or {}).get("phase") != "Bound":
        raise NotReady(f'persistentvolumeclaim "{claim}" is not bound')
    pv = api.get(f"/api/v1/persistentvolumes/{volume}")
    source = pv["spec"].get("hostPath") or pv["spec"].get("local")
    if source is None:
        raise NotReady(f"persistentvolume {volume}: only hostPath and local volumes can be mounted here")
    path = Path(source["path"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def automount(pod: Obj) -> bool:
    """Whether the pod gets the service account's token mounted (the kubelet's rule)."""
    spec = pod["spec"]
    if spec.get("automountServiceAccountToken") is False:
        return False
    mounted = any(m["mountPath"] == SERVICE_ACCOUNT_DIR for c in spec["containers"] for m in c.get("volumeMounts", []))
    return not mounted


@dataclass(frozen=True)
class PodSources:
    """One pod's view of its sources: the API server, the pod object, its node and address."""

    api: KubeAPI
    pod: Obj
    node_ip: str
    ip: str
    node_capacity: Mapping[str, Mapping[str, str]]  # node name -> capacity (resourceFieldRef defaults)

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def pod_name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    def field(self, path: str) -> str:
        pod, meta = self.pod, self.pod["metadata"]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        simple = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": pod["spec"].get("nodeName", ""),
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
            "status.hostIP": self.node_ip,
            "status.hostIPs": self.node_ip,
            "status.podIP": self.ip,
            "status.podIPs": self.ip,
        }
        if path == "metadata.labels":
            return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("labels") or {}).items()))
        if path == "metadata.annotations":
            return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("annotations") or {}).items()))
        return str(simple.get(path, ""))

    def resource(self, c: Obj, ref: Obj) -> str:
        res = ref["resource"]
        kind, _, name = res.partition(".")
        value = ((c.get("resources") or {}).get(kind) or {}).get(name)
        if value is None:  # unset limits default to the node's allocatable
            value = self.node_capacity[self.pod["spec"]["nodeName"]].get(name, "0")
        divisor = parse_quantity(str(ref.get("divisor", "1")))
        return str(int(-(-parse_quantity(str(value)) // divisor)))

    def lookup(self, kind: str, ref: Obj) -> str | None:
        """An env value from a Secret or ConfigMap key; the kubelet's CreateContainerConfigError when it is missing."""
        obj = self.api.get_or_none(f"/api/v1/namespaces/{self.namespace}/{kind}/{ref['name']}")
        data = (obj or {}).get("data") or {}
        if ref["key"] not in data:
            if ref.get("optional"):
                return None
            # The kubelet's messages (pkg/kubelet/kubelet_pods.go makeEnvironmentVariables).
            if obj is None:
                raise NotReady(f'{kind[:-1]} "{ref["name"]}" not found', CONFIG_ERROR)
            title = "Secret" if kind == "secrets" else "ConfigMap"
            raise NotReady(f"couldn't find key {ref['key']} in {title} {self.namespace}/{ref['name']}", CONFIG_ERROR)
        v = data[ref["key"]]
        return base64.b64decode(v).decode() if kind == "secrets" else str(v)

    def project(self, v: Obj, path: Path) -> list[Path]:
        """Write a configMap / secret / downwardAPI / projected volume's files; returns them."""
        sources = v["projected"]["sources"] if "projected" in v else [v]
        written = []
        for src in sources:
            files: dict[str, bytes] = {}
            if "configMap" in src:
                ref = src["configMap"]
                cm = self.api.get_or_none(f"/api/v1/namespaces/{self.namespace}/configmaps/{ref['name']}")
                if cm is None:
                    if ref.get("optional"):
                        continue
                    raise NotReady(f'configmap "{ref["name"]}" not found')
                data = {k: s.encode() for k, s in (cm.get("data") or {}).items()}
                data |= {k: base64.b64decode(b) for k, b in (cm.get("binaryData") or {}).items()}
                files = self.select(data, ref.get("items"))
            elif "secret" in src:
                ref = src["secret"]
                sname = ref.get("secretName") or ref.get("name")
                sec = self.api.get_or_none(f"/api/v1/namespaces/{self.namespace}/secrets/{sname}")
                if sec is None:
                    if ref.get("optional"):
                        continue
                    raise NotReady(f'secret "{sname}" not found')
                files = self.select(
                    {k: base64.b64decode(b) for k, b in (sec.get("data") or {}).items()}, ref.get("items")
                )
            elif "downwardAPI" in src:
                for item in src["downwardAPI"].get("items", []):
                    if "fieldRef" in item:
                        files[item["path"]] = self.field(item["fieldRef"]["fieldPath"]).encode()
            elif "serviceAccountToken" in src:
                t = src["serviceAccountToken"]
                token = self.token(t.get("audience"), t.get("expirationSeconds", 3600))
                files[t["path"]] = token.encode()
            for rel, content in files.items():
                out = path / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(content)
                written.append(out)
        return written

    @staticmethod
    def select(data: dict[str, bytes], items: list[Obj] | None) -> dict[str, bytes]:
        if not items:
            return data
        return {i["path"]: data[i["key"]] for i in items if i["key"] in data}

    def token(self, audience: str | None = None, expiration: int = 3600) -> str:
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        body: Obj = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": max(expiration, 3600),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.pod_name, "uid": self.uid},
                **({"audiences": [audience]} if audience else {}),
            },
        }
        try:
            out = self.api.request("POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{sa}/token", body)
        except ApiError as e:
            raise NotReady(f"cannot get a token for serviceaccount {self.namespace}/{sa}: {e}") from e
        return str(out["status"]["token"])

    def write_service_account(self, d: Path) -> None:
        token = self.token(expiration=24 * 3600)
        (d / "token").write_text(token)
        (d / "ca.crt").write_bytes(self.api.ca_file.read_bytes())
        (d / "namespace").write_text(self.namespace)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "in-cluster",
            "clusters": [
                {
                    "name": "in-cluster",
                    "cluster": {"server": self.api.server, "certificate-authority": str(d / "ca.crt")},
                }
            ],
            # Inline, not tokenFile: minimal kubeconfig readers (kopf's) only take a literal token.
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [
                {"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "sa", "namespace": self.namespace}}
            ],
        }
        (d / "kubeconfig").write_text(json.dumps(config, indent=2))
