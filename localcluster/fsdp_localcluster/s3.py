"""A real S3-compatible server on loopback: Versity's versitygw over a local directory.

Built from its Go module like the cluster's other binaries (``versitygw`` in
tools/build-binaries.sh). It speaks the S3 API with SigV4 authentication,
multipart uploads and per-user access, so the trainer's boto3 client talks
to it exactly as to S3 (through ``AWS_ENDPOINT_URL_S3``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from fsdp_api.ports import free_port

from .binaries import tool_path
from .processes import stop_process
from .wait import tail, wait_until_answers

START_SECONDS = 30.0
ROOT_ACCESS_KEY = "fsdp-root"
ROOT_SECRET_KEY = "fsdp-root-secret"
REGION = "us-east-1"
_HEALTH = "/health"


class S3Server:
    """versitygw serving ``root/data`` on a loopback port; buckets are its subdirectories."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> S3Server:
        for sub in ("data", "meta", "iam"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        command = [
            str(tool_path("versitygw")),
            "--access",
            ROOT_ACCESS_KEY,
            "--secret",
            ROOT_SECRET_KEY,
            "--region",
            REGION,
            "--port",
            f"127.0.0.1:{self.port}",
            "--quiet",
            "--health",
            _HEALTH,
            "--iam-dir",
            str(self.root / "iam"),
            "posix",
            # Object metadata beside the data, not in xattrs (which tmpfs and overlayfs may refuse).
            "--sidecar",
            str(self.root / "meta"),
            str(self.root / "data"),
        ]
        with self.log.open("ab") as out:
            self._process = subprocess.Popen(command, stdout=out, stderr=out)
        try:
            wait_until_answers(self._process, self.endpoint + _HEALTH, START_SECONDS, "versitygw", self.log)
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        stop_process(self._process, 15)
        self._process = None

    def env(self, access_key: str = ROOT_ACCESS_KEY, secret_key: str = ROOT_SECRET_KEY) -> dict[str, str]:
        """What a client process needs to reach this server, as the AWS SDKs read it."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_DEFAULT_REGION": REGION,
            # No instance metadata service on loopback: do not spend seconds asking for one.
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, access_key: str = ROOT_ACCESS_KEY, secret_key: str = ROOT_SECRET_KEY) -> Any:
        """A boto3 client of this server (boto3 comes with the trainer's dependencies)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}),
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def create_user(self, access_key: str, secret_key: str) -> None:
        """An account with the ``user`` role: it may not touch buckets it does not own."""
        subprocess.run(
            [
                str(tool_path("versitygw")),
                "admin",
                "--access",
                ROOT_ACCESS_KEY,
                "--secret",
                ROOT_SECRET_KEY,
                "--endpoint-url",
                self.endpoint,
                "create-user",
                "--access",
                access_key,
                "--secret",
                secret_key,
                "--role",
                "user",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )

    def tail(self, lines: int = 30) -> str:
        return tail(self.log, lines)
