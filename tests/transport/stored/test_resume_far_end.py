"""A sender resumed after a stream that ended far past its stored steps (a truncate to a
far ``start_step``, as the resume error's repair says, then ``finish``) opens in time
proportional to the steps stored, not to the step numbers between them and the end
mark's (it walked every one of them: 10**9 steps, minutes of CPU); a stored file whose
name gives a step or rank no sender writes is a CorruptFrameError naming it. On the
file sink and on S3; the resumed open runs in a child, so that a walk over every step
number fails the test by its timeout instead of hanging the suite."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

import forked
import pytest
from helpers import make_batch
from s3_server import s3_client

import rlwire

pytestmark = pytest.mark.anyio

#: Seconds the resumed open in the child may take: far more than it needs (well under
#: one), far less than a walk over 10**12 step numbers.
LONG = 30.0
FAR = 10**12

RESUME = """
import json, sys, rlwire
options = json.loads(sys.argv[2])
with rlwire.open_sync_sender(sys.argv[1], on_existing="resume", storage_options=options) as s:
    print(s.next_step, flush=True)
"""


def resumed_next_step(url: str, options: dict[str, Any] | None = None) -> int:
    """The next step of a sender opened on ``url`` with ``on_existing="resume"``, in a child."""
    args = [sys.executable, "-c", RESUME, url, json.dumps(options)]
    done = forked.run(args, capture_output=True, text=True, timeout=LONG)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def end_mark(step: int) -> bytes:
    return b"RLWE" + struct.pack("<HHQ", 1, 1, step)


async def test_resume_after_a_stream_ended_far_past_its_steps(tmp_path: Path) -> None:
    url = str(tmp_path)
    async with rlwire.open_sender(url) as sender:
        for _ in range(4):
            await sender.send(make_batch(1))
    async with rlwire.open_sender(url, on_existing="truncate", start_step=FAR) as sender:
        await sender.finish()
    assert resumed_next_step(url) == FAR


@pytest.mark.parametrize("end", [2**40, 2**64 - 1])
async def test_an_end_mark_far_past_the_steps_is_where_resume_goes_on(
    tmp_path: Path, end: int
) -> None:
    """Every u64 is an end mark a sender may write (2**64 - 1: it sent step 2**64 - 2);
    a sender resumed at the last one opens, and refuses any step."""
    url = str(tmp_path)
    async with rlwire.open_sender(url) as sender:
        await sender.send(make_batch(1))
    (tmp_path / "end.rlw").write_bytes(end_mark(end))
    assert resumed_next_step(url) == end
    (tmp_path / "end.rlw").write_bytes(end_mark(end))  # the resumed open deleted it
    async with rlwire.open_sender(url, on_existing="resume") as sender:
        if end <= 2**64 - 2:
            assert await sender.send(make_batch(1)) == end
        else:
            with pytest.raises(rlwire.StepOrderError, match="2\\*\\*64 - 2"):
                await sender.send(make_batch(1))


@pytest.mark.parametrize(
    "name", [f"step-{2**64 - 1}.rank-0000.rlw", f"step-00000000.rank-{2**63 - 1}.rlw"]
)
async def test_a_stored_name_no_sender_writes_is_refused_and_named(
    tmp_path: Path, name: str
) -> None:
    async with rlwire.open_sender(str(tmp_path)) as sender:
        await sender.send(make_batch(1))
    os.rename(tmp_path / "step-00000000.rank-0000.rlw", tmp_path / name)
    with pytest.raises(rlwire.CorruptFrameError, match="not a file a sender writes") as caught:
        async with rlwire.open_sender(str(tmp_path), on_existing="resume"):
            pass
    assert str(tmp_path / name) in str(caught.value)


async def test_s3_resume_after_an_end_mark_far_past_the_steps(
    s3_url: str, s3_endpoint: dict[str, Any]
) -> None:
    url = f"{s3_url}/far-end"
    async with rlwire.open_sender(url, storage_options=s3_endpoint) as sender:
        await sender.send(make_batch(1))
    bucket = s3_url.removeprefix("s3://")
    s3_client(s3_endpoint).put_object(Bucket=bucket, Key="far-end/end.rlw", Body=end_mark(FAR))
    assert resumed_next_step(url, s3_endpoint) == FAR
