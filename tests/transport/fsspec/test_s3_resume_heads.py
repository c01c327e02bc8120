"""A sender resumed on S3 reads how many ranks every stored step was sent to (1.8, the
envelope's ``ranks``), one ranged GET of each step's lowest visible rank's main object,
made concurrently: each object once however often the open asks, and a GET that fails
is a TransportError naming its object, not a step taken for whole."""

from __future__ import annotations

import re
from typing import Any

import pytest
from s3_server import FaultProxy, refuse, s3_client
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire
from rlwire.testing import make_sample
from rlwire.transport.layout import main_name

pytestmark = pytest.mark.anyio

STEPS = 40


def batch(step: int) -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=[make_sample(8, seed=step, routed=False)])


async def stored(url: str, options: dict[str, Any]) -> None:
    async with rlwire.open_sender(url, storage_options=options) as sender:
        for step in range(STEPS):
            await sender.send_ranks([batch(step)])


def gets_of_steps(proxy: FaultProxy) -> list[int]:
    """The steps whose main object of rank 0 the proxy saw a GET of, in order."""
    found = (re.search(r"step-(\d+)\.rank-0000\.rlw", t) for _, t, _ in proxy.requests("GET"))
    return [int(m.group(1)) for m in found if m]


async def test_resume_reads_every_steps_head_once(
    s3_url: str, s3_endpoint: dict[str, Any], s3_proxy: FaultProxy
) -> None:
    await stored(f"{s3_url}/run", s3_endpoint)
    async with rlwire.open_sender(
        f"{s3_url}/run", storage_options=s3_proxy.options, on_existing="resume"
    ) as sender:
        assert await sender.send_ranks([batch(STEPS)]) == STEPS
    assert sorted(gets_of_steps(s3_proxy)) == list(range(STEPS))


async def test_a_head_that_cannot_be_read_is_named(
    s3_url: str, s3_endpoint: dict[str, Any], s3_proxy: FaultProxy
) -> None:
    url = f"{s3_url}/run"
    await stored(url, s3_endpoint)
    middle = main_name(STEPS // 2, 0)
    s3_proxy.fault = lambda method, target: (
        refuse(403, "AccessDenied") if method == "GET" and target.endswith(middle) else None
    )
    with pytest.raises(rlwire.TransportError, match=re.escape(f"{url}/{middle}")):
        async with rlwire.open_sender(url, storage_options=s3_proxy.options, on_existing="resume"):
            pass
    # Nothing was sent, and the steps are as they were.
    listed = s3_client(s3_endpoint).list_objects_v2(Bucket=s3_url.removeprefix("s3://"))
    assert main_name(STEPS, 0) not in {o["Key"].rpartition("/")[2] for o in listed["Contents"]}
