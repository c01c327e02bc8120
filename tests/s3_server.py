"""A moto S3 server on loopback for the tests, in its own process.

``s3_endpoint`` (session scope) starts ``python -m moto.server`` on 127.0.0.1 and gives
the fsspec storage options that reach it; ``s3_url`` makes a fresh bucket per test and
gives its ``s3://`` URL. Nothing leaves 127.0.0.1: the credentials are moto's dummies.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["moto_server", "s3_client", "s3_endpoint", "s3_url"]

#: Dummy credentials moto accepts; set for the server and given to clients explicitly.
_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never ask an EC2 metadata service for credentials or a region.
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _free_port() -> int:
    # moto.server cannot report the port it bound when given 0, so pick one here; the
    # gap before the server binds it is tiny, and a collision fails loudly below.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def moto_server(timeout: float = 30.0) -> Iterator[str]:
    """Run moto's standalone server in a subprocess; yield its endpoint URL; kill it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, **_CREDENTIALS}
    # The server logs every request: to a file, since a pipe nobody reads fills up and
    # then blocks the server mid-request.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    err = log.read().decode(errors="replace")
                    raise RuntimeError(f"moto server exited with {proc.returncode}: {err[-2000:]}")
                try:
                    with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                        break
                except urllib.error.HTTPError:
                    break  # it answered
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"moto server did not answer on {url}") from None
                    time.sleep(0.05)
            yield url
        finally:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[dict[str, Any]]:
    """fsspec storage options (for s3fs) that reach a moto server on loopback."""
    with moto_server() as url:
        yield {
            "endpoint_url": url,
            "key": _CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": _CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"region_name": _CREDENTIALS["AWS_DEFAULT_REGION"]},
        }


def s3_client(options: dict[str, Any]) -> Any:
    """A plain boto3 client for ``options``: tests check what is stored through it,
    independently of s3fs and its caches."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=options["endpoint_url"],
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
        region_name=options["client_kwargs"]["region_name"],
    )


@pytest.fixture
def s3_url(s3_endpoint: dict[str, Any]) -> str:
    """``s3://<fresh bucket>``: a new, empty bucket on the moto server for each test."""
    bucket = f"rlwire-{uuid.uuid4().hex[:16]}"
    s3_client(s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}"
