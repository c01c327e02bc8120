"""A stage killed between the commit of its fields' sidecar and that of its main file
leaves ``step-….fields-NNN.sidecar.rlw`` with no main file beside it. Its number is
free, as readers count (they stop at the first missing main file): the next stage that
appends to the step and rank takes it, writes its message without a sidecar (the
sidecar's name is taken), and removes the orphan once its own main file is committed.
Before session 29 the orphan counted as taken: every later stage was told "another
stage appended ... since the fields were checked" 8 times and gave up, and receivers
waiting for the fields waited forever.

A sidecar with no main file may also be a live stage's, about to commit its main file:
the stage that takes the number first wins it, and the live one takes the next (its
main file cannot refer to the sidecar removed). Files and S3, asyncio and trio."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from s3_server import FaultProxy, s3_client

import rlwire

pytestmark = pytest.mark.anyio

MAIN = "step-00000000.rank-0000.fields-000.rlw"
SIDE = "step-00000000.rank-0000.fields-000.sidecar.rlw"


def _names(url: str, options: dict[str, Any]) -> list[str]:
    if not url.startswith("s3://"):
        return sorted(n for n in os.listdir(url) if "fields" in n and not n.startswith("."))
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    listed = s3_client(options).list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return sorted(
        key.rpartition("/")[2] for o in listed.get("Contents", []) if "fields" in (key := o["Key"])
    )


def _remove(url: str, options: dict[str, Any], name: str) -> None:
    """Remove ``name`` as a SIGKILL before its commit would have left it: never there."""
    if not url.startswith("s3://"):
        os.remove(os.path.join(url, name))
        return
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    s3_client(options).delete_object(Bucket=bucket, Key=f"{prefix}/{name}")


async def _send(url: str, options: dict[str, Any]) -> None:
    async with rlwire.open_sender(url, storage_options=options) as producer:
        await producer.send({"samples": [{"token_ids": np.arange(3)}, {"token_ids": np.arange(2)}]})


async def _append(url: str, options: dict[str, Any], name: str, value: float) -> str:
    """A stage (never opened) appending ``name``, in a sidecar: "ok" or the error."""
    stage = rlwire.open_sender(url, storage_options=options, sidecar=(name,))
    try:
        await stage.add_fields(0, {name: np.array([value, -value], np.float32)})
    except rlwire.RlwireError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await stage.aclose()
    return "ok"


def _read(url: str, options: dict[str, Any], *names: str) -> dict[str, list[float]]:
    with rlwire.open_receiver(
        url, storage_options=options, fields=names, record_consumed=False
    ) as receiver:
        samples = receiver.receive(timeout=10).samples
    return {name: [float(v) for v in samples[name]] for name in names}


async def test_a_sidecar_left_by_a_killed_stage_blocks_no_later_stage(
    file_or_atomic_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_atomic_s3
    await _send(url, options)
    assert await _append(url, options, "values", 1.0) == "ok"
    _remove(url, options, MAIN)  # killed between its two commits: its sidecar alone
    assert _names(url, options) == [SIDE]

    # The next stage takes number 0, its fields in the main file, and removes the orphan.
    assert await _append(url, options, "score", 2.0) == "ok"
    assert _names(url, options) == [MAIN]
    assert _read(url, options, "score") == {"score": [2.0, -2.0]}
    # The killed stage run again, and another after it: numbers 1 and 2, with sidecars.
    assert await _append(url, options, "values", 3.0) == "ok"
    assert await _append(url, options, "other", 4.0) == "ok"
    assert _names(url, options) == [
        MAIN,
        "step-00000000.rank-0000.fields-001.rlw",
        "step-00000000.rank-0000.fields-001.sidecar.rlw",
        "step-00000000.rank-0000.fields-002.rlw",
        "step-00000000.rank-0000.fields-002.sidecar.rlw",
    ]
    assert _read(url, options, "score", "values", "other") == {
        "score": [2.0, -2.0],
        "values": [3.0, -3.0],
        "other": [4.0, -4.0],
    }


@pytest.fixture(params=["file", "s3"])
def held(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, Any], threading.Event, threading.Event]]:
    """``(url, storage_options, held, go)``: a destination whose first commit of
    :data:`MAIN` waits, once ``held`` is set, until ``go`` is (files: its move into
    place; S3: its PUT, at a proxy in front of the server)."""
    hold, go = threading.Event(), threading.Event()

    def wait() -> None:
        hold.set()
        go.wait(10)

    if request.param == "file":
        real = os.link

        def link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if str(dst).endswith(MAIN) and not hold.is_set():
                wait()
            real(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "link", link)
        yield str(tmp_path / "run"), {}, hold, go
        return
    url = request.getfixturevalue("s3_url")
    with FaultProxy(request.getfixturevalue("s3_endpoint"), atomic_conditions=True) as proxy:

        def fault(method: str, target: str) -> None:
            if method == "PUT" and target.partition("?")[0].endswith(MAIN) and not hold.is_set():
                wait()

        proxy.fault = fault
        yield f"{url}/run", proxy.options, hold, go
        go.set()


async def test_a_live_stage_between_its_commits_takes_the_next_number(
    held: tuple[str, dict[str, Any], threading.Event, threading.Event],
) -> None:
    """Stage A has committed its sidecar 000 and is held before its main file's commit;
    stage B finds the sidecar with no main file, takes 000 and removes the sidecar. A's
    commit then finds 000 taken, and A appends again as 001: both stages' fields arrive,
    whole (A's main file never refers to the sidecar B removed)."""
    url, options, hold, go = held
    await _send(url, options)
    got: dict[str, str] = {}

    async def stage_a() -> None:
        got["a"] = await _append(url, options, "values", 1.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(stage_a)
        assert await anyio.to_thread.run_sync(hold.wait, 20)
        assert _names(url, options) == [SIDE]  # A's sidecar, committed; its main file held
        got["b"] = await _append(url, options, "score", 2.0)
        go.set()
    assert got == {"a": "ok", "b": "ok"}
    assert _names(url, options) == [
        MAIN,
        "step-00000000.rank-0000.fields-001.rlw",
        "step-00000000.rank-0000.fields-001.sidecar.rlw",
    ]
    assert _read(url, options, "values", "score") == {
        "values": [1.0, -1.0],
        "score": [2.0, -2.0],
    }
