"""A send to S3 cancelled while one of its requests hangs (held by the test's proxy,
as a stalled connection to S3 holds it) must end at the deadline, not when botocore's
read timeout fires, and leave nothing behind: the upload parts' waits already notice a
cancellation within 50 ms; the requests before them must too."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import fsspec
import numpy as np
import pytest
from s3_server import HOLD, FaultProxy, s3_client
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire

pytestmark = pytest.mark.anyio

#: Requests of step 1 to hold: the start of its multipart upload, and the check that
#: the step is not stored yet; neither can make anything visible.
HELD = {
    "create": lambda method, target: method == "POST" and target.endswith("?uploads"),
    "exists": lambda method, target: method == "HEAD",
}


def batch(tag: int) -> dict[str, Any]:
    return {"x": np.arange(400_000) * (tag + 1)}  # 3.2 MB: a multipart upload


def stored(options: dict[str, Any], url: str) -> tuple[list[str], list[str]]:
    client, bucket = s3_client(options), url.removeprefix("s3://")
    objects = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return sorted(o["Key"] for o in objects), [u["Key"] for u in uploads]


@pytest.mark.parametrize("held", list(HELD))
async def test_a_send_cancelled_while_a_request_hangs_ends_at_its_deadline(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str, held: str
) -> None:
    # botocore's read timeout cut to 4 s (from 15 s), so that a send that waits for it
    # fails this test quickly; s3fs's own retries to one attempt.
    options = {**s3_proxy.options}
    options["config_kwargs"] = {**options["config_kwargs"], "read_timeout": 4}
    fsspec.filesystem("s3", **options).retries = 1
    async with rlwire.open_sender(s3_url, storage_options=options) as sender:
        assert await sender.send(batch(0)) == 0
        match = HELD[held]
        s3_proxy.fault = lambda m, t: HOLD if match(m, t) and "step-00000001" in t else None
        start = time.monotonic()
        with anyio.move_on_after(0.3) as scope:
            await sender.send(batch(1))
        took = time.monotonic() - start
        s3_proxy.fault = None
        threading.Timer(0.1, s3_proxy.release).start()
        assert scope.cancelled_caught
        assert took < 1.5, f"the cancelled send returned after {took:.1f} s"
        assert any(HELD[held](m, t) for m, t, _ in s3_proxy.requests())
        assert sender.next_step == 1
        assert not [k for k in stored(s3_endpoint, s3_url)[0] if "step-00000001" in k]
        assert await sender.send(batch(2)) == 1
    assert stored(s3_endpoint, s3_url)[1] == []  # no multipart upload left
    async with rlwire.open_receiver(s3_url, storage_options=s3_endpoint, type=dict) as rx:
        for tag in (0, 2):
            got = await rx.areceive(timeout=10)
            assert got["x"].tobytes() == batch(tag)["x"].tobytes()
