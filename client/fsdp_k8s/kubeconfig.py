"""Where the cluster is and who we are: a kubeconfig's current context, or the pod's service account.

Read the way kubectl reads them (``k8s.io/client-go/tools/clientcmd``): the
first file of ``$KUBECONFIG`` that names a cluster, user or context wins it;
relative paths are relative to the file that holds them; a user authenticates
with a client certificate, a bearer token (or its file), basic auth, or an
``exec`` credential plugin (``aws eks get-token`` on EKS), whose token is kept
until the expiry it states. Inside a pod with no kubeconfig, the mounted
service-account token and CA are used (``rest.InClusterConfig``).

Only the standard library: a notebook gets this client without kopf, aiohttp
or a Kubernetes client library.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from .errors import ClientError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Re-run an exec plugin this long before the expiry it gave, so a request never carries a stale token.
EXEC_EXPIRY_MARGIN_SECONDS = 30.0


@dataclass
class Credentials:
    """How requests authenticate: a header (token, basic) and/or a client certificate in the TLS handshake."""

    token: str | None = None
    basic: str | None = None  # base64 "user:password"
    token_file: Path | None = None
    exec_config: Mapping[str, Any] | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    _exec_token: str | None = field(default=None, repr=False)
    _exec_expires: float | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def header(self) -> str | None:
        """The Authorization header's value now (a token file re-read, an expired exec token renewed)."""
        if self.exec_config is not None:
            token = self._exec()
            return f"Bearer {token}" if token else None
        if self.token_file is not None:
            try:
                return f"Bearer {self.token_file.read_text().strip()}"
            except OSError as e:
                raise ClientError(f"cannot read the token file {self.token_file}: {e.strerror or e}") from None
        if self.token:
            return f"Bearer {self.token}"
        if self.basic:
            return f"Basic {self.basic}"
        return None

    def _exec(self) -> str | None:
        with self._lock:
            fresh = self._exec_expires is None or time.time() < self._exec_expires - EXEC_EXPIRY_MARGIN_SECONDS
            if self._exec_token is not None and fresh:
                return self._exec_token
            self._exec_token, self._exec_expires = run_exec_plugin(self.exec_config or {})
            return self._exec_token


@dataclass
class Connection:
    """One cluster as a user reaches it: the server's URL, TLS settings, credentials, default namespace."""

    server: str
    ssl_context: ssl.SSLContext | None
    credentials: Credentials
    namespace: str = "default"
    context: str | None = None


def _read_config(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise ClientError(f"cannot read kubeconfig {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ClientError(f"kubeconfig {path} is not valid YAML: {e}") from None
    if not isinstance(loaded, dict):
        raise ClientError(f"kubeconfig {path} is not a mapping")
    return loaded


def _named(config: Mapping[str, Any], key: str, base: Path) -> dict[str, tuple[dict[str, Any], Path]]:
    out: dict[str, tuple[dict[str, Any], Path]] = {}
    for entry in config.get(key) or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            out.setdefault(entry["name"], (dict(entry.get(key[:-1]) or {}), base))
    return out


def kubeconfig_paths(explicit: str | os.PathLike[str] | None) -> list[Path]:
    if explicit:
        return [Path(explicit).expanduser()]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path.home() / ".kube" / "config"]


def load_connection(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> Connection:
    """The connection of ``context`` (default: the current one) in the kubeconfig, else the pod's service account."""
    paths = [p for p in kubeconfig_paths(kubeconfig) if kubeconfig or p.exists()]
    if not paths:
        if in_cluster():
            return in_cluster_connection()
        raise ClientError(
            "no kubeconfig (~/.kube/config or $KUBECONFIG) and not inside a pod: "
            "pass kubeconfig= or run `aws eks update-kubeconfig --name CLUSTER`"
        )
    clusters: dict[str, tuple[dict[str, Any], Path]] = {}
    users: dict[str, tuple[dict[str, Any], Path]] = {}
    contexts: dict[str, tuple[dict[str, Any], Path]] = {}
    current = None
    for path in paths:
        config = _read_config(path)
        base = path.resolve().parent
        # The first file that sets a name wins it, as kubectl merges $KUBECONFIG.
        for target, key in ((clusters, "clusters"), (users, "users"), (contexts, "contexts")):
            for entry_name, value in _named(config, key, base).items():
                target.setdefault(entry_name, value)
        current = current or config.get("current-context")
    name = context or current
    where = ", ".join(str(p) for p in paths)
    if not name:
        raise ClientError(f"no current-context in {where}: pass context=")
    if name not in contexts:
        raise ClientError(f"context {name!r} is not in {where} (known: {', '.join(sorted(contexts)) or 'none'})")
    ctx, _ = contexts[name]
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if cluster_name not in clusters:
        raise ClientError(f"context {name!r} names cluster {cluster_name!r}, which is not in {where}")
    cluster, cluster_base = clusters[cluster_name]
    user, user_base = ({}, cluster_base) if user_name is None else users.get(user_name, ({}, cluster_base))
    server = cluster.get("server")
    if not server:
        raise ClientError(f"cluster {cluster_name!r} in {where} has no server")
    credentials = user_credentials(user, user_base)
    return Connection(
        server=str(server).rstrip("/"),
        ssl_context=tls_context(cluster, cluster_base, credentials),
        credentials=credentials,
        namespace=ctx.get("namespace") or "default",
        context=name,
    )


def _path(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _data_file(data: str, suffix: str) -> Path:
    """Certificate data written to a private file: Python's ssl loads certificates and keys from files only."""
    fd, name = tempfile.mkstemp(prefix="fsdp-k8s-", suffix=suffix)
    atexit.register(Path(name).unlink, missing_ok=True)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if not _is_base64(data) else base64.b64decode(data))
    return Path(name)


def _is_base64(data: str) -> bool:
    return "-----BEGIN" not in data


def user_credentials(user: Mapping[str, Any], base: Path) -> Credentials:
    creds = Credentials()
    if user.get("client-certificate-data"):
        creds.cert_file = _data_file(user["client-certificate-data"], ".crt")
    elif user.get("client-certificate"):
        creds.cert_file = _path(user["client-certificate"], base)
    if user.get("client-key-data"):
        creds.key_file = _data_file(user["client-key-data"], ".key")
    elif user.get("client-key"):
        creds.key_file = _path(user["client-key"], base)
    if user.get("token"):
        creds.token = str(user["token"])
    elif user.get("tokenFile"):
        creds.token_file = _path(user["tokenFile"], base)
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password', '')}"
        creds.basic = base64.b64encode(pair.encode()).decode()
    if user.get("exec"):
        creds.exec_config = dict(user["exec"])
    if user.get("auth-provider"):
        name = (user["auth-provider"] or {}).get("name", "?")
        raise ClientError(f"the kubeconfig user uses auth-provider {name!r}, which kubectl dropped too: use exec")
    return creds


def tls_context(cluster: Mapping[str, Any], base: Path, creds: Credentials) -> ssl.SSLContext | None:
    if cluster.get("tls-server-name"):
        raise ClientError("the kubeconfig cluster sets tls-server-name, which this client does not support")
    if not str(cluster.get("server", "")).startswith("https://"):
        return None
    if cluster.get("insecure-skip-tls-verify"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        ca = cluster["certificate-authority-data"]
        pem = base64.b64decode(ca).decode() if _is_base64(ca) else ca
        context = ssl.create_default_context(cadata=pem)
    elif cluster.get("certificate-authority"):
        context = ssl.create_default_context(cafile=str(_path(cluster["certificate-authority"], base)))
    else:
        context = ssl.create_default_context()
    if creds.cert_file is not None:
        try:
            context.load_cert_chain(str(creds.cert_file), str(creds.key_file) if creds.key_file else None)
        except (OSError, ssl.SSLError) as e:
            raise ClientError(f"cannot load the client certificate {creds.cert_file}: {e}") from None
    return context


def run_exec_plugin(config: Mapping[str, Any]) -> tuple[str | None, float | None]:
    """Run a client-go credential plugin; its token and when it expires (epoch seconds), as it says."""
    command = config.get("command")
    if not command:
        raise ClientError("the kubeconfig user's exec has no command")
    env = dict(os.environ)
    env.update({e["name"]: str(e.get("value", "")) for e in config.get("env") or [] if "name" in e})
    request = {
        "apiVersion": config.get("apiVersion", "client.authentication.k8s.io/v1"),
        "kind": "ExecCredential",
        "spec": {"interactive": False},
    }
    env["KUBERNETES_EXEC_INFO"] = json.dumps(request)
    try:
        done = subprocess.run(
            [command, *map(str, config.get("args") or [])],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except FileNotFoundError:
        hint = config.get("installHint")
        raise ClientError(
            f"the credential plugin {command!r} is not installed" + (f": {hint}" if hint else "")
        ) from None
    except subprocess.TimeoutExpired:
        raise ClientError(f"the credential plugin {command!r} did not answer within 60 s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ClientError(f"the credential plugin {command!r} failed (exit {done.returncode}): {last}")
    try:
        status = json.loads(done.stdout).get("status") or {}
    except (json.JSONDecodeError, AttributeError):
        raise ClientError(f"the credential plugin {command!r} printed no ExecCredential JSON") from None
    if status.get("clientCertificateData"):
        raise ClientError(f"the credential plugin {command!r} returns a client certificate; only tokens are supported")
    expires = status.get("expirationTimestamp")
    return status.get("token"), _epoch(expires) if expires else None


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT_DIR / "token").exists()


def in_cluster_connection(root: Path = SERVICE_ACCOUNT_DIR) -> Connection:
    """The pod's own service account: its token (re-read, as kubelet rotates it), its CA, its namespace."""
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    creds = Credentials(token_file=root / "token")
    context = ssl.create_default_context(cafile=str(root / "ca.crt"))
    namespace = (root / "namespace").read_text().strip() if (root / "namespace").exists() else "default"
    return Connection(f"https://{host}:{port}", context, creds, namespace=namespace, context=None)
