"""Reading kubeconfigs as kubectl does: contexts, relative paths, tokens, exec plugins, the pod's account."""

from __future__ import annotations

import base64
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml
from fsdp_k8s import ClientError
from fsdp_k8s.kubeconfig import in_cluster_connection, load_connection


def write_config(path: Path, users: list[dict], current: str = "a", contexts: list[dict] | None = None) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1/", "insecure-skip-tls-verify": True}}],
        "users": users,
        "contexts": contexts or [{"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_current_context_gives_server_namespace_and_token(tmp_path: Path) -> None:
    path = write_config(tmp_path / "config", [{"name": "u", "user": {"token": "abc"}}])
    conn = load_connection(path)
    assert (conn.server, conn.namespace, conn.context) == ("http://127.0.0.1:1", "team", "a")
    assert conn.credentials.header() == "Bearer abc"
    assert conn.ssl_context is None  # plain http: no TLS at all


def test_a_token_file_is_relative_to_the_kubeconfig_and_reread_each_time(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("one\n")
    path = write_config(tmp_path / "config", [{"name": "u", "user": {"tokenFile": "tok"}}])
    os.chdir("/")  # relative to the file, not to where Python runs
    conn = load_connection(path)
    assert conn.credentials.header() == "Bearer one"
    (tmp_path / "tok").write_text("two\n")  # kubelet rotates projected tokens in place
    assert conn.credentials.header() == "Bearer two"


def test_kubeconfig_env_merges_files_first_one_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = write_config(tmp_path / "one", [{"name": "u", "user": {"token": "first"}}])
    second = write_config(tmp_path / "two", [{"name": "u", "user": {"token": "second"}}], current="b")
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    conn = load_connection()
    assert (conn.context, conn.credentials.header()) == ("a", "Bearer first")


def test_an_unknown_context_names_the_known_ones(tmp_path: Path) -> None:
    path = write_config(tmp_path / "config", [{"name": "u", "user": {"token": "t"}}])
    with pytest.raises(ClientError, match=r"context 'prod' is not in .*config \(known: a\)"):
        load_connection(path, context="prod")


def test_a_missing_kubeconfig_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ClientError, match=r"^no kubeconfig .*`aws eks update-kubeconfig --name CLUSTER`$"):
        load_connection()


def plugin(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "get-token"
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_an_exec_plugin_token_is_kept_until_its_expiry(tmp_path: Path) -> None:
    # What `aws eks get-token` does: an ExecCredential on stdout; here each run counts itself and
    # expires at once the first time, in a year the second.
    counter = tmp_path / "runs"
    script = plugin(
        tmp_path,
        "import json, os, pathlib\n"
        f"p = pathlib.Path({str(counter)!r}); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "expiry = '2000-01-01T00:00:00Z' if n == 1 else '2999-01-01T00:00:00Z'\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "  'status': {'token': f\"{os.environ['CLUSTER']}-{n}\", 'expirationTimestamp': expiry}}))\n",
    )
    exec_ = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": str(script),
        "args": ["--cluster-name", "x"],
        "env": [{"name": "CLUSTER", "value": "eks"}],
    }
    conn = load_connection(write_config(tmp_path / "config", [{"name": "u", "user": {"exec": exec_}}]))
    assert conn.credentials.header() == "Bearer eks-1"
    assert conn.credentials.header() == "Bearer eks-2"  # the first one had expired
    assert conn.credentials.header() == "Bearer eks-2"  # this one has not: no third run
    assert counter.read_text() == "2"


def test_a_failing_exec_plugin_is_one_line_with_its_last_words(tmp_path: Path) -> None:
    script = plugin(
        tmp_path,
        "import sys\nprint('trace', file=sys.stderr)\n"
        "print('token expired: run aws sso login', file=sys.stderr)\nsys.exit(3)\n",
    )
    conn = load_connection(
        write_config(tmp_path / "config", [{"name": "u", "user": {"exec": {"command": str(script)}}}])
    )
    with pytest.raises(ClientError, match=r"failed \(exit 3\): token expired: run aws sso login$"):
        conn.credentials.header()


def test_a_missing_exec_plugin_gives_its_install_hint(tmp_path: Path) -> None:
    user = {"exec": {"command": str(tmp_path / "aws"), "installHint": "install the AWS CLI"}}
    conn = load_connection(write_config(tmp_path / "config", [{"name": "u", "user": user}]))
    with pytest.raises(ClientError, match="is not installed: install the AWS CLI"):
        conn.credentials.header()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA and an admin client certificate signed by it (openssl, as the local cluster makes them)."""
    from fsdp_localcluster.pki import generate_pki

    d = tmp_path_factory.mktemp("pki")
    generate_pki(d)
    return d


def test_inside_a_pod_the_service_account_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pki: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "namespace").write_text("notebooks")
    (tmp_path / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.100.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    conn = in_cluster_connection(tmp_path)
    assert (conn.server, conn.namespace, conn.credentials.header()) == (
        "https://10.100.0.1:443",
        "notebooks",
        "Bearer sa-token",
    )
    assert conn.ssl_context is not None and conn.ssl_context.get_ca_certs()


def test_an_auth_provider_user_is_refused_in_one_line(tmp_path: Path) -> None:
    user = {"auth-provider": {"name": "gcp"}}
    with pytest.raises(ClientError, match=r"auth-provider 'gcp', which kubectl dropped too: use exec$"):
        load_connection(write_config(tmp_path / "config", [{"name": "u", "user": user}]))


def test_certificate_data_is_loaded_into_the_tls_context(tmp_path: Path, pki: Path) -> None:
    ca, cert, key = pki / "ca.crt", pki / "admin.crt", pki / "admin.key"

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    user = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
    path = write_config(tmp_path / "config", [{"name": "u", "user": user}])
    text = path.read_text().replace("http://127.0.0.1:1/", "https://127.0.0.1:1/")
    text = text.replace("insecure-skip-tls-verify: true", f"certificate-authority-data: {b64(ca)}")
    path.write_text(text)
    conn = load_connection(path)
    assert conn.ssl_context is not None and len(conn.ssl_context.get_ca_certs()) == 1
    assert conn.credentials.cert_file is not None and conn.credentials.cert_file.read_bytes() == cert.read_bytes()
