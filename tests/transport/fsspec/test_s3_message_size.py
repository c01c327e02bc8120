"""An S3 message object whose size is not the size its envelope says (junk appended to
it, or a proxy whose ``Content-Range`` lies) is refused by its first ranged GET, which
holds the envelope: a CorruptFrameError naming the object and both sizes, before a
buffer of the claimed size is allocated or a byte more is fetched (the whole object was
read first: 256 MiB of junk, 16 s; a claimed 2 GiB, 2 GiB allocated)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from helpers import make_batch
from s3_server import FaultProxy, claim_size, s3_client
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire
from rlwire.transport.layout import main_name, sidecar_name

pytestmark = pytest.mark.anyio

#: Appended to the message: several of the reader's 8 MiB ranged GETs.
JUNK = 40 << 20


async def test_a_message_with_junk_appended_is_refused_by_its_first_get(
    s3_url: str, s3_endpoint: dict[str, Any], s3_proxy: FaultProxy
) -> None:
    url = f"{s3_url}/run"
    async with rlwire.open_sender(url, storage_options=s3_endpoint) as sender:
        await sender.send(make_batch(1))
    client, bucket = s3_client(s3_endpoint), s3_url.removeprefix("s3://")
    key = f"run/{main_name(0, 0)}"
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=body + bytes(JUNK))
    async with rlwire.open_receiver(url, storage_options=s3_proxy.options) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            await receiver.areceive(timeout=30)
    message = str(caught.value)
    assert f"{url}/{main_name(0, 0)}" in message
    assert re.search(rf"envelope says {len(body)} bytes\D+{len(body) + JUNK}\b", message)
    gets = [r for m, t, r in s3_proxy.ranges if m == "GET" and t.endswith(main_name(0, 0))]
    assert gets == ["bytes=0-8388607"]  # the first GET only


@pytest.mark.parametrize("claimed", [64 << 20, 1 << 40])
async def test_a_message_whose_size_a_proxy_lies_about_is_refused_by_its_first_get(
    s3_url: str, s3_endpoint: dict[str, Any], s3_proxy: FaultProxy, claimed: int
) -> None:
    url = f"{s3_url}/run"
    async with rlwire.open_sender(url, storage_options=s3_endpoint) as sender:
        await sender.send(make_batch(1))
    name = main_name(0, 0)
    s3_proxy.fault = lambda method, target: (
        claim_size(claimed) if method == "GET" and target.endswith(name) else None
    )
    async with rlwire.open_receiver(url, storage_options=s3_proxy.options) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            await receiver.areceive(timeout=30)
    assert f"{url}/{name}" in str(caught.value)
    assert f"the object is {claimed} (Content-Range)" in str(caught.value)
    gets = [r for m, t, r in s3_proxy.ranges if m == "GET" and t.endswith(name)]
    assert gets == ["bytes=0-8388607"]  # the first GET only


@pytest.mark.parametrize("claimed", [None, 64 << 20, 1 << 40])
async def test_a_sidecar_longer_than_its_envelope_says_is_refused_by_its_first_get(
    s3_url: str, s3_endpoint: dict[str, Any], s3_proxy: FaultProxy, claimed: int | None
) -> None:
    """The sidecar's size is in its main object's envelope: one of another size (junk
    appended, ``None``; or a proxy's claim) is refused by its first ranged GET, before
    more is allocated or fetched (it was read whole, then its size checked)."""
    url = f"{s3_url}/run"
    async with rlwire.open_sender(url, storage_options=s3_endpoint, sidecar="token_ids") as sender:
        await sender.send(make_batch(1))
    client, bucket = s3_client(s3_endpoint), s3_url.removeprefix("s3://")
    side = sidecar_name(0, 0)
    body = client.get_object(Bucket=bucket, Key=f"run/{side}")["Body"].read()
    if claimed is None:
        client.put_object(Bucket=bucket, Key=f"run/{side}", Body=body + bytes(JUNK))
    else:
        s3_proxy.fault = lambda method, target: (
            claim_size(claimed) if method == "GET" and target.endswith(side) else None
        )
    async with rlwire.open_receiver(url, storage_options=s3_proxy.options) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            await receiver.areceive(timeout=30)
    message = str(caught.value)
    assert f"{url}/{side}" in message
    found = len(body) + JUNK if claimed is None else claimed
    assert f"expected {len(body)} bytes, the object is {found} (Content-Range)" in message
    gets = [r for m, t, r in s3_proxy.ranges if m == "GET" and t.endswith(side)]
    assert gets == ["bytes=0-8388607"]  # the first GET only
