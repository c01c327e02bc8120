"""A file at the name of a mark or a seal longer than any can be (docs/format.md,
*Marks*) is refused by its size, unread: a receiver raises ``CorruptFrameError`` naming
the file, its size and the limit. A sparse end mark, consumption mark, part mark or seal
of 4 GiB was mapped whole: under a limit on address space a ``TransportError`` ("cannot
map"), without one gigabytes mapped for 16 bytes. On S3 one ranged read of at most the
limit is made (and a HEAD for the size). A sender with ``keep_last`` reads a seal whole,
up to the largest a reader accepts: it read no more than a mark (4096 bytes), so a seal
of a few hundred parts was taken for garbled and every send after it raised."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import forked
import pytest
from helpers import make_batch, make_sample
from s3_server import s3_client

import rlwire

pytestmark = pytest.mark.anyio

HUGE = 4 << 30

#: A receiver under a 3 GiB limit on address space: prints what reading ``name`` gives.
READER = """
import json, resource, sys, rlwire
url, kind = sys.argv[1], sys.argv[2]
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
options = {"start_step": 1} if kind == "end" else {"resume": True}
try:
    with rlwire.open_receiver(url, **options) as receiver:
        receiver.receive(timeout=5)
    print("read")
except Exception as exc:
    print(type(exc).__name__, exc)
"""

#: Each file, what it is, the step a receiver reads it at, and the limit it is over.
MARKS = {
    "end": ("end.rlw", "an end mark is at most 16 bytes"),
    "consumption": ("consumed.rank-0000.rlw", "a consumption mark is at most 16 bytes"),
    "part": ("consumed.rank-0000.part.rlw", "a part mark is at most 4096 bytes"),
    "seal": ("step-00000000.seal.rlw", "a seal is at most 67108884 bytes"),
}


async def stored(url: str, options: dict[str, Any] | None = None) -> None:
    """Step 0 filled part by part and sealed, a consumption and a part mark of rank 0,
    and the end mark at step 1."""
    async with rlwire.open_sender(url, storage_options=options) as sender:
        async with sender.open_step(ranks=1) as writer:
            await writer.put([make_sample(4)], key="a")
            await writer.put([make_sample(4)], key="b")
        await sender.finish()
    with rlwire.open_receiver(url, storage_options=options) as receiver:
        parts = receiver.parts(timeout=10)
        next(parts)
        next(parts)  # marks part 1 of step 0


@pytest.mark.parametrize("kind", list(MARKS))
async def test_a_sparse_mark_of_gigabytes_is_refused_unread(tmp_path: Path, kind: str) -> None:
    url = str(tmp_path / "run")
    await stored(url)
    name, limit = MARKS[kind]
    path = tmp_path / "run" / name
    assert path.exists()
    os.truncate(path, HUGE)
    if kind == "seal":  # a receiver resumed at step 0, part 0 reads it
        (tmp_path / "run" / "consumed.rank-0000.part.rlw").unlink()
    done = forked.run(
        [sys.executable, "-c", READER, url, "end" if kind == "end" else "resume"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("CorruptFrameError"), done.stdout
    assert f"{path}" in done.stdout
    assert f"{limit}, this one {HUGE}: not read" in done.stdout


async def test_an_s3_mark_longer_than_a_mark_is_refused_by_its_size(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    url = f"{s3_url}/run"
    async with rlwire.open_sender(url, storage_options=s3_endpoint) as sender:
        await sender.send(make_batch(1))
        await sender.finish()
    bucket = s3_url.removeprefix("s3://")
    body = b"RLWE" + bytes(1 << 20)
    s3_client(s3_endpoint).put_object(Bucket=bucket, Key="run/end.rlw", Body=body)
    with rlwire.open_receiver(url, start_step=1, storage_options=s3_endpoint) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            receiver.receive(timeout=10)
    message = str(caught.value)
    assert f"{url}/end.rlw" in message
    assert f"an end mark is at most 16 bytes, this one {len(body)}: not read" in message


async def test_keep_last_reads_a_seal_of_many_parts_whole(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """A seal of twelve 500-byte keys is some 6 KB: the sender's prune read 4096 bytes
    of it, refused it as garbled, and each later send raised ``CorruptFrameError``. (Long
    keys, not hundreds of parts: on S3 each part is several requests.)"""
    url, options = file_or_s3
    keys = [f"rollout-{i:02d}-" + "k" * 500 for i in range(12)]
    async with rlwire.open_sender(url, keep_last=1, storage_options=options) as sender:
        async with sender.open_step(ranks=1) as writer:
            for key in keys:
                await writer.put([make_sample(1)], key=key)
        await sender.send(make_batch(1))
        with rlwire.open_receiver(url, storage_options=options) as receiver:
            assert [part.key for part in receiver.parts(timeout=10)] == keys
            receiver.receive(timeout=10)
            with pytest.raises(rlwire.ReceiveTimeout):
                receiver.receive(timeout=0.1)  # marks step 2: past steps 0 and 1
        for step in (2, 3):
            assert await sender.send(make_batch(1)) == step
    with rlwire.open_receiver(url, start_step=0, storage_options=options) as receiver:
        with pytest.raises(rlwire.StepGapError):  # step 0 was pruned
            receiver.receive(timeout=10)


def plant_huge(url: str, options: dict[str, Any], name: str) -> int:
    """Put a file ``name`` far longer than any mark at ``url``: a sparse 4 GiB file, or
    on S3 an object of 1 MiB; its size."""
    if not options:
        with open(os.path.join(url, name), "wb") as file:
            file.truncate(HUGE)
        return HUGE
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    s3_client(options).put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=bytes(1 << 20))
    return 1 << 20


async def test_keep_last_names_a_consumption_mark_of_gigabytes_by_its_size(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """A sender with ``keep_last`` reads each rank's consumption mark: one of 4 GiB (a
    sparse file; on S3 an object of 1 MiB) is refused by its size, which the message
    gives (it said 'this one 4096', the bytes it had read)."""
    url, options = file_or_s3
    async with rlwire.open_sender(url, keep_last=1, storage_options=options) as sender:
        for _ in range(2):
            await sender.send(make_batch(1))
        name = "consumed.rank-0000.rlw"
        size = plant_huge(url, options, name)
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            await sender.send(make_batch(1))
    message = str(caught.value)
    assert f"{url}/{name}" in message
    assert f"a consumption mark is at most 16 bytes, this one {size}: not read" in message


async def test_opening_names_a_rewrite_mark_of_gigabytes_by_its_size(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """A sender opening a destination reads its rewrite mark, if there is one: one of
    4 GiB (on S3 1 MiB) is refused by its size, which the message gives (it said 'this
    one 4096')."""
    url, options = file_or_s3
    async with rlwire.open_sender(url, storage_options=options) as sender:
        await sender.send(make_batch(1))
    name = "rewrite.rlw"
    size = plant_huge(url, options, name)
    with pytest.raises(rlwire.CorruptFrameError) as caught:
        async with rlwire.open_sender(url, storage_options=options, on_existing="resume"):
            pass
    message = str(caught.value)
    assert f"{url}/{name}" in message
    assert f"a rewrite mark is at most 16 bytes, this one {size}: not read" in message
