"""A receiver with ``fields=`` waiting for a field not appended yet, on S3, asyncio and
trio: each poll reads the step's head and the appended messages' heads, not again, whole,
an appended message holding another of its fields that it read already."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import plain_sample
from s3_server import FaultProxy

import rlwire

pytestmark = pytest.mark.anyio

LENGTHS = (3, 5, 2)
WIDTH = 100_000  # 1.2 MB appended: a poll reading it again shows
STEP = "/step-00000000.rank-0000.rlw"


def _fetched(ranges: list[tuple[str, str, str | None]], name: str) -> int:
    total = 0
    for method, target, ranged in ranges:
        if method == "GET" and name in target and ranged:
            start, _, end = ranged.removeprefix("bytes=").partition("-")
            total += int(end) - int(start) + 1
    return total


async def test_a_wait_for_a_field_reads_appended_fields_once(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    url = f"{s3_url}/run"
    big = np.ones((len(LENGTHS), WIDTH), np.float32)
    with FaultProxy(s3_endpoint) as proxy:
        async with rlwire.open_sender(url, storage_options=s3_endpoint) as sender:
            await sender.send(rlwire.TrainingBatch(samples=[plain_sample(n) for n in LENGTHS]))
            await sender.add_fields(0, {"wide": big})
        seen = len(proxy.ranges)
        async with rlwire.open_receiver(
            url, storage_options=proxy.options, fields=("wide", "critic"), poll_interval=0.02
        ) as receiver:
            polls: list[Any] = []
            for _ in range(20):  # until it polled a few times, however loaded the machine
                with pytest.raises(rlwire.ReceiveTimeout, match="critic"):
                    await receiver.areceive(timeout=1.0)
                polls = [r for r in proxy.ranges[seen:] if r[1].endswith(STEP)]
                if len(polls) >= 3:
                    break
        fetched = _fetched(proxy.ranges[seen:], "fields-000")
    assert len(polls) >= 3  # it polled (the step's head, each time)
    # Whole once, then its head (64 KiB) a poll: it read it whole at every poll before.
    assert fetched < big.nbytes + len(polls) * 70_000, (fetched, len(polls))


async def test_fields_read_while_waiting_come_with_the_step(tmp_path: Any) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[plain_sample(n) for n in LENGTHS]))
        await sender.add_fields(0, {"wide": np.arange(6.0).reshape(3, 2)})
        async with rlwire.open_receiver(
            url, fields=("wide", "critic"), poll_interval=0.01
        ) as receiver:
            with pytest.raises(rlwire.ReceiveTimeout, match="critic"):
                await receiver.areceive(timeout=0.3)  # it read "wide", and waits
            await sender.add_fields(0, {"critic": np.array([1.0, 2.0, 3.0])})
            cols = (await receiver.areceive(timeout=20)).samples
    assert cols["critic"].tolist() == [1.0, 2.0, 3.0]
    assert [row.tolist() for row in cols["wide"]] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
