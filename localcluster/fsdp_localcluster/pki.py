"""Certificates and keys of the local cluster, made with the ``openssl`` CLI.

``generate_pki`` writes the API server's CA, serving and admin certificates
and the service-account signing key; ``ec_key``/``rsa_pkcs1_key``/``sign``
are the building blocks the control plane uses for its components' client
certificates and the training operator's webhook.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path


class PkiError(RuntimeError):
    """An openssl command failed; the message carries its stderr."""


def openssl(*args: str) -> None:
    res = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise PkiError(f"openssl {' '.join(args)} failed:\n{res.stderr}")


def b64(path: Path) -> str:
    """A file's content as base64 text (kubeconfig ``*-data`` fields, Secret data)."""
    return base64.b64encode(path.read_bytes()).decode()


# One openssl config for all certificates; each [section] is a profile of
# X.509v3 extensions. Explicit sections keep the result independent of the
# system's openssl.cnf (e.g. a serving cert must not come out as a CA).
# Other profiles are appended by the users that need them (control_plane.py).
OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
# The in-cluster names too: a pod's client (kopf's in-cluster login) dials https://kubernetes.default.svc.
subjectAltName = @server_names
[server_names]
IP.1 = 127.0.0.1
DNS.1 = localhost
DNS.2 = kubernetes
DNS.3 = kubernetes.default
DNS.4 = kubernetes.default.svc
DNS.5 = kubernetes.default.svc.cluster.local
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
"""


def generate_pki(d: Path) -> None:
    """Write ca.crt, server.{crt,key}, admin.{crt,key} and sa.{key,pub} into ``d``.

    EC P-256 keys for TLS (fast to generate); an RSA key for service-account
    tokens (RS256, what every token consumer supports).
    """
    d.mkdir(parents=True, exist_ok=True)
    cnf = d / "openssl.cnf"
    cnf.write_text(OPENSSL_CNF)
    ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
    ca_key, ca_crt = str(d / "ca.key"), str(d / "ca.crt")
    # fmt: off
    openssl("genpkey", *ec, "-out", ca_key)
    openssl("req", "-x509", "-new", "-config", str(cnf), "-extensions", "ca", "-key", ca_key,
            "-subj", "/CN=fsdp-test-ca", "-days", "3650", "-out", ca_crt)
    # The admin cert's O=system:masters is the group RBAC lets do anything.
    for name, subj, profile in (("server", "/CN=kube-apiserver", "server"),
                                ("admin", "/O=system:masters/CN=fsdp-test-admin", "client")):
        key, csr, crt = (str(d / f"{name}.{ext}") for ext in ("key", "csr", "crt"))
        openssl("genpkey", *ec, "-out", key)
        openssl("req", "-new", "-config", str(cnf), "-key", key, "-subj", subj, "-out", csr)
        openssl("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial", "-days", "3650",
                "-extfile", str(cnf), "-extensions", profile, "-out", crt)
    # fmt: on
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(d / "sa.key"))
    openssl("pkey", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))


def ec_key(path: Path) -> None:
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))


def rsa_pkcs1_key(path: Path) -> None:
    # The training operator's cert rotator parses its CA key as PKCS#1 RSA only.
    openssl("genrsa", "-traditional", "-out", str(path), "2048")


def sign(cnf: Path, key: Path, subject: str, profile: str, ca_crt: Path, ca_key: Path, out: Path) -> None:
    """A certificate for ``key`` and ``subject``, with the extensions of ``cnf``'s ``[profile]``, signed by the CA."""
    csr = out.with_suffix(".csr")
    openssl("req", "-new", "-config", str(cnf), "-key", str(key), "-subj", subject, "-out", str(csr))
    # fmt: off
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
            "-days", "3650", "-extfile", str(cnf), "-extensions", profile, "-out", str(out))
    # fmt: on
