"""Conditional commits on S3 (``If-None-Match: *``), against a real moto server on
loopback: of two senders committing one step, two stages appending to one step and rank,
or two producers sealing one step at the same moment, exactly one takes each name and the
other gets the typed error the file sink raises (``add_fields`` then takes the next
number); a retried request whose reply was lost is its own commit; and the storage option
``conditional_writes`` turns them off. Every async test runs under asyncio and trio.

The races are forced, not hoped for: each contender's commit waits on a barrier until
the other's is ready too (both past their checks), then both go at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import fsspec
import numpy as np
import pytest
from helpers import append_at_once, send_a_part_of_two_rows
from s3_server import DROP_REPLY, ERROR_IN_200, NOT_IMPLEMENTED, FaultProxy, refuse, s3_client

import rlwire
from rlwire.transport.fsspec import FsspecSink, _s3_upload
from rlwire.transport.fsspec._s3_upload import S3Staging

pytestmark = pytest.mark.anyio

MAIN0 = "step-00000000.rank-0000.rlw"
SIDE0 = "step-00000000.rank-0000.sidecar.rlw"
MiB = 1 << 20


def batch(value: int, routed_bytes: int) -> dict[str, Any]:
    """A step's message whose every byte says which sender made it (``value``), with
    a sidecar of ``routed_bytes``."""
    return {
        "samples": [
            {
                "token_ids": np.full(8, value, np.int64),
                "routed_experts": np.full(routed_bytes, value, np.uint8),
            }
        ]
    }


@pytest.fixture(scope="module")
def module_proxy(s3_endpoint: dict[str, Any]) -> Iterator[FaultProxy]:
    """One :class:`FaultProxy` for the module: its tests share one s3fs client (a new
    client costs a few tenths of a second)."""
    with FaultProxy(s3_endpoint) as proxy:
        # s3fs's client adds to config_kwargs in place, so the first filesystem made
        # with these options is fsspec's cached one for no later call: make it, and the
        # one the tests share.
        for _ in range(2):
            fsspec.filesystem("s3", **proxy.options).connect()
        yield proxy


@pytest.fixture
def s3_proxy(module_proxy: FaultProxy) -> FaultProxy:
    """The module's proxy, passing every request until the test says otherwise."""
    module_proxy.fault = module_proxy.conditional = None
    with module_proxy._lock:
        module_proxy.seen.clear()
    return module_proxy


def objects(options: dict[str, Any], url: str) -> list[str]:
    out = s3_client(options).list_objects_v2(Bucket=url.removeprefix("s3://"))
    return sorted(o["Key"] for o in out.get("Contents", []))


def together(monkeypatch: pytest.MonkeyPatch, names: Callable[[str], bool]) -> None:
    """The first two commits of an object whose name ``names`` picks wait until both
    are ready (each past its checks), then go one right after the other (moto's checks
    of a condition are not atomic, S3's are). Later commits do not wait."""
    barrier, done, count, lock = (
        threading.Barrier(2, timeout=5),
        threading.Event(),
        [0],
        threading.Lock(),
    )
    commit = S3Staging.commit

    def racing(self: S3Staging) -> None:
        if not any(names(o.key.rpartition("/")[2]) for o in self.mains):
            return commit(self)
        with lock:
            count[0] += 1
            if count[0] > 2:
                return commit(self)
        if barrier.wait():  # the second: after the first's commit
            assert done.wait(5)
            return commit(self)
        try:
            return commit(self)
        finally:
            done.set()

    monkeypatch.setattr(S3Staging, "commit", racing)


async def race_one_step(url: str, options: dict[str, Any], routed_bytes: int) -> list[Any]:
    """Two senders send step 0 to two ranks at once; what each send returned or raised."""
    outcome: list[Any] = [None, None]

    async def send(who: int) -> None:
        async with rlwire.open_sender(
            url, validate=False, sidecar=("routed_experts",), storage_options=options
        ) as sender:
            try:
                batches = [batch(10 * who + rank, routed_bytes) for rank in range(2)]
                outcome[who] = await sender.send_ranks(batches)
            except rlwire.RlwireError as exc:
                outcome[who] = exc

    async with anyio.create_task_group() as tg:
        for who in range(2):
            tg.start_soon(send, who)
    return outcome


@pytest.mark.parametrize("multipart", [False, True], ids=["put", "multipart"])
async def test_two_senders_racing_one_step_one_wins(
    s3_endpoint: dict[str, Any],
    s3_url: str,
    anyio_backend: str,
    monkeypatch: pytest.MonkeyPatch,
    multipart: bool,
) -> None:
    if multipart:  # the sidecars go up as multipart uploads (of one small part)
        monkeypatch.setattr(_s3_upload, "SMALL_BYTES", 1024)
    together(monkeypatch, lambda name: name == MAIN0)
    outcome = await race_one_step(s3_url, s3_endpoint, 2048)
    errors = [o for o in outcome if isinstance(o, BaseException)]
    assert len(errors) == 1, outcome
    assert isinstance(errors[0], rlwire.StepExistsError), errors[0]
    assert "another sender committed this step first" in str(errors[0])
    assert str(errors[0]).startswith(s3_url + "/step-00000000.rank-0000")  # names the object
    winner = outcome.index(0)
    for rank in range(2):  # every rank holds the winner's message, whole: never a mix
        with rlwire.open_receiver(
            s3_url, type=dict, rank=rank, record_consumed=False, storage_options=s3_endpoint
        ) as receiver:
            sample = receiver.receive(timeout=5)["samples"][0]
        assert set(np.asarray(sample["token_ids"]).tolist()) == {10 * winner + rank}
        assert set(np.unique(sample["routed_experts"]).tolist()) == {10 * winner + rank}
    # The loser left nothing behind: no second sidecar, no unfinished upload.
    assert len(objects(s3_endpoint, s3_url)) == 4
    uploads = s3_client(s3_endpoint).list_multipart_uploads(Bucket=s3_url[5:])
    assert uploads.get("Uploads", []) == []


async def test_two_stages_appending_at_once_both_land(
    s3_endpoint: dict[str, Any], s3_url: str, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await send_a_part_of_two_rows(s3_url, storage_options=s3_endpoint)
    together(monkeypatch, lambda name: ".fields-" in name)  # both chose fields-000
    await append_at_once(s3_url, ("ref_logprobs", "values"), storage_options=s3_endpoint)
    assert [k for k in objects(s3_endpoint, s3_url) if ".fields-" in k] == [
        "step-00000000.rank-0000.fields-000.rlw",
        "step-00000000.rank-0000.fields-001.rlw",
    ]
    with rlwire.open_receiver(
        s3_url, type=list, as_columns=True, record_consumed=False, storage_options=s3_endpoint
    ) as receiver:
        assert set(receiver.receive(timeout=5).names) == {"token_ids", "ref_logprobs", "values"}


async def test_two_producers_sealing_one_step_one_wins(
    s3_endpoint: dict[str, Any], s3_url: str, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = s3_endpoint
    group = [{"token_ids": np.arange(3)}]
    async with rlwire.open_sender(s3_url, validate=False, storage_options=opts) as first:
        mine = first.open_step()
        await mine.__aenter__()
        await mine.put(group, key="a")
        async with rlwire.open_sender(
            s3_url, on_existing="resume", validate=False, storage_options=opts
        ) as second:
            theirs = second.open_step(ranks=2)  # the same part, a different seal
            await theirs.__aenter__()
            outcome: list[BaseException | None] = [None, None]

            async def seal(who: int, writer: Any) -> None:
                try:
                    await writer.__aexit__(None, None, None)
                except rlwire.RlwireError as exc:
                    outcome[who] = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(seal, 0, mine)
                tg.start_soon(seal, 1, theirs)
    # The first is fenced off (the second opened after it): its seal is refused before
    # it is written, and the second's lands.
    assert outcome[1] is None, outcome
    assert isinstance(outcome[0], rlwire.ClosedError), outcome
    assert "cannot seal step 0: another sender opened" in str(outcome[0]), outcome[0]
    with rlwire.open_receiver(
        s3_url, type=list, record_consumed=False, storage_options=opts
    ) as receiver:
        assert [part.key for part in receiver.parts(timeout=5)] == ["a"]


async def test_a_retried_commit_whose_reply_was_lost_succeeds(
    s3_proxy: FaultProxy,
    s3_endpoint: dict[str, Any],
    s3_url: str,
    anyio_backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The main object's PUT lands but its reply is lost; s3fs sends it again, and S3
    refuses the resend (412: the object is there). The object holds this commit's
    token: the send succeeded."""
    options = s3_proxy.options  # botocore does not retry here; s3fs does, 0.1 s later
    statuses: list[int] = []
    dropped: list[str] = []

    def fault(method: str, target: str) -> str | None:
        if method == "PUT" and target.endswith(MAIN0) and not dropped:
            dropped.append(target)
            return DROP_REPLY
        return None

    async with rlwire.open_sender(s3_url, validate=False, storage_options=options) as sender:
        # The sink's own filesystem: fsspec's cached instance for these options, which
        # later tests share, so its retries are set back after this one.
        fs = sender._sink._conn.get().fs  # type: ignore[attr-defined]
        monkeypatch.setattr(fs, "retries", 2)
        client = fs.s3

        def record(http_response: Any, **_: Any) -> None:
            statuses.append(http_response.status_code)

        client.meta.events.register("after-call.s3.PutObject", record)
        s3_proxy.fault = fault
        try:
            assert await sender.send({"samples": [{"token_ids": np.arange(5)}]}) == 0
        finally:
            client.meta.events.unregister("after-call.s3.PutObject", record)
        assert sender.next_step == 1
    assert [s[2] for s in s3_proxy.requests("PUT") if s[1].endswith(MAIN0)] == [
        DROP_REPLY,
        "pass",
    ]
    assert statuses == [412]  # the resend was refused: the commit was conditional
    with rlwire.open_receiver(
        s3_url, type=dict, record_consumed=False, storage_options=s3_endpoint
    ) as receiver:
        assert receiver.receive(timeout=5)["samples"][0]["token_ids"].tolist() == list(range(5))


@pytest.mark.parametrize(
    ("lost_at", "loss", "resend"),
    [
        (MAIN0, DROP_REPLY, None),
        (SIDE0, DROP_REPLY, None),
        (MAIN0, ERROR_IN_200, None),
        (MAIN0, DROP_REPLY, refuse(412, "PreconditionFailed")),
        (SIDE0, DROP_REPLY, refuse(412, "PreconditionFailed")),
        (MAIN0, DROP_REPLY, refuse(404, "NoSuchUpload")),
        (SIDE0, DROP_REPLY, refuse(404, "NoSuchUpload")),
    ],
    ids=[
        "main",
        "sidecar",
        "main-error-in-200",
        "main-resend-412",
        "sidecar-resend-412",
        "main-resend-no-such-upload",
        "sidecar-resend-no-such-upload",
    ],
)
async def test_a_completed_upload_whose_reply_was_lost_is_committed_once(
    s3_proxy: FaultProxy,
    s3_endpoint: dict[str, Any],
    s3_url: str,
    anyio_backend: str,
    lost_at: str,
    loss: str,
    resend: str | None,
) -> None:
    """The main object and the sidecar are multipart uploads (9 and 2 MiB). The request
    completing one lands, but its reply is lost (the connection reset, or a 200 whose
    body is an error, as S3 may answer CompleteMultipartUpload) and botocore sends it
    again. moto answers the resend of a completed upload with its object; a store that
    checks the condition first answers 412, one that forgot the upload 404
    ``NoSuchUpload`` (the proxy answers those resends, as such stores would). Each time
    the object holds this commit's token: the send succeeds, once, and leaves nothing
    behind."""
    completes: list[str] = []

    def fault(method: str, target: str) -> str | None:
        path, _, query = target.partition("?")
        if method != "POST" or not path.endswith("/" + lost_at) or "uploadId=" not in query:
            return None
        completes.append(target)
        return loss if len(completes) == 1 else resend

    # botocore's own retries on (the proxy's options turn them off): they resend.
    retries = {"retries": {"total_max_attempts": 3, "mode": "standard"}, "connect_timeout": 2}
    options = {**s3_proxy.options, "config_kwargs": retries}
    rng = np.random.default_rng(7)
    token_ids = rng.integers(-(2**62), 2**62, 9 * MiB // 8, dtype=np.int64)
    routed = rng.integers(0, 256, 2 * MiB, dtype=np.uint8)
    s3_proxy.fault = fault
    async with rlwire.open_sender(
        s3_url, validate=False, sidecar=("routed_experts",), storage_options=options
    ) as sender:
        sent = await sender.send({"samples": [{"token_ids": token_ids, "routed_experts": routed}]})
        assert sent == 0
        assert sender.next_step == 1
    assert len(completes) == 2 and completes[0] == completes[1]  # the lost one, and its resend
    assert [s[2] for s in s3_proxy.requests("POST") if s[1] in completes] == [
        loss,
        resend or "pass",
    ]
    assert objects(s3_endpoint, s3_url) == [MAIN0, SIDE0]  # one step, nothing else
    uploads = s3_client(s3_endpoint).list_multipart_uploads(Bucket=s3_url[5:])
    assert uploads.get("Uploads", []) == []
    with rlwire.open_receiver(
        s3_url, type=dict, record_consumed=False, storage_options=s3_endpoint
    ) as receiver:
        sample = receiver.receive(timeout=5)["samples"][0]
        assert receiver.last_step == 0
    got_ids, got_routed = np.asarray(sample["token_ids"]), np.asarray(sample["routed_experts"])
    assert got_ids.dtype == token_ids.dtype and np.array_equal(got_ids, token_ids)
    assert got_routed.dtype == routed.dtype and np.array_equal(got_routed, routed)


async def test_conditional_writes_off_commits_unconditionally(
    s3_endpoint: dict[str, Any], s3_url: str, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old behaviour, for stores without conditional writes: both senders' commits
    succeed (the later replaces the earlier's objects)."""
    together(monkeypatch, lambda name: name == MAIN0)
    options = {**s3_endpoint, "conditional_writes": False}
    assert await race_one_step(s3_url, options, 64) == [0, 0]


async def test_a_store_without_conditional_writes_names_the_option(
    s3_proxy: FaultProxy, s3_url: str, anyio_backend: str
) -> None:
    s3_proxy.fault = lambda m, t: NOT_IMPLEMENTED if m == "PUT" and t.endswith(MAIN0) else None
    async with rlwire.open_sender(
        s3_url, validate=False, storage_options=s3_proxy.options
    ) as sender:
        with pytest.raises(rlwire.ConfigError, match="conditional_writes") as info:
            await sender.send({"samples": [{"token_ids": np.arange(5)}]})
        assert MAIN0 in str(info.value)
        assert sender.next_step == 0  # nothing became visible
    assert objects(s3_proxy.options, s3_url) == []


@pytest.mark.parametrize(
    ("size", "code"),
    [(64, "InvalidArgument"), (2 * MiB, "InvalidRequest")],
    ids=["put", "multipart"],
)
async def test_a_store_refusing_conditional_writes_with_400_is_told_the_option(
    s3_proxy: FaultProxy, s3_url: str, anyio_backend: str, size: int, code: str
) -> None:
    """Some stores refuse a header they do not implement with 400, not 501. A 400 may
    be about something else, so the TransportError only adds the hint; opened with the
    option off, the same store takes the step."""
    s3_proxy.conditional = refuse(400, code)  # every request carrying If-None-Match
    message = {"samples": [{"token_ids": np.arange(size // 8)}]}
    async with rlwire.open_sender(
        s3_url, validate=False, storage_options=s3_proxy.options
    ) as sender:
        with pytest.raises(rlwire.TransportError, match="conditional_writes") as info:
            await sender.send(message)
        assert code in str(info.value)  # the store's answer
        assert "nothing was made visible" in str(info.value)
        assert sender.next_step == 0
    assert objects(s3_proxy.options, s3_url) == []
    off = {**s3_proxy.options, "conditional_writes": False}
    async with rlwire.open_sender(s3_url, validate=False, storage_options=off) as sender:
        assert await sender.send(message) == 0


@pytest.mark.parametrize("another", [True, False], ids=["another-object-there", "none-there"])
async def test_a_409_conflict_is_told_by_whose_object_is_there(
    s3_proxy: FaultProxy,
    s3_endpoint: dict[str, Any],
    s3_url: str,
    anyio_backend: str,
    another: bool,
) -> None:
    """S3 answers a conditional write that met another write at the key at the same
    moment with 409 ConditionalRequestConflict. The failed commit's look at what is
    there tells: another sender's object, the step is taken (StepExistsError, as after
    a 412); none, a TransportError with nothing visible, and the send may be tried
    again."""
    bucket, fired = s3_url.removeprefix("s3://"), []

    def conflict(method: str, target: str) -> Any:
        if method != "PUT" or not target.endswith(MAIN0) or fired:
            return None
        fired.append(target)
        if another:  # the other write, straight to the store
            s3_client(s3_endpoint).put_object(Bucket=bucket, Key=MAIN0, Body=b"another's")
        return refuse(409, "ConditionalRequestConflict")

    message = {"samples": [{"token_ids": np.arange(5)}]}
    s3_proxy.fault = conflict
    async with rlwire.open_sender(
        s3_url, validate=False, storage_options=s3_proxy.options
    ) as sender:
        error = rlwire.StepExistsError if another else rlwire.TransportError
        with pytest.raises(error) as info:
            await sender.send(message)
        assert fired
        assert sender.next_step == 0
        if another:
            assert MAIN0 in str(info.value)
            got = s3_client(s3_endpoint).get_object(Bucket=bucket, Key=MAIN0)["Body"].read()
            assert got == b"another's"  # never replaced
        else:
            assert "nothing was made visible" in str(info.value)
            assert "ConditionalRequestConflict" in str(info.value)
            assert objects(s3_proxy.options, s3_url) == []
            assert await sender.send(message) == 0  # tried again, it commits


@pytest.mark.parametrize("multipart", [False, True], ids=["put", "multipart"])
async def test_a_409_conflict_of_appended_fields_takes_a_free_number(
    s3_proxy: FaultProxy,
    s3_endpoint: dict[str, Any],
    s3_url: str,
    anyio_backend: str,
    monkeypatch: pytest.MonkeyPatch,
    multipart: bool,
) -> None:
    """S3's 409 ConditionalRequestConflict to a stage's commit of ``fields-NNN`` (another
    stage writing the same name at that moment, whose write may still fail) is not the
    end of ``add_fields``: as after a 412, it checks its fields again and commits at the
    lowest free number (here ``fields-000`` again, nothing having landed there)."""
    if multipart:
        monkeypatch.setattr(_s3_upload, "SMALL_BYTES", 1024)
    fired: list[str] = []

    def conflict(method: str, target: str) -> Any:
        commit = (method == "PUT" and "partNumber" not in target) or (
            method == "POST" and "uploadId=" in target
        )
        if not commit or "fields-000" not in target or fired:
            return None
        fired.append(target)
        return refuse(409, "ConditionalRequestConflict")

    step = {"samples": [{"token_ids": np.arange(5)}]}
    async with rlwire.open_sender(s3_url, storage_options=s3_proxy.options) as sender:
        await sender.send(step)
        s3_proxy.fault = conflict
        await sender.add_fields(0, {"score": np.arange(512.0).reshape(1, -1)})
    assert fired
    assert [k for k in objects(s3_endpoint, s3_url) if ".fields-" in k] == [
        "step-00000000.rank-0000.fields-000.rlw"
    ]
    uploads = s3_client(s3_endpoint).list_multipart_uploads(Bucket=s3_url[5:])
    assert uploads.get("Uploads", []) == []
    with rlwire.open_receiver(
        s3_url, type=dict, record_consumed=False, storage_options=s3_endpoint
    ) as receiver:
        got = receiver.receive(timeout=10)["samples"][0]["score"]
    assert np.asarray(got).tolist() == np.arange(512.0).tolist()


async def test_a_400_of_an_unconditional_commit_gets_no_hint(
    s3_proxy: FaultProxy, s3_url: str, anyio_backend: str
) -> None:
    options = {**s3_proxy.options, "conditional_writes": False}
    async with rlwire.open_sender(s3_url, validate=False, storage_options=options) as sender:
        s3_proxy.fault = lambda m, t: refuse(400, "InvalidArgument") if m == "PUT" else None
        try:
            with pytest.raises(rlwire.TransportError) as info:
                await sender.send({"samples": [{"token_ids": np.arange(5)}]})
        finally:
            s3_proxy.fault = None
        assert "conditional_writes" not in str(info.value)
        assert "InvalidArgument" in str(info.value)
    assert objects(s3_proxy.options, s3_url) == []


def test_conditional_writes_is_checked() -> None:
    with pytest.raises(rlwire.ConfigError, match="s3:// only"):
        FsspecSink("memory://cond", storage_options={"conditional_writes": False}).open("error")
    with pytest.raises(rlwire.ConfigError, match="True or False"):
        FsspecSink("memory://cond", storage_options={"conditional_writes": "no"}).open("error")
