"""Frames whose buffers are Pieces, sent through every built-in sink and through a plugin
sink that does not gather: what arrives is the joined bytes.

The frames are made by a small codec registered for these tests, which sends a Frame as
it is and decodes one into its header, buffers and sidecar, so the sender's own path
(compression, the join for sinks that do not gather, stats) runs untouched.
"""

from __future__ import annotations

import dataclasses
import socket
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import numpy as np
import pytest

import rlwire
from rlwire import Frame
from rlwire.abc import PendingFrame, Pieces, Sink, Sliced, Staged
from rlwire.codecs import register_codec
from rlwire.transport import take_frame

pytestmark = pytest.mark.anyio
MiB = 1 << 20


class FrameCodec:
    """Sends the Frame it is given; decodes into (header, buffers, sidecar)."""

    name = "test-pieces"

    def __init__(self, **options: Any) -> None:
        pass

    def encode_sliced(self, obj: Frame) -> Sliced[Frame]:
        yield
        return dataclasses.replace(obj, codec=self.name)

    def decode(self, frame: Frame, type: Any = Any, *, writable: bool = False) -> Any:
        return bytes(frame.header), [bytes(b) for b in frame.views()], sorted(frame.sidecar)


register_codec(FrameCodec.name, FrameCodec, clobber=True)


def _view(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B")


def pieces_frame(seed: int = 0) -> tuple[Frame, list[bytes]]:
    """A frame mixing memoryviews and Pieces (one run; many runs of odd lengths; several
    MB, compressible, in the sidecar; several MB of noise; adjacent views of one array),
    and the bytes each buffer holds."""
    rng = np.random.default_rng(seed)
    odd = [rng.integers(0, 256, n, dtype=np.uint8) for n in (1, 3, 63, 1, 64, 3, 0, 63, 127, 5)]
    big = [rng.integers(0, 3, n, dtype=np.uint8) for n in [800_001] * 12 + [17]]
    noise = [rng.integers(0, 256, n, dtype=np.uint8) for n in [700_003] * 4]
    block = rng.integers(0, 1000, 4096, dtype=np.int64)
    packed = [_view(block[a:b]) for a, b in ((0, 5), (5, 9), (9, 1000), (1000, 4096))]
    buffers: list[memoryview | Pieces] = [
        memoryview(b"plain buffer"),
        Pieces([_view(rng.integers(0, 256, 100, dtype=np.uint8))]),
        Pieces([_view(a) for a in odd]),
        memoryview(b"7 bytes"),
        Pieces([_view(a) for a in big]),
        Pieces([_view(a) for a in noise]),
        Pieces(packed),
        Pieces([]),
        memoryview(rng.integers(0, 2, 200_000, dtype=np.uint8)),
    ]
    expected = [bytes(b.joined()) if isinstance(b, Pieces) else bytes(b) for b in buffers]
    assert expected[6] == block.tobytes()
    return Frame(b"header " * 3, tuple(buffers), frozenset({4, 8})), expected


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(params=["file", "memory", "s3", "zmq+tcp", "zmq+ipc"])
def endpoint(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Mapping[str, Any]]:
    kind = request.param
    if kind == "file":
        return str(tmp_path / "run"), {}
    if kind == "memory":
        return f"memory://pieces-{uuid.uuid4().hex}", {}
    if kind == "s3":
        options: Mapping[str, Any] = request.getfixturevalue("s3_endpoint")
        return f"{request.getfixturevalue('s3_url')}/run", options
    if kind == "zmq+tcp":
        return f"zmq+tcp://127.0.0.1:{_free_port()}", {}
    return f"zmq+ipc://{tmp_path}/run.sock", {}


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
async def test_pieces_round_trip_through_every_sink(
    endpoint: tuple[str, Mapping[str, Any]], compression: str | None
) -> None:
    url, options = endpoint
    frame, expected = pieces_frame()
    got: list[Any] = []
    with rlwire.open_receiver(url, storage_options=options, type=Any) as receiver:

        async def send() -> None:
            sender = rlwire.open_sender(
                url, codec=FrameCodec(), compression=compression, storage_options=options
            )
            async with sender:
                await sender.send(frame)
                stats = sender.last_stats
                assert stats is not None
                if compression is None:
                    assert stats.bytes_per_rank == (frame.nbytes,)
                    assert stats.sidecar_bytes == len(expected[4]) + len(expected[8])

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            got.append(await receiver.areceive(timeout=60))
    header, buffers, sidecar = got[0]
    assert header == bytes(frame.header)
    assert sidecar == [4, 8]
    assert len(buffers) == len(expected)
    for i, (b, e) in enumerate(zip(buffers, expected, strict=True)):
        assert b == e, f"buffer {i}"


class MemoryviewsOnly(Sink):
    """A plugin-like sink that does not gather: it records what it is handed."""

    seen: ClassVar[list[Frame]] = []

    def open(self, on_existing: Any, start_step: int | None = None) -> int:
        return 0

    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        for pending in frames:
            self.seen.append((yield from take_frame(pending)))
        return _Committed()


class _Committed(Staged):
    def commit(self) -> None:
        self.visible = True

    def discard(self) -> None:
        pass


@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_a_sink_that_does_not_gather_gets_memoryviews_only(compression: str | None) -> None:
    assert MemoryviewsOnly.gathers is False
    MemoryviewsOnly.seen.clear()
    frame, expected = pieces_frame(seed=1)
    compressor = rlwire.Compressor(compression) if compression else None
    async with rlwire.TrainingBatchSender(
        MemoryviewsOnly(), FrameCodec(), compression=compressor
    ) as sender:
        await sender.send(frame)
    (seen,) = MemoryviewsOnly.seen
    assert all(type(b) is memoryview for b in seen.buffers)
    assert seen.sidecar == frame.sidecar
    if compression is None:
        assert [bytes(b) for b in seen.buffers] == expected  # type: ignore[arg-type]


def test_every_built_in_sink_gathers() -> None:
    from rlwire.transport.fsspec import FsspecSink
    from rlwire.transport.zmq import ZmqSink

    assert rlwire.transport.FileSink.gathers
    assert FsspecSink.gathers
    assert ZmqSink.gathers
    assert Sink.gathers is False
