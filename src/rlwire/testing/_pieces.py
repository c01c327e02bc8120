"""The contract on Pieces: a buffer given as runs arrives as the runs' bytes, joined.

A codec may hand a sink a :class:`~rlwire.abc.Pieces` (the runs of one buffer, written
back to back). A sink that gathers writes the runs itself; for one that does not, the
sender joins them first. Either way the receiver must get exactly the joined bytes,
verified against checksums the sender recorded. The frame is sent through the real
sender and receiver with a codec that passes a :class:`~rlwire.Frame` through as it is,
so that the test sees bytes, not decoded values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from rlwire._core.errors import EncodeError
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import Frame
from rlwire._frame.pieces import Pieces
from rlwire.codecs._registry import register_codec
from rlwire.testing._fixtures import ContractFixtures, Endpoint, receive_beside

__all__ = [
    "FRAME_CODEC",
    "FrameCodec",
    "PiecesContract",
    "ReceivedFrame",
    "assert_frame_arrived",
    "pieces_frame",
]

#: The name the contract's pass-through codec is registered under (in this process).
FRAME_CODEC = "rlwire-contract-frames"


@dataclass(frozen=True)
class ReceivedFrame:
    """What :class:`FrameCodec` decodes a message into: its segments as bytes, and
    whether the source verified their checksums (:attr:`rlwire.Frame.verified`)."""

    header: bytes
    buffers: list[bytes]
    sidecar: frozenset[int]
    verified: bool = False


class FrameCodec:
    """Sends a :class:`~rlwire.Frame` as it is given (Pieces and sidecar included) and
    receives it as a :class:`ReceivedFrame`: what a sink moved, byte for byte."""

    name = FRAME_CODEC

    def __init__(self, **options: Any) -> None:
        """Takes and ignores the sender's codec options (``check``, ...)."""

    def encode_sliced(self, obj: Any) -> Sliced[Frame]:
        if not isinstance(obj, Frame):
            raise EncodeError(f"{FRAME_CODEC} sends Frames, got {type(obj).__name__}")
        yield from ()
        return replace(obj, codec=FRAME_CODEC)

    def decode(self, frame: Frame, type: Any = Any, *, writable: bool = False) -> ReceivedFrame:
        views = frame.views()  # a received frame holds memoryviews only
        header = bytes(frame.header)
        return ReceivedFrame(header, [bytes(v) for v in views], frame.sidecar, frame.verified)


def _bytes(array: np.ndarray) -> memoryview:
    """The bytes of a contiguous array as a flat byte view, without a copy."""
    return array.reshape(-1).view(np.uint8).data


def pieces_frame(seed: int = 25) -> tuple[Frame, list[bytes]]:
    """A frame whose buffers are Pieces of every kind, and each buffer's expected bytes
    (the runs joined here, independently of :class:`~rlwire.abc.Pieces`).

    The buffers: runs of separate arrays; adjacent views of one block (merged into one
    run) beside a view that is not adjacent; empty runs between non-empty ones; a
    zero-length Pieces and one of empty runs only; a plain buffer; more runs than one
    ``writev`` call takes (1024); runs crossing the 2 MB chunks files are written in;
    a compressible Pieces; and a Pieces in the sidecar.
    """
    rng = np.random.default_rng(seed)

    def noise(n: int) -> np.ndarray:  # incompressible: stays Pieces under compression
        return rng.integers(0, 256, n, np.uint8)

    block = noise(20_000)
    words = rng.integers(0, 2**31, 1500, np.int32)
    empty = memoryview(b"")
    runs: list[list[memoryview]] = [
        [_bytes(noise(n)) for n in (3, 5000, 1)],
        [_bytes(block[a:b]) for a, b in ((0, 1000), (1000, 5000), (5000, 5001), (9000, 12000))]
        + [_bytes(noise(77))],
        [empty, _bytes(noise(10)), empty, empty, _bytes(noise(4099)), empty],
        [],
        [empty, empty],
        [_bytes(words[i : i + 1].copy()) for i in range(1500)],  # 1500 blocks
        [_bytes(noise(n)) for n in (700_000, 1_500_000, 300_001)],
        [_bytes(np.zeros(40_000, np.int64)), _bytes(np.ones(25_000, np.float32))],
        [_bytes(noise(6000)), empty, _bytes(noise(123_457))],
    ]
    buffers: list[memoryview | Pieces] = [Pieces(r) for r in runs]
    plain = _bytes(noise(4321))
    buffers.insert(5, plain)  # a plain buffer among the Pieces
    expected = [b"".join(bytes(r) for r in rs) for rs in runs]
    expected.insert(5, bytes(plain))
    # The kinds promised above, as Pieces keeps them: merged views, empty runs dropped.
    kept = [len(b.runs) if isinstance(b, Pieces) else None for b in buffers]
    assert kept == [3, 3, 2, 0, 0, None, 1500, 3, 2, 2], f"runs kept: {kept}"
    frame = Frame(b"rlwire contract: Pieces", tuple(buffers), sidecar=frozenset({9}))
    return frame, expected


def assert_frame_arrived(got: object, frame: Frame, expected: Sequence[bytes]) -> None:
    """``got`` is ``frame`` as received: same header, same sidecar, and each buffer
    exactly its ``expected`` bytes (lengths named first: clearer than a diff of MBs)."""
    assert isinstance(got, ReceivedFrame), f"decoded into {type(got).__name__}"
    assert got.header == bytes(frame.header)
    assert got.sidecar == frame.sidecar
    assert [len(b) for b in got.buffers] == [len(b) for b in expected]
    for i, (have, want) in enumerate(zip(got.buffers, expected, strict=True)):
        assert have == want, f"buffer {i}: bytes differ from its runs joined"


class PiecesContract(ContractFixtures):
    """Pieces buffers arrive as their joined bytes, gathered by the sink or joined by
    the sender, compressed or not, beside the header and in the sidecar."""

    @pytest.mark.parametrize(
        ("sender_joins", "compression"),
        [(False, None), (True, None), (False, "lz4")],
        ids=["as-declared", "sender-joins", "as-declared-lz4"],
    )
    async def test_pieces_arrive_as_their_joined_bytes(
        self, endpoint: Endpoint, sender_joins: bool, compression: str | None
    ) -> None:
        """As the sink declares (:attr:`~rlwire.abc.Sink.gathers`), and with the sender
        joining the runs as it does for a sink that does not gather."""
        if compression is not None:
            pytest.importorskip(compression)
        register_codec(FRAME_CODEC, FrameCodec)  # the receiver looks the name up
        frame, expected = pieces_frame()
        sender = endpoint.open_sender(codec=FrameCodec(), compression=compression, checksum=True)
        if sender_joins and sender.sink.gathers:
            # The same sink as a plugin that writes memoryviews only: the sender joins.
            # gathers is a class attribute; it is set on this instance only.
            try:
                setattr(sender.sink, "gathers", False)  # noqa: B010 - a ClassVar, per instance
            except AttributeError:  # __slots__: the gathering path is tested all the same
                pytest.skip("the sink's instances take no attribute to stop gathering")

        async def send() -> None:
            async with sender:
                await sender.send(frame)

        with endpoint.open_receiver(verify=True) as receiver:
            got: object = await receive_beside(
                send, lambda: receiver.areceive(timeout=self.timeout)
            )
        assert_frame_arrived(got, frame, expected)
