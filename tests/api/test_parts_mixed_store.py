"""A store whose step filled part by part contradicts itself: part files copied in from
another run's directory or bucket (a broken or hostile store; each file intact, its
checksums right). ``parts()`` and ``receive()`` refuse the step with a
``CorruptFrameError`` naming the part: never a part its seal contradicts handed out and
the loop ended as if all were well, never a wait for ever. Real files and objects, on
a directory and on S3; asyncio and trio."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio

PART = "step-00000000.rank-0000.part-{:06d}"


def _fill(url: str, options: dict[str, Any], keys: list[str]) -> None:
    """Step 0 in parts ``keys`` (one sample each, token ids from the part's index)."""
    with rlwire.open_sync_sender(url, storage_options=options) as sender:
        with sender.open_step() as writer:
            for k, key in enumerate(keys):
                writer.put([{"token_ids": np.arange(k, k + 4)}], key=key)
        sender.finish()


def _copy_parts(source: str, target: str, options: dict[str, Any], indices: list[int]) -> None:
    """Copy the files of the parts ``indices`` of rank 0 of step 0 (main files and
    sidecars) from the run at ``source`` over those of the run at ``target``."""
    prefixes = tuple(PART.format(i) + "." for i in indices)
    if not source.startswith("s3://"):
        for path in Path(source).iterdir():
            if path.name.startswith(prefixes):
                shutil.copyfile(path, Path(target, path.name))
        return
    from s3_server import s3_client

    client = s3_client(options)
    bucket, _, prefix = source.removeprefix("s3://").partition("/")
    _, _, to = target.removeprefix("s3://").partition("/")
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")["Contents"]
    for name in (o["Key"].rpartition("/")[2] for o in listed):
        if name.startswith(prefixes):
            copied = {"Bucket": bucket, "Key": f"{prefix}/{name}"}
            client.copy_object(Bucket=bucket, Key=f"{to}/{name}", CopySource=copied)


def _two_runs(
    file_or_s3: tuple[str, dict[str, Any]], indices: list[int], keys: tuple[str, ...] = ("k0", "k1")
) -> tuple[str, dict[str, Any]]:
    """A run whose step 0 was put as ``keys`` and sealed so, with the files of its parts
    ``indices`` copied from another run's step 0, put as keys k0, k7."""
    url, options = file_or_s3
    other = url.removesuffix("run") + "other"
    _fill(url, options, list(keys))
    _fill(other, options, ["k0", "k7"])
    _copy_parts(other, url, options, indices)
    return url, options


async def test_parts_whose_keys_the_seal_contradicts_are_refused_at_the_seal(
    file_or_s3: tuple[str, dict[str, Any]], anyio_backend: str
) -> None:
    """Both parts from the other run (part 1 follows part 0, as in one run): ``parts()``
    cannot know part 1's key is wrong until the seal, and there it raises instead of
    ending the loop (it ended normally, having handed out key k7, which the seal does
    not list); a later call raises the same. ``receive()`` refuses the step too."""
    url, options = _two_runs(file_or_s3, [0, 1])
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, record_consumed=False
    ) as receiver:
        keys = []
        with anyio.fail_after(30):
            for _ in range(2):
                with pytest.raises(rlwire.CorruptFrameError) as info:
                    async for part in receiver.aparts(timeout=10):
                        keys.append(part.key)
                assert "part 1 of rank 0 of step 0 holds key 'k7'; the seal lists key 'k1'" in (
                    str(info.value)
                )
                assert PART.format(1) in str(info.value)
            assert keys == ["k0", "k7"]  # handed out before the seal, not again
            assert receiver.next_step == 0
            with pytest.raises(rlwire.CorruptFrameError, match="holds key 'k7'; the seal lists"):
                await receiver.areceive(timeout=10)


async def test_parts_past_those_the_seal_lists_are_refused_at_the_seal(
    file_or_s3: tuple[str, dict[str, Any]], anyio_backend: str
) -> None:
    """The run's step was sealed with one part (k0); both parts of the other run copied
    in. ``parts()`` hands out a part 1 the seal does not list, and at the seal raises
    (it ended the loop normally); ``receive()`` returns the one part the seal lists."""
    url, options = _two_runs(file_or_s3, [0, 1], keys=("k0",))
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, record_consumed=False
    ) as receiver:
        keys = []
        with anyio.fail_after(30):
            with pytest.raises(rlwire.CorruptFrameError) as info:
                async for part in receiver.aparts(timeout=10):
                    keys.append(part.key)
            words = "part 1 of rank 0 of step 0 holds key 'k7'; the seal lists 1 part for the rank"
            assert words in str(info.value)
            assert keys == ["k0", "k7"]
            got = await receiver.areceive(timeout=10)
    assert [int(s["token_ids"][0]) for s in got] == [0]


async def test_a_step_mixing_the_parts_of_two_runs_is_refused_not_waited_for(
    file_or_s3: tuple[str, dict[str, Any]], anyio_backend: str
) -> None:
    """Part 1 alone from the other run: it follows another part 0 than the one stored,
    which no run sent since replaced. ``receive()`` with no timeout raised nothing and
    waited for ever (a step being sent again, it thought); ``parts()`` called it a step
    sent again (StepGapError, "open a receiver at start_step=0", which finds the same).
    Both now say the step is corrupt."""
    url, options = _two_runs(file_or_s3, [1])
    words = "follows another part 0 (of another run of the step) than the rank's part 0"
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, record_consumed=False
    ) as receiver:
        with anyio.fail_after(30):
            with pytest.raises(rlwire.CorruptFrameError) as info:
                await receiver.areceive()
            assert words in str(info.value) and PART.format(1) in str(info.value)
            keys = []
            with pytest.raises(rlwire.CorruptFrameError, match=re.escape(words)):
                async for part in receiver.aparts(timeout=10):
                    keys.append(part.key)
            assert keys == ["k0"]


def _seal_aside(url: str, options: dict[str, Any]) -> Any:
    """Take step 0's seal away; what puts it back, as it was."""
    name = "step-00000000.seal.rlw"
    if not url.startswith("s3://"):
        path = Path(url, name)
        data = path.read_bytes()
        path.unlink()
        return lambda: path.write_bytes(data)
    from s3_server import s3_client

    client = s3_client(options)
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    key = f"{prefix}/{name}"
    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.delete_object(Bucket=bucket, Key=key)
    return lambda: client.put_object(Bucket=bucket, Key=key, Body=data)


@pytest.mark.parametrize(
    ("sealed", "words"),
    [
        (("k0", "k1"), "part 1 of rank 0 of step 0 holds key 'k7'; the seal lists key 'k1'"),
        (("k0",), "part 1 of rank 0 of step 0 holds key 'k7'; the seal lists 1 part for the rank"),
    ],
)
async def test_parts_handed_out_before_a_resume_are_checked_at_the_seal(
    file_or_s3: tuple[str, dict[str, Any]],
    anyio_backend: str,
    sealed: tuple[str, ...],
    words: str,
) -> None:
    """Both parts from the other run, handed out (k0, k7) by a receiver that then asked
    for part 2 and stopped before the seal came: one resumed there (``resume=True``, at
    part 2) reads the seal, which contradicts part 1 (another key, or one part listed).
    It ended the loop as if all were well (it knew no key of the parts before it); it
    now reads their keys again (the envelopes only) and refuses the step as the
    receiver that handed them out would have."""
    url, options = _two_runs(file_or_s3, [0, 1], keys=sealed)
    put_back = _seal_aside(url, options)
    async with rlwire.open_receiver(url, storage_options=options, type=list) as receiver:
        keys = []
        with anyio.fail_after(30), pytest.raises(rlwire.ReceiveTimeout):
            async for part in receiver.aparts(timeout=0.5):
                keys.append(part.key)
        assert keys == ["k0", "k7"]
    put_back()
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, resume=True
    ) as receiver:
        assert (receiver.next_step, receiver.next_part) == (0, 2)
        with anyio.fail_after(30), pytest.raises(rlwire.CorruptFrameError) as info:
            async for part in receiver.aparts(timeout=10):
                keys.append(part.key)
        assert words in str(info.value) and PART.format(1) in str(info.value)
        assert keys == ["k0", "k7"]  # nothing handed out again
