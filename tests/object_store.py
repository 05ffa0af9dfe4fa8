"""A local S3-compatible server for the object-storage tests: moto's standalone server (``moto[server]``),
started as a subprocess on 127.0.0.1 with a free port and stopped afterwards.

moto keeps buckets in memory and accepts any access key unless started with ``INITIAL_NO_AUTH_ACTION_COUNT``
(then it checks keys against its IAM users and refuses unknown ones), so each test makes its own bucket.
``env()`` is what a client needs: a key pair, the region, the endpoint (``AWS_ENDPOINT_URL``, which
``analysis.store`` reads) and ``AWS_EC2_METADATA_DISABLED`` so the AWS SDK never asks an instance
metadata address for credentials.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 60.0
ACCESS_KEY, SECRET_KEY = "specsweep-test", "specsweep-test-secret"


@dataclass(frozen=True)
class S3Server:
    """A running moto server."""

    endpoint: str  # http://127.0.0.1:PORT

    def env(self) -> dict[str, str]:
        """The environment a client of this server needs."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def new_bucket(self, stem: str = "specsweep") -> str:
        """A fresh, empty bucket's name."""
        import pyarrow.fs as pafs

        name = f"{stem}-{uuid.uuid4().hex[:10]}"
        fs = pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region="us-east-1",
            endpoint_override=self.endpoint.removeprefix("http://"),
            scheme="http",
            allow_bucket_creation=True,
        )
        fs.create_dir(name)
        return name


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def moto_server(log: Path, extra_env: dict[str, str] | None = None) -> Iterator[S3Server]:
    """Start moto's server, wait until it answers, stop it (and its children) at the end."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, **(extra_env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not answer within {START_TIMEOUT_S:.0f} s") from None
                time.sleep(0.1)
        yield S3Server(endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
