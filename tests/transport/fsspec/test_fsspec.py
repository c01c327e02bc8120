"""The fsspec sink and source: what is specific to object stores, against a real moto S3
server (through s3fs) and fsspec's memory filesystem, and the connection that chooses
between their stores. Generic round trips live in the contract suite (rlwire.testing)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import anyio
import forked
import fsspec
import numpy as np
import pytest
from s3_server import s3_client

import rlwire
from rlwire._core.slicing import run_sliced
from rlwire.codecs import MsgpackCodec
from rlwire.transport import get_sink_class, parse_url
from rlwire.transport.fsspec import FsspecSink, FsspecSource
from rlwire.transport.fsspec._connection import Connection, translate_errors
from rlwire.transport.fsspec._generic import GenericStore, TempStaging
from rlwire.transport.fsspec._s3 import S3Store
from rlwire.transport.fsspec._s3_upload import S3Staging

MiB = 1 << 20
CODEC = MsgpackCodec(sidecar=["routed_experts"])


def frame(routed_bytes: int, value: int = 7, *, extra: int = 0) -> rlwire.Frame:
    """A frame with a sidecar of ``routed_bytes`` and ``extra`` bytes in the main file."""
    return CODEC.encode(
        {
            "ids": np.arange(extra // 8, dtype=np.int64),
            "routed_experts": np.full(routed_bytes, value, np.uint8),
        }
    )


def bucket_of(url: str) -> str:
    return url.removeprefix("s3://").partition("/")[0]


def objects(options: dict[str, Any], url: str) -> dict[str, int]:
    """Key -> size of every object in the bucket, straight from S3."""
    out = s3_client(options).list_objects_v2(Bucket=bucket_of(url))
    return {o["Key"]: o["Size"] for o in out.get("Contents", [])}


def keys(root: str) -> list[str]:
    """Names under ``root`` in fsspec's memory filesystem."""
    try:
        return [p.rpartition("/")[2] for p in fsspec.filesystem("memory").ls(root, detail=False)]
    except FileNotFoundError:
        return []


def uploads(options: dict[str, Any], url: str) -> list[str]:
    """Keys of the unfinished multipart uploads in the bucket."""
    out = s3_client(options).list_multipart_uploads(Bucket=bucket_of(url))
    return [u["Key"] for u in out.get("Uploads", [])]


def batch(routed_bytes: int, seed: int = 0) -> rlwire.TrainingBatch:
    """One sample of 64 tokens whose routed_experts take about ``routed_bytes``."""
    rng = np.random.default_rng(seed)
    n = 64
    return rlwire.TrainingBatch(
        samples=[
            rlwire.TrainingSample(
                token_ids=rng.integers(0, 50_000, n),
                mask=np.ones(n, bool),
                logprobs=-rng.exponential(size=n).astype(np.float32),
                temperatures=np.ones(n, np.float32),
                advantages=rng.standard_normal(n).astype(np.float32),
                env_name="env",
                routed_experts=rng.integers(0, 256, (n, max(1, routed_bytes // n), 1), np.uint8),
            )
        ]
    )


# ------------------------------------------------------------------- the connection


def test_scheme_routes_to_the_fsspec_sink() -> None:
    assert get_sink_class("s3") is FsspecSink
    assert get_sink_class("memory") is FsspecSink


def test_the_connection_chooses_the_store_once(s3_endpoint: dict[str, Any], s3_url: str) -> None:
    """S3 through s3fs gets the multipart store, every other filesystem the generic one;
    the choice is made with the filesystem, on first use, and kept."""
    s3 = Connection(f"{s3_url}/run/", s3_endpoint)
    assert s3.url == f"{s3_url}/run" and not s3.local
    store = s3.get()
    assert isinstance(store, S3Store) and s3.get() is store
    assert store.root == f"{bucket_of(s3_url)}/run"
    memory = Connection(parse_url("memory://conn-test"), None)  # as the registry parses it
    assert memory.local and isinstance(memory.get(), GenericStore)


def test_urls_are_checked_when_the_connection_is_made() -> None:
    for bad, match in [
        ("runs/r1", "not an fsspec URL"),
        ("S3://bucket/x", "malformed URL protocol"),
        ("gs://", "names no bucket"),
    ]:
        with pytest.raises(rlwire.ConfigError, match=match):
            Connection(bad, None)
    with pytest.raises(rlwire.ConfigError, match="not an fsspec URL"):
        Connection(b"memory://x", None)  # type: ignore[arg-type]


def test_a_url_that_names_a_file_is_refused_naming_it(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    """An fsspec URL ending in the name of an object (``s3://bucket/run/notes.txt``), or
    of one of a destination's own files (a step's file, ``fence.rlw``), was taken for a
    prefix: a sender wrote its steps under ``notes.txt/`` beside the object, a receiver
    waited there for ever. Each is a ConfigError naming the URL, before anything is
    written; prefixes still work, with or without a trailing slash, stored or new, and a
    name that is also an object's is a prefix when the URL ends with a slash."""
    client, bucket = s3_client(s3_endpoint), bucket_of(s3_url)
    client.put_object(Bucket=bucket, Key="run/notes.txt", Body=b"hi")
    client.put_object(Bucket=bucket, Key="run2", Body=b"")
    memory = f"memory://names-a-file-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("memory").pipe(f"{memory.removeprefix('memory://')}/notes.txt", b"hi")

    def refused(url: str, options: dict[str, Any] | None, match: str) -> None:
        pattern = re.escape(repr(url)) + ": " + match
        with pytest.raises(rlwire.ConfigError, match=pattern):
            with rlwire.open_sync_sender(url, storage_options=options) as sender:
                sender.send({"x": [1]})
        with pytest.raises(rlwire.ConfigError, match=pattern):
            with rlwire.open_receiver(url, storage_options=options) as receiver:
                receiver.receive(timeout=1)

    for base, options in ((f"{s3_url}/run", s3_endpoint), (memory, None)):
        refused(f"{base}/notes.txt", options, "names an object, not a directory or prefix")
        for name in (
            "step-00000003.rank-0001.rlw",
            "step-00000003.rank-0001.part-000002.sidecar.rlw",
            "step-00000003.seal.rlw",
            "fence.rlw",
            "consumed.rank-0000.rlw",
        ):
            refused(f"{base}/{name}", options, re.escape(f"names a destination's file ({name})"))
    assert objects(s3_endpoint, s3_url) == {"run/notes.txt": 2, "run2": 0}
    assert keys(memory.removeprefix("memory://")) == ["notes.txt"]
    for url, options in [
        (f"{s3_url}/run", s3_endpoint),
        (f"{s3_url}/run2/", s3_endpoint),
        (f"{s3_url}/new.v2", s3_endpoint),
        (memory, None),
        (f"{memory}/run.v2", None),
    ]:
        with rlwire.open_sync_sender(url, storage_options=options) as sender:
            sender.send({"x": [1]})
        with rlwire.open_receiver(url, storage_options=options, type=dict) as receiver:
            assert receiver.receive(timeout=10) == {"x": [1]}


def test_backend_errors_become_transport_errors_and_others_pass() -> None:
    with pytest.raises(rlwire.TransportError) as info:
        with translate_errors("memory://x", "read"):
            raise RuntimeError("boom")
    assert str(info.value) == "memory://x: cannot read: RuntimeError: boom"
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(rlwire.CorruptFrameError):
        with translate_errors("memory://x", "read"):
            raise rlwire.CorruptFrameError("torn")
    with pytest.raises(KeyboardInterrupt):
        with translate_errors("memory://x", "read"):
            raise KeyboardInterrupt


# ------------------------------------------------------------------- S3: writing


def test_big_sidecar_goes_up_as_concurrent_multipart_parts_visible_only_at_commit(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    url = f"{s3_url}/run"
    sink = FsspecSink(url, storage_options=s3_endpoint, part_bytes=5 * MiB, max_concurrency=4)
    assert sink.open("error") == 0
    f = frame(20_000_000, extra=2 * MiB)  # sidecar: 4 parts; main: 1 part (multipart too)
    staged = run_sliced(sink.stage(3, [f]))
    # Everything is uploaded, nothing is visible: two pending uploads, no object.
    assert objects(s3_endpoint, url) == {}
    assert sorted(uploads(s3_endpoint, url)) == [
        "run/step-00000003.rank-0000.rlw",
        "run/step-00000003.rank-0000.sidecar.rlw",
    ]
    assert isinstance(staged, S3Staging) and staged.max_parts_in_flight > 1
    staged.commit()
    assert staged.visible
    assert uploads(s3_endpoint, url) == []
    sizes = objects(s3_endpoint, url)
    assert sizes["run/step-00000003.rank-0000.sidecar.rlw"] == 64 + 20_000_000  # prelude + buffer
    assert sizes["run/step-00000003.rank-0000.rlw"] > 2 * MiB
    got = FsspecSource(url, storage_options=s3_endpoint).read(3)
    assert got is not None
    decoded = CODEC.decode(got)
    assert decoded["routed_experts"].nbytes == 20_000_000
    assert (decoded["routed_experts"] == 7).all()
    np.testing.assert_array_equal(decoded["ids"], np.arange(2 * MiB // 8))


def test_discard_aborts_every_upload(s3_endpoint: dict[str, Any], s3_url: str) -> None:
    sink = FsspecSink(s3_url, storage_options=s3_endpoint, part_bytes=5 * MiB)
    sink.open("error")
    staged = run_sliced(sink.stage(0, [frame(12 * MiB), frame(6 * MiB, 2)]))
    assert len(uploads(s3_endpoint, s3_url)) == 2  # two sidecars; the mains are small
    staged.discard()
    assert uploads(s3_endpoint, s3_url) == []
    assert objects(s3_endpoint, s3_url) == {}


def test_closing_the_stage_generator_midway_leaves_nothing(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    sink = FsspecSink(s3_url, storage_options=s3_endpoint, part_bytes=5 * MiB)
    sink.open("error")
    sliced = sink.stage(0, [frame(30 * MiB)])
    while not uploads(s3_endpoint, s3_url):
        next(sliced)
    for _ in range(5):
        next(sliced)
    sliced.close()  # what a cancelled send does
    assert uploads(s3_endpoint, s3_url) == []
    assert objects(s3_endpoint, s3_url) == {}


@pytest.mark.anyio
async def test_cancelled_send_leaves_no_object_and_no_upload(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    async with rlwire.open_sender(
        s3_url, storage_options=s3_endpoint, sidecar=("routed_experts",)
    ) as sender:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(sender.send, batch(48 * MiB))
                while not await anyio.to_thread.run_sync(uploads, s3_endpoint, s3_url):
                    await anyio.sleep(0.005)
                scope.cancel()
        assert scope.cancelled_caught
        assert sender.next_step == 0
    assert uploads(s3_endpoint, s3_url) == []
    assert objects(s3_endpoint, s3_url) == {}


@pytest.mark.anyio
async def test_s3_error_during_a_send_is_a_transport_error_and_leaves_nothing(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    """The bucket disappears under an open sender: S3 answers NoSuchBucket, the send
    raises TransportError (never botocore's errors), and the step can be sent again.
    (The bucket is not deleted while parts are in flight: moto's server can hang then.)"""
    client = s3_client(s3_endpoint)
    bucket = bucket_of(s3_url)
    async with rlwire.open_sender(
        s3_url, storage_options=s3_endpoint, sidecar=("routed_experts",)
    ) as sender:
        client.delete_bucket(Bucket=bucket)
        with pytest.raises(rlwire.TransportError, match=s3_url) as info:
            await sender.send(batch(12 * MiB))
        assert "does not exist" in str(info.value)
        assert not isinstance(info.value.__cause__, rlwire.RlwireError)
        assert sender.next_step == 0  # nothing became visible: the step can be retried
        client.create_bucket(Bucket=bucket)
        assert objects(s3_endpoint, s3_url) == {} and uploads(s3_endpoint, s3_url) == []
        assert await sender.send(batch(1000)) == 0
    assert sorted(objects(s3_endpoint, s3_url)) == [
        "step-00000000.rank-0000.rlw",
        "step-00000000.rank-0000.sidecar.rlw",
    ]


def test_commit_failure_before_any_main_object_leaves_nothing(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    sink = FsspecSink(s3_url, storage_options=s3_endpoint, part_bytes=5 * MiB)
    sink.open("error")
    staged = run_sliced(sink.stage(0, [frame(6 * MiB), frame(100, 1)]))
    client = s3_client(s3_endpoint)
    client.delete_bucket(Bucket=bucket_of(s3_url))
    with pytest.raises(rlwire.TransportError, match="nothing was made visible"):
        staged.commit()
    assert not staged.visible
    client.create_bucket(Bucket=bucket_of(s3_url))
    assert objects(s3_endpoint, s3_url) == {}


def test_readers_never_see_a_main_object_without_its_sidecar(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    sink = FsspecSink(s3_url, storage_options=s3_endpoint, part_bytes=5 * MiB)
    sink.open("error")
    source = FsspecSource(s3_url, storage_options=s3_endpoint, poll_interval=0.001)
    steps = 4
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        step = 0
        try:
            while step < steps:
                got = source.read(step)  # a CorruptFrameError would mean a torn step
                if got is not None:
                    seen.append(step)
                    step += 1
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for step in range(steps):
        # One sidecar large enough for a multipart upload, one small one put whole.
        staged = run_sliced(sink.stage(step, [frame(6 * MiB if step % 2 else 1000, step)]))
        staged.commit()
    thread.join(30)
    assert not errors
    assert seen == list(range(steps))


def test_existing_steps_and_on_existing(s3_endpoint: dict[str, Any], s3_url: str) -> None:
    url = f"{s3_url}/run"
    sink = FsspecSink(url, storage_options=s3_endpoint)
    sink.open("error")
    for step in range(2):
        run_sliced(sink.stage(step, [frame(100, step), frame(100, step)])).commit()
    with pytest.raises(rlwire.StepExistsError, match="step 1 rank 0 already exists"):
        run_sliced(sink.stage(1, [frame(100)]))
    with pytest.raises(rlwire.StepExistsError, match=r"holds steps 0\.\.1"):
        FsspecSink(url, storage_options=s3_endpoint).open("error")
    # A sender killed mid-send left an unfinished upload; resuming aborts it.
    client = s3_client(s3_endpoint)
    client.create_multipart_upload(Bucket=bucket_of(url), Key="run/step-00000002.rank-0000.rlw")
    client.put_object(Bucket=bucket_of(url), Key="run/notes.txt", Body=b"keep me")
    assert FsspecSink(url, storage_options=s3_endpoint).open("resume") == 2
    assert uploads(s3_endpoint, url) == []
    # A step that only some ranks committed cannot be resumed after.
    client.delete_object(Bucket=bucket_of(url), Key="run/step-00000001.rank-0001.rlw")
    with pytest.raises(rlwire.StepExistsError, match="step 1 is incomplete"):
        FsspecSink(url, storage_options=s3_endpoint).open("resume")
    assert FsspecSink(url, storage_options=s3_endpoint).open("overwrite") == 0
    # only rlwire's objects go; the fence is the overwriting sender's
    assert list(objects(s3_endpoint, url)) == ["run/fence.rlw", "run/notes.txt"]


def test_bad_options_and_missing_bucket_are_typed_errors(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    with pytest.raises(rlwire.ConfigError, match="bogus"):
        FsspecSink(s3_url, storage_options={**s3_endpoint, "bogus": 1}).open("error")
    with pytest.raises(rlwire.ConfigError, match="bogus"):
        FsspecSource(s3_url, storage_options={**s3_endpoint, "bogus": 1}).read(0)
    # fsspec's memory filesystem would ignore it silently: rlwire checks for it.
    with pytest.raises(rlwire.ConfigError, match=r"unknown storage option.*'bogus'"):
        FsspecSink("memory://x", storage_options={"bogus": 1}).open("error")
    with pytest.raises(rlwire.TransportError, match="bucket 'no-such-bucket' does not exist"):
        FsspecSink("s3://no-such-bucket/x", storage_options=s3_endpoint).open("error")
    with pytest.raises(rlwire.ConfigError, match="names no bucket"):
        rlwire.open_sender("s3://")
    with pytest.raises(rlwire.ConfigError, match="chained"):
        FsspecSink("simplecache::s3://bucket/x")
    with pytest.raises(rlwire.ConfigError, match="chained"):
        FsspecSink("zip://inner::http://[::1]:9/a.zip")
    # An IPv6 literal host chains nothing: fsspec's http:// store takes it.
    assert FsspecSink("http://[::1]:9/run").url == "http://[::1]:9/run"
    with pytest.raises(rlwire.ConfigError, match="part_bytes"):
        FsspecSink(s3_url, part_bytes=1 << 20)


@pytest.mark.anyio
async def test_storage_options_are_never_changed(
    s3_endpoint: dict[str, Any], s3_url: str, anyio_backend: str
) -> None:
    """s3fs hands the ``retries`` dict of ``config_kwargs`` to botocore, which rewrites
    it in place (``max_attempts`` becomes ``total_max_attempts``, a ``mode`` is added):
    the sender's and the receiver's filesystems get copies, so the caller's options stay
    as given, and still reach botocore."""

    def options(who: str) -> dict[str, Any]:
        # A user agent of its own: a new filesystem and client, not fsspec's cached one.
        unique = f"rlwire-test/{who}-{uuid.uuid4().hex[:8]}"
        retries = {"max_attempts": 2}
        return {**s3_endpoint, "config_kwargs": {"retries": retries, "user_agent_extra": unique}}

    given = options("sender")
    snapshot = copy.deepcopy(given)
    async with rlwire.open_sender(s3_url, validate=False, storage_options=given) as sender:
        assert await sender.send({"samples": [{"token_ids": np.arange(3)}]}) == 0
        client = sender._sink._conn.get().fs.s3  # type: ignore[attr-defined]
        assert client.meta.config.retries["total_max_attempts"] == 3  # 2 retries: it reached
    assert given == snapshot
    given = options("receiver")
    snapshot = copy.deepcopy(given)
    with rlwire.open_receiver(
        s3_url, type=dict, record_consumed=False, storage_options=given
    ) as receiver:
        assert receiver.receive(timeout=5)["samples"][0]["token_ids"].tolist() == [0, 1, 2]
    assert given == snapshot


def test_missing_packages_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without fsspec (or s3fs) installed, a URL that needs it is a ConfigError that
    says what to install, not an ImportError on first use."""
    import importlib.util

    find_spec = importlib.util.find_spec
    missing = {"fsspec"}
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in missing else find_spec(name, *a),
    )
    with pytest.raises(rlwire.ConfigError, match=r"needs the 'fsspec' package.*rlwire\[fsspec\]"):
        rlwire.open_sender("memory://run")
    missing = {"s3fs"}
    with pytest.raises(rlwire.ConfigError, match=r"needs the 's3fs' package.*rlwire\[s3\]"):
        rlwire.open_receiver("s3://bucket/run")


@pytest.mark.anyio
async def test_the_first_connection_happens_off_the_loop_once(s3_endpoint: dict[str, Any]) -> None:
    """Opening a sender or receiver makes no filesystem and no request: an unreachable
    endpoint costs nothing until the first use, which runs in a worker thread. A
    cancelled first open returns at once; the next open joins the same attempt and
    gets its error."""
    # An endpoint that accepts connections and never answers holds the first attempt,
    # however fast the machine (a refused port fails in microseconds); closing it then
    # fails that attempt at once.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        options = {
            **s3_endpoint,
            "endpoint_url": f"http://127.0.0.1:{silent.getsockname()[1]}",
            "config_kwargs": {
                "retries": {"max_attempts": 1},
                "connect_timeout": 1,
                "read_timeout": 1,
            },
        }
        start = time.perf_counter()
        sender = rlwire.open_sender("s3://bucket/run", storage_options=options)
        rlwire.open_receiver("s3://bucket/run", storage_options=options).close()
        assert time.perf_counter() - start < 0.5
        with anyio.move_on_after(0.05) as scope:
            await sender.aopen()
        assert scope.cancelled_caught
        silent.close()
        with pytest.raises(rlwire.TransportError, match="cannot reach bucket 'bucket'"):
            await sender.aopen()


# ------------------------------------------------------------------- S3: reading


def test_receiver_in_another_process_gets_identical_arrays(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    script = textwrap.dedent("""
        import json, sys, hashlib, rlwire
        url, options = sys.argv[1], json.loads(sys.argv[2])
        with rlwire.open_receiver(url, storage_options=options, poll_interval=0.005) as r:
            for _ in range(2):
                s = r.receive(timeout=30).samples[0]
                print(hashlib.sha256(s.routed_experts.tobytes() + s.token_ids.tobytes()
                                     + s.logprobs.tobytes()).hexdigest(), flush=True)
    """)
    child = forked.Popen(
        [sys.executable, "-c", script, s3_url, json.dumps(s3_endpoint)],
        stdout=subprocess.PIPE,
        text=True,
    )
    sent = [batch(9 * MiB, seed=1), batch(3000, seed=2)]

    async def send() -> None:
        async with rlwire.open_sender(
            s3_url, storage_options=s3_endpoint, sidecar=("routed_experts",)
        ) as sender:
            for b in sent:
                await sender.send(b)

    anyio.run(send)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    want = [
        hashlib.sha256(
            s.routed_experts.tobytes() + s.token_ids.tobytes() + s.logprobs.tobytes()
        ).hexdigest()
        for s in (b.samples[0] for b in sent)
    ]
    assert out.split() == want


@pytest.mark.parametrize("routed", [1000, 20 * MiB])  # one GET; ranged GETs at once
def test_writable_arrays(s3_endpoint: dict[str, Any], s3_url: str, routed: int) -> None:
    sink = FsspecSink(s3_url, storage_options=s3_endpoint)
    sink.open("error")
    run_sliced(sink.stage(0, [frame(routed)])).commit()
    with rlwire.open_receiver(s3_url, storage_options=s3_endpoint, type=Any) as r:
        arr = r.receive(timeout=10)["routed_experts"]
        assert not arr.flags.writeable
    with rlwire.open_receiver(s3_url, storage_options=s3_endpoint, type=Any, writable=True) as r:
        arr = r.receive(timeout=10)["routed_experts"]
        assert arr.flags.writeable and arr.nbytes == routed and (arr == 7).all()
        arr[:] = 1
    with rlwire.open_receiver(s3_url, storage_options=s3_endpoint, type=Any) as r:
        assert (r.receive(timeout=10)["routed_experts"] == 7).all()  # the store is intact


def test_corrupted_or_missing_objects_are_corrupt_frame_errors(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    sink = FsspecSink(s3_url, storage_options=s3_endpoint)
    sink.open("error")
    for step in range(3):
        run_sliced(sink.stage(step, [frame(5000, step)])).commit()
    client = s3_client(s3_endpoint)
    bucket = bucket_of(s3_url)
    # Step 0: a flipped byte in the sidecar's buffer.
    key = "step-00000000.rank-0000.sidecar.rlw"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[100] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    # Step 1: the sidecar is gone. Step 2: the main object is empty.
    client.delete_object(Bucket=bucket, Key="step-00000001.rank-0000.sidecar.rlw")
    client.put_object(Bucket=bucket, Key="step-00000002.rank-0000.rlw", Body=b"")
    with rlwire.open_receiver(s3_url, storage_options=s3_endpoint) as r:
        with pytest.raises(rlwire.CorruptFrameError, match="does not match its checksum"):
            r.receive(timeout=5)
        r.skip()
        with pytest.raises(rlwire.CorruptFrameError, match=r"sidecar\.rlw: missing"):
            r.receive(timeout=5)
        r.skip()
        with pytest.raises(rlwire.CorruptFrameError, match="empty"):
            r.receive(timeout=5)


def test_polls_back_off_to_a_second_and_reset_on_a_message(
    s3_endpoint: dict[str, Any], s3_url: str
) -> None:
    source = FsspecSource(s3_url, storage_options=s3_endpoint, poll_interval=0.01)
    intervals = []
    for _ in range(10):
        assert source.read(0) is None
        intervals.append(source.interval)
    assert intervals[:4] == [0.01, 0.02, 0.04, 0.08]
    assert intervals == sorted(intervals) and intervals[-1] == 1.0
    start = time.perf_counter()
    source.wait(0.05)  # a timeout still bounds the wait
    assert time.perf_counter() - start < 0.5
    sink = FsspecSink(s3_url, storage_options=s3_endpoint)
    sink.open("error")
    run_sliced(sink.stage(0, [frame(100)])).commit()
    assert source.read(0) is not None
    assert source.interval == 0.01
    assert source.read(1) is None and source.interval == 0.01
    # In-memory stores cost nothing to poll: no back-off there.
    mem = FsspecSource("memory://backoff-test", poll_interval=0.01)
    for _ in range(5):
        assert mem.read(0) is None
    assert mem.interval == 0.01


@pytest.mark.anyio
async def test_async_receive_waits_with_back_off(s3_endpoint: dict[str, Any], s3_url: str) -> None:
    async with rlwire.open_receiver(s3_url, storage_options=s3_endpoint) as r:
        start = time.perf_counter()
        with pytest.raises(rlwire.ReceiveTimeout):
            await r.areceive(timeout=0.6)
        assert time.perf_counter() - start < 2


# ------------------------------------------------------------------- memory://


@pytest.mark.anyio
async def test_memory_round_trip_through_temporary_keys() -> None:
    url = f"memory://rlwire-test-{time.monotonic_ns()}"
    async with rlwire.open_sender(url, sidecar=("routed_experts",)) as sender:
        for seed in range(2):
            await sender.send(batch(10_000, seed))
    assert sorted(keys(url.removeprefix("memory:/"))) == [
        "step-00000000.rank-0000.rlw",
        "step-00000000.rank-0000.sidecar.rlw",
        "step-00000001.rank-0000.rlw",
        "step-00000001.rank-0000.sidecar.rlw",
    ]
    async with rlwire.open_receiver(url, writable=True) as r:
        for seed in range(2):
            got = await r.areceive(timeout=5)
            want = batch(10_000, seed).samples[0]
            assert got.samples[0].routed_experts.tobytes() == want.routed_experts.tobytes()
            assert got.samples[0].routed_experts.flags.writeable
    async with rlwire.open_sender(url, on_existing="resume") as sender:
        assert sender.next_step == 2


def test_memory_discard_and_cancel_leave_no_keys() -> None:
    url = f"memory://rlwire-test-{time.monotonic_ns()}"
    root = url.removeprefix("memory:/")
    sink = FsspecSink(url)
    sink.open("error")
    staged = run_sliced(sink.stage(0, [frame(20 * MiB)]))
    assert isinstance(staged, TempStaging)
    assert [k.startswith(".") for k in keys(root)] == [True, True]  # main and sidecar
    assert FsspecSource(url).read(0) is None  # temporary keys are invisible to readers
    staged.discard()
    assert keys(root) == []
    sliced = sink.stage(0, [frame(20 * MiB)])
    next(sliced)
    next(sliced)
    sliced.close()
    assert keys(root) == []
    # A killed sender's temporary keys are cleaned up by resume and overwrite.
    run_sliced(sink.stage(0, [frame(100)]))
    assert FsspecSink(url).open("resume") == 0
    assert keys(root) == ["fence.rlw"]  # the resumed sender's


def test_memory_listing_beside_a_thread_that_deletes_objects() -> None:
    # fsspec's memory filesystem lists its keys, then reads each one's size: an object
    # deleted by another thread in between raised KeyError, and a receiver polling
    # beside a sender failed with "cannot list" (one full test run, 2026-11-29).
    url = f"memory://rlwire-test-{time.monotonic_ns()}"
    store = Connection(url, None).get()
    fs = fsspec.filesystem("memory")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for i in range(50):
                fs.pipe_file(store.path(f".tmp-{i}"), b"x")
            fs.rm([store.path(f".tmp-{i}") for i in range(50)])

    fs.pipe_file(store.path("step-00000000.rank-0000.rlw"), b"x")
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: the race comes within a few lists
    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for _ in range(2_000):
            assert "step-00000000.rank-0000.rlw" in store.names()
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old)
        fs.rm(store.root, recursive=True)
