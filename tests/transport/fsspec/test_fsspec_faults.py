"""The S3 sink under network faults: a real moto server behind a fault-injecting proxy
on loopback (``s3_server.FaultProxy``) that resets connections, loses replies, or goes
down altogether (an outage), at chosen requests.

s3fs's own retries are cut to one attempt (:func:`fast_fs`), so that each test decides
the fault's length relative to rlwire's retries alone and stays quick.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import fsspec
import fsspec.asyn
import numpy as np
import pytest
from s3_server import DROP_REPLY, HOLD, RESET, FaultProxy, s3_client
from s3_server import s3_proxy as s3_proxy  # the fixture, for this module

import rlwire
from rlwire._core.slicing import run_sliced
from rlwire.codecs import MsgpackCodec
from rlwire.transport.fsspec import FsspecSink, FsspecSource, _s3_upload

MiB = 1 << 20
CODEC = MsgpackCodec(sidecar=["routed_experts"])
MAIN0 = "step-00000000.rank-0000.rlw"


def frame(routed_bytes: int, value: int = 7) -> rlwire.Frame:
    return CODEC.encode(
        {"ids": np.arange(4), "routed_experts": np.full(routed_bytes, value, np.uint8)}
    )


def batch(routed_bytes: int) -> rlwire.TrainingBatch:
    n = 64
    return rlwire.TrainingBatch(
        samples=[
            rlwire.TrainingSample(
                token_ids=np.arange(n),
                mask=np.ones(n, bool),
                logprobs=np.zeros(n, np.float32),
                temperatures=np.ones(n, np.float32),
                advantages=np.zeros(n, np.float32),
                env_name="env",
                routed_experts=np.ones((n, max(1, routed_bytes // n), 1), np.uint8),
            )
        ]
    )


def fast_fs(proxy: FaultProxy) -> None:
    """One attempt per s3fs call (fsspec caches the filesystem, so the sinks and
    sources made with ``proxy.options`` share this one)."""
    fsspec.filesystem("s3", **proxy.options).retries = 1


def bucket_of(url: str) -> str:
    return url.removeprefix("s3://").partition("/")[0]


def objects(options: dict[str, Any], url: str) -> list[str]:
    out = s3_client(options).list_objects_v2(Bucket=bucket_of(url))
    return sorted(o["Key"] for o in out.get("Contents", []))


def uploads(options: dict[str, Any], url: str) -> list[str]:
    out = s3_client(options).list_multipart_uploads(Bucket=bucket_of(url))
    return [u["Key"] for u in out.get("Uploads", [])]


def outage_from(proxy: FaultProxy, method: str, suffix: str) -> None:
    """The network fails from the first ``method`` request whose target ends with (or,
    before a query, ends with) ``suffix`` on, that request included."""

    def fault(m: str, target: str) -> str | None:
        if m == method and target.partition("?")[0].endswith(suffix):
            proxy.down = True
            return RESET
        return None

    proxy.fault = fault


@pytest.fixture(autouse=True)
def short_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """rlwire's own retries after a failed request wait 0.1-2 s (3.4 s in all), meant
    for an outage; the same schedule, shorter, keeps these tests quick."""
    monkeypatch.setattr(_s3_upload, "RETRY_DELAYS", (0.05, 0.1, 0.2, 0.4))


@pytest.fixture
def loop_errors() -> Iterator[list[dict[str, Any]]]:
    """What fsspec's I/O loop reports to its exception handler ("Task exception was
    never retrieved", ...) while the test runs, garbage collected at the end."""
    loop = fsspec.asyn.get_loop()
    seen: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        yield seen
    finally:
        gc.collect()
        loop.set_exception_handler(old)


# ---------------------------------------------------- 1. a commit's state is never guessed


@pytest.mark.parametrize("landed", [False, True])
def test_an_outage_at_commit_leaves_the_state_unknown_and_resume_settles_it(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str, landed: bool
) -> None:
    """The main object's PUT fails (its reply lost, or the request itself) and the
    network stays down, so the existence check fails too: the step is neither visible
    nor invisible but unknown, and the error says how to settle it. Once the network is
    back, ``resume`` starts at the step if it did not land, after it if it did."""
    fast_fs(s3_proxy)
    sink = FsspecSink(s3_url, storage_options=s3_proxy.options)
    assert sink.open("error") == 0
    staged = run_sliced(sink.stage(0, [frame(1000)]))

    def fault(method: str, target: str) -> str | None:
        if method == "PUT" and target.endswith(MAIN0):
            s3_proxy.down = True
            return DROP_REPLY if landed else RESET
        return None

    s3_proxy.fault = fault
    with pytest.raises(rlwire.TransportError) as info:
        staged.commit()
    assert staged.visible is None
    message = str(info.value)
    assert "unknown" in message and "on_existing='resume'" in message, message
    assert "ranks []" not in message
    assert len(s3_proxy.requests("HEAD")) > 1  # the check was retried
    s3_proxy.down = False
    s3_proxy.fault = None
    # The sidecar stays: deleting it could tear a step that did become visible.
    assert FsspecSink(s3_url, storage_options=s3_endpoint).open("resume") == (1 if landed else 0)
    if landed:
        got = FsspecSource(s3_url, storage_options=s3_endpoint).read(0)
        assert got is not None and (CODEC.decode(got)["routed_experts"] == 7).all()


@pytest.mark.anyio
async def test_the_sender_stops_at_an_unknown_step_and_a_resumed_one_fills_it(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    """The campaign's failure: the sender used to count the unknown step as sent and go
    on with the next number, leaving a hole that receivers wait at forever."""
    fast_fs(s3_proxy)
    main1 = "step-00000001.rank-0000.rlw"
    async with rlwire.open_sender(
        s3_url, storage_options=s3_proxy.options, sidecar=("routed_experts",)
    ) as sender:
        assert await sender.send(batch(1000)) == 0
        outage_from(s3_proxy, "PUT", main1)
        with pytest.raises(rlwire.TransportError, match="unknown"):
            await sender.send(batch(1000))
        s3_proxy.down = False
        s3_proxy.fault = None
        with pytest.raises(rlwire.TransportError, match="resume"):
            await sender.send(batch(1000))  # refused, not sent as step 2
    assert "step-00000002.rank-0000.rlw" not in objects(s3_endpoint, s3_url)
    async with rlwire.open_sender(
        s3_url, storage_options=s3_endpoint, sidecar=("routed_experts",), on_existing="resume"
    ) as sender:
        assert await sender.send(batch(1000)) == 1
    with rlwire.open_receiver(s3_url, storage_options=s3_endpoint) as receiver:
        assert len([receiver.receive(timeout=10) for _ in range(2)]) == 2  # no hole at 1


def test_a_lost_reply_of_a_main_object_that_landed_is_a_commit(
    s3_proxy: FaultProxy, s3_url: str
) -> None:
    """The main object's PUT landed but its reply was lost: the existence check finds
    it, so the step is committed in full, not reported as partly visible."""
    fast_fs(s3_proxy)
    sink = FsspecSink(s3_url, storage_options=s3_proxy.options)
    sink.open("error")
    staged = run_sliced(sink.stage(0, [frame(1000)]))
    s3_proxy.fault = lambda m, t: DROP_REPLY if m == "PUT" and t.endswith(MAIN0) else None
    staged.commit()
    assert staged.visible is True


def test_a_partly_visible_step_names_its_visible_ranks(s3_proxy: FaultProxy, s3_url: str) -> None:
    fast_fs(s3_proxy)
    sink = FsspecSink(s3_url, storage_options=s3_proxy.options)
    sink.open("error")
    staged = run_sliced(sink.stage(0, [frame(1000), frame(1000), frame(1000)]))
    # Rank 0's reply is lost (it landed), rank 1's request never arrives.
    rank0, rank1 = MAIN0, "step-00000000.rank-0001.rlw"
    s3_proxy.fault = lambda m, t: (
        DROP_REPLY if m == "PUT" and t.endswith(rank0) else RESET if t.endswith(rank1) else None
    )
    with pytest.raises(rlwire.TransportError, match=r"visible for ranks \[0, 2\] only"):
        staged.commit()
    assert staged.visible is True


@pytest.mark.anyio
async def test_a_failed_rank_0_commit_makes_no_other_rank_visible(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    """Rank 0's main object goes up first: when it fails, no other rank's is made
    visible, so the sender reuses the step's number. (Committed all at once, rank 1 could
    land alone; resume then took that step, missing rank 0, for the oldest step cut
    short by retention, and rank 0's receiver waited for it forever.)"""
    fast_fs(s3_proxy)
    s3_proxy.fault = lambda m, t: RESET if m == "PUT" and t.endswith(MAIN0) else None
    async with rlwire.open_sender(s3_url, storage_options=s3_proxy.options) as sender:
        with pytest.raises(rlwire.TransportError, match="nothing was made visible"):
            await sender.send_ranks([batch(1000), batch(1000)])
        assert [k for k in objects(s3_endpoint, s3_url) if "rank" in k] == []
        s3_proxy.fault = None
        assert await sender.send_ranks([batch(1000), batch(1000)]) == 0
    for rank in (0, 1):
        with rlwire.open_receiver(s3_url, storage_options=s3_endpoint, rank=rank) as receiver:
            receiver.receive(timeout=10)
            assert receiver.last_step == 0


def test_a_sidecar_whose_reply_was_lost_is_deleted_with_the_failed_step(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    """The sidecar's PUT landed but its reply was lost: the step fails with nothing
    visible, and the sidecar it did write is deleted too, not left behind."""
    fast_fs(s3_proxy)
    sink = FsspecSink(s3_url, storage_options=s3_proxy.options)
    sink.open("error")
    staged = run_sliced(sink.stage(0, [frame(1000)]))
    side = "step-00000000.rank-0000.sidecar.rlw"
    s3_proxy.fault = lambda m, t: DROP_REPLY if m == "PUT" and t.endswith(side) else None
    with pytest.raises(rlwire.TransportError, match="nothing was made visible"):
        staged.commit()
    s3_proxy.fault = None
    assert objects(s3_endpoint, s3_url) == []


# ------------------------------------------------ 2. no multipart upload is left behind


@pytest.mark.anyio
async def test_a_short_outage_during_a_send_leaves_no_upload(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str, loop_errors: list[Any]
) -> None:
    """The network goes down while parts are in flight and comes back soon: the send
    fails, and aborting its uploads is retried until it succeeds."""
    fast_fs(s3_proxy)
    async with rlwire.open_sender(
        s3_url, storage_options=s3_proxy.options, sidecar=("routed_experts",)
    ) as sender:
        down = False

        def fault(method: str, target: str) -> str | None:
            # Down from the first part on; back up once the first abort has failed, so
            # the send fails whatever the timing and only a retried abort can succeed.
            nonlocal down
            if method == "PUT" and target.partition("?")[0].endswith(".sidecar.rlw"):
                down = True
            if down and method == "DELETE" and "uploadId" in target:
                down = False
                s3_proxy.fault = None
                return RESET
            return RESET if down else None

        s3_proxy.fault = fault
        with pytest.raises(rlwire.TransportError):
            await sender.send(batch(24 * MiB))
        assert uploads(s3_endpoint, s3_url) == []  # before close: the abort itself retried
        assert sender.next_step == 0
        assert await sender.send(batch(1000)) == 0
    assert objects(s3_endpoint, s3_url) == [
        "step-00000000.rank-0000.rlw",
        "step-00000000.rank-0000.sidecar.rlw",
    ]
    assert not [c for c in loop_errors if "never retrieved" in str(c.get("message"))]


@pytest.mark.anyio
async def test_uploads_an_outage_kept_from_aborting_are_aborted_at_close(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    fast_fs(s3_proxy)
    async with rlwire.open_sender(
        s3_url, storage_options=s3_proxy.options, sidecar=("routed_experts",)
    ) as sender:
        # Fail the abort only (everything else goes through): the send fails.
        s3_proxy.fault = lambda m, t: RESET if m in ("PUT", "DELETE") and "uploadId" in t else None
        with pytest.raises(rlwire.TransportError):
            await sender.send(batch(12 * MiB))
        assert len(uploads(s3_endpoint, s3_url)) == 1  # the abort failed, every retry
        s3_proxy.fault = None
    assert uploads(s3_endpoint, s3_url) == []


@pytest.mark.anyio
async def test_an_upload_made_twice_by_a_lost_reply_is_aborted_at_close(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    """The reply to "create a multipart upload" is lost; botocore asks again and gets a
    second upload. The send succeeds, but the first upload, whose id rlwire never saw,
    would be left behind without the sink's listing at close."""
    with FaultProxy(s3_endpoint) as proxy:
        # botocore's own retries kept: they make the twin.
        options = {k: v for k, v in proxy.options.items() if k != "config_kwargs"}
        lost: list[str] = []

        def fault(method: str, target: str) -> str | None:
            if method == "POST" and target.endswith("?uploads") and not lost:
                lost.append(target)
                return DROP_REPLY
            return None

        proxy.fault = fault
        async with rlwire.open_sender(
            s3_url, storage_options=options, sidecar=("routed_experts",)
        ) as sender:
            assert await sender.send(batch(6 * MiB)) == 0
            assert lost and len(uploads(s3_endpoint, s3_url)) == 1
    assert uploads(s3_endpoint, s3_url) == []
    assert len(objects(s3_endpoint, s3_url)) == 2


@pytest.mark.anyio
async def test_an_outage_through_close_warns_and_resume_aborts_the_leftovers(
    s3_proxy: FaultProxy, s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    fast_fs(s3_proxy)
    with pytest.warns(ResourceWarning, match="unfinished multipart upload"):
        async with rlwire.open_sender(
            s3_url, storage_options=s3_proxy.options, sidecar=("routed_experts",)
        ) as sender:
            outage_from(s3_proxy, "PUT", ".sidecar.rlw")
            with pytest.raises(rlwire.TransportError):
                await sender.send(batch(12 * MiB))
    assert len(uploads(s3_endpoint, s3_url)) == 1
    s3_proxy.down = False
    assert FsspecSink(s3_url, storage_options=s3_endpoint).open("resume") == 0
    assert uploads(s3_endpoint, s3_url) == []


@pytest.mark.anyio
async def test_closing_a_sender_that_never_opened_asks_nothing(
    s3_proxy: FaultProxy, s3_url: str
) -> None:
    async with rlwire.open_sender(s3_url, storage_options=s3_proxy.options):
        pass
    assert not [t for _, t, _ in s3_proxy.requests() if "uploads" in t]


# ------------------------------------------- 3. no task's exception is left unretrieved


def test_an_outage_with_parts_in_flight_leaves_no_unretrieved_task_exception(
    s3_endpoint: dict[str, Any], s3_url: str, loop_errors: list[Any]
) -> None:
    """Every part in flight fails at the same moment (the proxy holds them, then resets
    them all): the first failure ends the send and the others are cancelled, but a part
    whose request failed just before its cancellation reached fsspec's loop must still
    have its error taken, or asyncio logs "Task exception was never retrieved"."""
    window = 8
    for attempt in range(2):
        with FaultProxy(s3_endpoint) as proxy:
            fast_fs(proxy)
            sink = FsspecSink(
                s3_url, storage_options=proxy.options, part_bytes=5 * MiB, max_concurrency=window
            )
            sink.open("overwrite")
            held = 0

            def fault(method: str, target: str) -> str | None:
                nonlocal held
                if method == "PUT" and "partNumber" in target:
                    held += 1
                    if held == window:
                        threading.Timer(0.05, proxy.release).start()
                    return HOLD
                return None

            proxy.fault = fault
            with pytest.raises(rlwire.TransportError):
                run_sliced(sink.stage(attempt, [frame(60 * MiB)]))
            assert held >= window
            proxy.fault = None
            sink.close()
        gc.collect()
    anyio.run(anyio.sleep, 0.5)  # let the cancelled tasks end on fsspec's loop
    gc.collect()
    assert [c.get("message") for c in loop_errors] == []
    assert [o for o in objects(s3_endpoint, s3_url) if o.rsplit("/", 1)[-1] != "fence.rlw"] == []
    assert uploads(s3_endpoint, s3_url) == []


# ------------------------------------------------------------ 4. messages


def test_a_failure_before_anything_is_visible_names_no_ranks(
    s3_proxy: FaultProxy, s3_url: str
) -> None:
    fast_fs(s3_proxy)
    sink = FsspecSink(s3_url, storage_options=s3_proxy.options)
    sink.open("error")
    staged = run_sliced(sink.stage(0, [frame(1000)]))
    s3_proxy.fault = lambda m, t: RESET if m == "PUT" and t.endswith(MAIN0) else None
    with pytest.raises(rlwire.TransportError) as info:
        staged.commit()  # the PUT never arrived; the check says so
    assert staged.visible is False
    message = str(info.value)
    assert "nothing was made visible" in message and "ranks" not in message
    assert message.count(s3_url) == 1, message
