"""The ZeroMQ packets against docs/format.md ("ZeroMQ messages").

Packets made by hand from the document alone are what rlwire sends and what it reads;
what rlwire sends reads back as the document says; and a receiver turns every malformed
packet into a typed error and goes on. The test plays the other side with a raw pyzmq
socket, in this process.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lz4.block
import msgspec
import pytest
import xxhash
import zmq
from helpers import make_batch

import rlwire
from rlwire._frame.frame import Frame
from rlwire.codecs import MsgpackCodec
from rlwire.transport.zmq import _control as control
from rlwire.transport.zmq import _protocol as protocol

#: For what should happen: far longer than it takes, even on a busy machine.
LONG = 60.0
#: For what should not happen.
SHORT = 1.0

PRELUDE = struct.Struct("<4sHH")
#: The head's fields, in order, as docs/format.md names them.
HEAD_FIELDS = (
    "session",
    "seq",
    "step",
    "rank",
    "shared",
    "codec",
    "sidecar",
    "compression",
    "raw_sizes",
    "checksum",
    "segments",
    "index",
    "count",
)

Packets = list[list[bytes]]


def documented_packets(
    frame: Frame,
    *,
    step: int,
    seq: int,
    rank: int = 0,
    shared: bool = False,
    session: bytes = b"S" * 8,
    version: int = 2,
    minor: int = 2,
    checksums: bool = True,
    cut: tuple[int, ...] = (),
) -> Packets:
    """The packets that carry ``frame``, as docs/format.md describes them: data packets
    of ``cut`` segments each (the last one takes the rest), then the seal."""
    segments = [bytes(frame.header), *map(bytes, frame.buffers)]
    counts = [*cut, len(segments) - sum(cut)]
    packets = []
    for index, n in enumerate(counts):
        head = [
            session,
            seq,
            step,
            rank,
            shared,
            frame.codec,
            sorted(frame.sidecar),
            bytes(frame.compression),
            list(frame.raw_sizes),
            "xxh3-64" if checksums else None,
            len(segments),
            index,
            len(counts),
        ]
        first = sum(counts[:index])
        carried = segments[first : first + n]
        packets.append(
            [PRELUDE.pack(b"RLWZ", version, minor) + msgspec.msgpack.encode(head), *carried]
        )
    body = struct.pack("<8sQ", session, seq) + (checksums_of(segments) if checksums else b"")
    return [*packets, [b"seal", body]]


def checksums_of(segments: list[bytes]) -> bytes:
    """xxh3-64 of each segment, packed little-endian u64."""
    return b"".join(struct.pack("<Q", xxhash.xxh3_64_intdigest(s)) for s in segments)


def encoded(step: int) -> Frame:
    """A small message of ``step`` with several out-of-band buffers."""
    frame = MsgpackCodec(inline_threshold=64).encode(make_batch(2, 16, seed=step))
    assert len(frame.buffers) > 1
    return frame


def wire_packets(
    step: int,
    seq: int,
    *,
    rank: int = 0,
    session: bytes = b"S" * 8,
    version: int = 2,
    corrupt_buffer: bool = False,
    cut: tuple[int, ...] = (),
) -> Packets:
    """The documented packets of the message of ``step``, optionally with a flipped byte
    in its last buffer (after its checksum was taken)."""
    packets = documented_packets(
        encoded(step), step=step, seq=seq, rank=rank, session=session, version=version, cut=cut
    )
    if corrupt_buffer:
        last = bytearray(packets[-2][-1])
        last[0] ^= 0xFF
        packets[-2][-1] = bytes(last)
    return packets


# -- rlwire writes and reads the documented bytes --------------------------------------


@pytest.mark.parametrize("checksums", [True, False])
@pytest.mark.parametrize(("rank", "shared"), [(0, False), (3, False), (0, True)])
def test_first_parts_and_seal_are_the_documented_bytes(
    checksums: bool, rank: int, shared: bool
) -> None:
    frame = encoded(5)
    expected = documented_packets(
        frame, step=5, seq=9, rank=rank, shared=shared, checksums=checksums, cut=(2, 1)
    )
    head = protocol.make_head(
        frame, session=b"S" * 8, step=5, rank=rank, shared=shared, checksum=checksums
    )
    for index, packet in enumerate(expected[:-1]):
        assert protocol.first_part(head, seq=9, index=index, count=3) == packet[0]
    segments = [bytes(frame.header), *map(bytes, frame.buffers)]
    sums = checksums_of(segments) if checksums else b""
    assert control.seal_packet(b"S" * 8, 9, sums) == expected[-1]


def test_a_documented_packets_parses() -> None:
    frame = encoded(4)
    *data, seal = documented_packets(frame, step=4, seq=2, rank=1, cut=(1,))
    heads, segments = [], []
    for packet in data:
        head, carried = protocol.parse_data(packet, where="here")
        heads.append(head)
        segments += carried
        assert [bytes(s) for s in carried] == packet[1:]
    n = 1 + len(frame.buffers)
    assert [(h.index, h.count, h.segments) for h in heads] == [(0, 2, n), (1, 2, n)]
    head = heads[0]
    assert (head.session, head.seq, head.step, head.rank, head.shared) == (b"S" * 8, 2, 4, 1, False)
    assert protocol.frame_of(head, segments, where="here") == Frame(
        data[0][1], tuple(map(memoryview, data[1][1:])), frozenset(), "msgpack"
    )
    parsed = control.parse_seal(seal, where="here")
    assert parsed == control.Seal(b"S" * 8, 2, checksums_of([data[0][1], *data[1][1:]]))


def test_control_packets_are_as_documented() -> None:
    assert control.ready_packet(3) == [b"ready", msgspec.msgpack.encode([2, 3, None, 2])]
    assert control.ack_packet(b"C" * 8, 7) == [b"ack", struct.pack("<8sQ", b"C" * 8, 7)]
    assert control.bye_packet() == [b"bye", b""]
    assert control.abort_packet(b"C" * 8, 7) == [b"abort", struct.pack("<8sQ", b"C" * 8, 7)]
    assert control.is_ping([b"ping"]) and not control.is_ping([b"ping", b""])
    assert control.parse_ready(msgspec.msgpack.encode([2, 3])) == control.Ready(2, 3)
    assert control.ready_packet(0, "shared") == [
        b"ready",
        msgspec.msgpack.encode([2, 0, "shared", 2]),
    ]
    assert control.parse_ready(msgspec.msgpack.encode([2, 1, "ranks"])) == control.Ready(
        2, 1, "ranks"
    )
    assert control.parse_ready(msgspec.msgpack.encode([2, 1, "odd"])) == control.Ready(2, 1)
    assert control.refuse_packet("why") == [b"refuse", b"why"]
    assert control.absent_packet(7, 2) == [b"absent", struct.pack("<QQ", 7, 2)]
    assert control.parse_absent([b"absent", struct.pack("<QQ", 7, 2)]) == (7, 2)
    assert control.parse_absent([b"absent", b"C" * 15]) is None
    assert control.parse_refuse([b"refuse", b"why"]) == "why"
    for body in (msgspec.msgpack.encode([1, 3]), msgspec.msgpack.encode([2, -1]), b"\xc1"):
        assert control.parse_ready(body) is None  # ignored: another version, or not one
    assert control.parse_ack(struct.pack("<8sQ", b"C" * 8, 7)) == (b"C" * 8, 7)
    assert control.parse_ack(b"C" * 15) is None
    assert control.parse_abort([b"abort", struct.pack("<8sQ", b"C" * 8, 7)]) == (b"C" * 8, 7)
    assert control.parse_abort([b"abort", b"C" * 15]) is None
    for body in (b"C" * 15, b"C" * 16 + b"sum"):
        with pytest.raises(rlwire.CorruptFrameError, match="here: malformed seal"):
            control.parse_seal([b"seal", body], where="here")


_first, *_rest = wire_packets(0, 0)[0]
_CORRUPT = rlwire.CorruptFrameError
_N = len(_rest)  # segments


def _head(**changes: Any) -> bytes:
    """The first part of step 0's only data packet, with ``changes`` to its head."""
    values = dict(zip(HEAD_FIELDS, msgspec.msgpack.decode(_first[PRELUDE.size :]), strict=True))
    values.update(changes)
    return _first[: PRELUDE.size] + msgspec.msgpack.encode(list(values.values()))


#: Malformed data packets: the parts, the error, words of the error.
BAD: list[tuple[list[bytes], type[rlwire.RlwireError], str]] = [
    ([b"xy"], _CORRUPT, "not an rlwire packet (2-byte head)"),
    ([b"XXXX" + _first[4:], *_rest], _CORRUPT, "bad magic"),
    ([_first[:8] + b"\xc1\xc1", *_rest], _CORRUPT, "malformed packet head"),
    (wire_packets(0, 0, version=9)[0], rlwire.UnsupportedVersionError, "version 9"),
    ([_first], _CORRUPT, f"data packet 0 of 1 carries 0 of {_N} segments"),
    ([_first, *_rest, b"more"], _CORRUPT, f"data packet 0 of 1 carries {_N + 1} of {_N} segments"),
    ([_head(index=1), *_rest], _CORRUPT, "data packet 1 of 1 carries"),
    ([_head(compression=b"\x00"), *_rest], _CORRUPT, f"{_N} segments, 1 compression ids"),
    ([_head(compression=b"\x00" * _N), *_rest], _CORRUPT, f"{_N} segments, 0 raw sizes"),
]


@pytest.mark.parametrize(("parts", "error", "words"), BAD)
def test_a_malformed_data_packet_is_refused(
    parts: list[bytes], error: type[rlwire.RlwireError], words: str
) -> None:
    with pytest.raises(error) as info:
        protocol.parse_data(parts, where="ipc:///run: step 0 rank 0")
    assert type(info.value) is error
    assert str(info.value).startswith("ipc:///run: step 0 rank 0: ") and words in str(info.value)


# -- against a real sender or receiver -------------------------------------------------


RawSocket = Callable[[int], zmq.Socket[bytes]]


@pytest.fixture
def raw_socket() -> Iterator[RawSocket]:
    """Makes raw pyzmq sockets that fail a test rather than hang it, and closes them."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    made: list[zmq.Socket[bytes]] = []

    def make(kind: int) -> zmq.Socket[bytes]:
        sock = context.socket(kind)
        made.append(sock)
        sock.setsockopt(zmq.SNDTIMEO, int(LONG * 1000))
        sock.setsockopt(zmq.RCVTIMEO, int(LONG * 1000))
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    yield make
    for sock in made:
        sock.close()
    context.term()


def receive_until(sock: zmq.Socket[bytes], wanted: Any) -> list[list[bytes]]:
    """Every packet ``sock`` receives up to the first for which ``wanted`` is true."""
    got = [sock.recv_multipart()]
    while not wanted(got[-1]):
        got.append(sock.recv_multipart())
    return got


def receive_message(sock: zmq.Socket[bytes]) -> tuple[list[list[bytes]], list[bytes]]:
    """The data packets of the next message ``sock`` receives, and its seal."""
    data = []
    while (packet := sock.recv_multipart())[0] != b"seal":
        data.append(packet)
    return data, packet


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_what_a_sender_sends_reads_as_documented(
    tmp_path: Path, raw_socket: RawSocket
) -> None:
    """Two raw DEALER sockets announce ranks 0 and 1; what a sender sends them (sidecar
    and lz4 included, the large messages cut into several data packets) reads as
    docs/format.md says, and a closing sender pings a receiver that has not acknowledged
    what it was sent."""
    url = f"zmq+ipc://{tmp_path}/sock"
    dealers = [raw_socket(zmq.DEALER) for _ in range(2)]
    options = {"linger": SHORT, "message_bytes": 100_000}
    async with rlwire.open_sender(
        url, sidecar="routed_experts", compression="lz4", storage_options=options
    ) as sender:
        for rank, dealer in enumerate(dealers):
            dealer.connect(url.removeprefix("zmq+"))
            dealer.send_multipart([b"ready", msgspec.msgpack.encode([2, rank])])
        for step in range(2):
            big = make_batch(4, 20_000, seed=step)  # compresses: lz4 ids appear
            await sender.send_ranks([big, make_batch(2, 16, seed=step)])
        messages = [[receive_message(dealer) for _ in range(2)] for dealer in dealers]
    # The sender closed; rank 0 acknowledged nothing, so it was pinged meanwhile.
    assert dealers[0].recv_multipart() == [b"ping"]
    sessions, compressed, counts = set(), [], []
    for rank, received in enumerate(messages):
        for seq, (data, seal) in enumerate(received):
            heads, segments = [], []
            for index, (first, *carried) in enumerate(data):
                assert PRELUDE.unpack_from(first) == (b"RLWZ", 2, 2)
                values = msgspec.msgpack.decode(first[PRELUDE.size :])
                head = dict(zip(HEAD_FIELDS, values, strict=True))
                assert carried and (head["index"], head["count"]) == (index, len(data))
                heads.append({k: v for k, v in head.items() if k != "index"})
                segments += carried
            counts.append(len(data))
            head = heads[0]
            assert all(h == head for h in heads)  # the data packets differ only in index
            sessions.add(head["session"])
            assert (head["seq"], head["step"], head["rank"]) == (seq, seq, rank)
            assert (head["shared"], head["codec"]) == (False, "msgpack")
            assert head["segments"] == len(segments)
            assert head["sidecar"] and all(0 <= i < len(segments) - 1 for i in head["sidecar"])
            assert head["checksum"] == "xxh3-64"
            session, seal_seq = struct.unpack_from("<8sQ", seal[1])
            assert (seal[0], session, seal_seq) == (b"seal", head["session"], seq)
            assert seal[1][16:] == checksums_of(segments)
            if head["compression"]:
                compressed.append(rank)
                sizes = zip(head["compression"], head["raw_sizes"], segments, strict=True)
                for cid, size, segment in sizes:
                    assert cid in (0, 1)
                    if cid == 1:
                        assert len(lz4.block.decompress(segment, uncompressed_size=size)) == size
            else:
                assert head["raw_sizes"] == []
    assert len(sessions) == 1 and len(next(iter(sessions))) == 8
    assert compressed == [0, 0]  # the big messages, not the small ones
    assert counts[0] > 1 and counts[1] > 1 and counts[2:] == [1, 1]


def test_a_receiver_refuses_malformed_packets_and_goes_on(
    tmp_path: Path, raw_socket: RawSocket
) -> None:
    """A raw ROUTER socket answers a receiver's ready packet with malformed packets:
    each is a typed error naming where, and the receiver goes on with the next good
    message; a skipped sequence number is a StepGapError, after which the message that
    revealed it is returned. The receiver acknowledges each message it read whole (even
    one that failed its checksums or was meant for another rank, so a closing sender
    need not wait for it) and says bye."""
    url = f"zmq+ipc://{tmp_path}/sock"
    where = url.removeprefix("zmq+")
    router = raw_socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind(url.removeprefix("zmq+"))
    with rlwire.open_receiver(url) as receiver:
        peer, kind, body = router.recv_multipart()
        assert (kind, msgspec.msgpack.decode(body)) == (b"ready", [2, 0, None, 2])
        refused: list[tuple[Packets, type[rlwire.RlwireError], str]] = [
            ([parts], error, words) for parts, error, words in BAD
        ]
        refused += [
            (wire_packets(0, 0, rank=3), _CORRUPT, "holds rank 3's payload"),
            (
                wire_packets(0, 7, session=b"C" * 8, corrupt_buffer=True, cut=(1,)),
                _CORRUPT,
                f"segment {_N - 1}: buffer {_N - 2} (",  # in data packet 1
            ),
            ([*wire_packets(0, 8)[:-1], [b"seal", b"\0" * 20]], _CORRUPT, "malformed seal"),
            (
                [*wire_packets(0, 9)[:-1], [b"seal", struct.pack("<8sQ", b"S" * 8, 9)]],
                _CORRUPT,
                f"{_N} segments in the head, {_N} received, 0 checksums",
            ),
        ]
        for packets, error, words in refused:
            for packet in packets:
                router.send_multipart([peer, *packet])
            with pytest.raises(error) as info:
                receiver.receive(timeout=LONG)
            assert type(info.value) is error
            assert where in str(info.value) and words in str(info.value), info.value
        for step, seq in [(0, 0), (1, 1), (2, 3)]:  # message 2 was lost
            for packet in wire_packets(step, seq, cut=(2,)):
                router.send_multipart([peer, *packet])
        assert [receiver.receive(timeout=LONG).samples[0].env_name for _ in range(2)] == [
            "env0",
            "env1",
        ]
        with pytest.raises(rlwire.StepGapError, match="expected message 2 of this sender, got 3"):
            receiver.receive(timeout=LONG)
        assert receiver.receive(timeout=LONG).samples[0].env_name == "env2"
        assert receiver.last_step == 2
        acks = [
            struct.pack("<8sQ", session, seq)
            for session, seq in [
                (b"S" * 8, 0),  # refused: another rank's payload
                (b"C" * 8, 7),
                (b"S" * 8, 9),
                (b"S" * 8, 0),
                (b"S" * 8, 1),
                (b"S" * 8, 3),
            ]
        ]
        got = receive_until(router, lambda m: m == [peer, b"ack", acks[-1]])
        assert [m[2] for m in got if m[1] == b"ack"] == acks
    assert receive_until(router, lambda m: m[1] != b"ready")[-1] == [peer, b"bye", b""]


# -- the order of messages: gaps, repeats, restarts, patterns, the end ---------------------


def forged(
    step: int,
    seq: int,
    *,
    session: bytes = b"S" * 8,
    rank: int = 0,
    shared: bool = False,
    cut: tuple[int, ...] = (),
) -> Packets:
    """The packets of the message of ``step``, built with the protocol module's own
    builders (what a sender sends)."""
    frame = encoded(step)
    segments = [bytes(frame.header), *map(bytes, frame.buffers)]
    head = protocol.make_head(
        frame, session=session, step=step, rank=rank, shared=shared, checksum=True
    )
    counts = [*cut, len(segments) - sum(cut)]
    data = [
        [
            protocol.first_part(head, seq=seq, index=index, count=len(counts)),
            *segments[sum(counts[:index]) : sum(counts[: index + 1])],
        ]
        for index in range(len(counts))
    ]
    return [*data, control.seal_packet(session, seq, checksums_of(segments))]


class Forger:
    """A raw ROUTER socket playing the sender to one receiver in this process."""

    def __init__(self, raw_socket: RawSocket, url: str) -> None:
        self.router = raw_socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.bind(url.removeprefix("zmq+"))
        self.peer: bytes | None = None

    def handshake(self) -> None:
        peer, kind, _body = self.router.recv_multipart()
        assert kind == b"ready"
        self.peer = peer

    def send(self, packets: Packets) -> None:
        assert self.peer is not None
        for parts in packets:
            self.router.send_multipart([self.peer, *parts])


def env(receiver: Any) -> str:
    return str(receiver.receive(timeout=LONG).samples[0].env_name)


def test_repeated_and_backward_steps_are_refused_and_never_returned(
    tmp_path: Path, raw_socket: RawSocket
) -> None:
    """Within one sender session, a message that repeats a step (with a later sequence
    number) or goes back (a step, or a sequence number) raises StepOrderError saying so,
    not a StepGapError about lost messages, and is discarded: nothing is returned twice,
    and the genuine next message follows with no error."""
    url = f"zmq+ipc://{tmp_path}/sock"
    forger = Forger(raw_socket, url)
    with rlwire.open_receiver(url) as receiver:
        forger.handshake()
        for step in range(6):
            forger.send(forged(step, step))
        assert [env(receiver) for _ in range(6)] == [f"env{s}" for s in range(6)]
        refused = [
            (forged(5, 10), "message 10 of this sender holds step 5 again"),
            (forged(3, 11), "message 11 of this sender holds step 3, behind step 6"),
            (forged(6, 2), "message 2 of this sender (step 6) repeats or goes back"),
        ]
        for packets, words in refused:
            forger.send(packets)
            with pytest.raises(rlwire.StepOrderError) as info:
                receiver.receive(timeout=LONG)
            assert type(info.value) is rlwire.StepOrderError, info.value
            assert words in str(info.value) and "discarded" in str(info.value)
            assert "lost" not in str(info.value)
        forger.send(forged(6, 6))
        assert env(receiver) == "env6" and receiver.last_step == 6
        with pytest.raises(rlwire.ReceiveTimeout):
            receiver.receive(timeout=SHORT / 4)


def test_a_new_session_behind_is_reported_once_and_never_repeats_a_step(
    tmp_path: Path, raw_socket: RawSocket
) -> None:
    """A sender that restarts at step 0 while the receiver expects step 5: one
    StepOrderError (nothing was lost), then steps 0-4 of the new session are discarded
    without a word, and step 5 is the next one returned."""
    url = f"zmq+ipc://{tmp_path}/sock"
    forger = Forger(raw_socket, url)
    with rlwire.open_receiver(url) as receiver:
        forger.handshake()
        for step in range(5):
            forger.send(forged(step, step, session=b"A" * 8))
        assert [env(receiver) for _ in range(5)] == [f"env{s}" for s in range(5)]
        for step in range(7):
            forger.send(forged(step, step, session=b"B" * 8))
        with pytest.raises(rlwire.StepOrderError) as info:
            receiver.receive(timeout=LONG)
        assert type(info.value) is rlwire.StepOrderError
        assert (
            "a new sender session started at step 0, behind step 5: steps 0-4 would "
            "repeat; discarded until step 5"
        ) in str(info.value)
        assert [env(receiver), env(receiver)] == ["env5", "env6"]
        # A session that starts after a gap is a gap, as before: reported, then returned.
        forger.send(forged(9, 0, session=b"C" * 8))
        with pytest.raises(rlwire.StepGapError, match="expected step 7, got step 9"):
            receiver.receive(timeout=LONG)
        assert env(receiver) == "env9"


def test_a_new_session_at_the_expected_step_goes_on(tmp_path: Path, raw_socket: RawSocket) -> None:
    """A sender restarted from a checkpoint at the step the receiver expects: no error;
    the new session's first message must be its message 0 to this receiver."""
    url = f"zmq+ipc://{tmp_path}/sock"
    forger = Forger(raw_socket, url)
    with rlwire.open_receiver(url) as receiver:
        forger.handshake()
        forger.send(forged(0, 0, session=b"A" * 8))
        forger.send(forged(1, 0, session=b"B" * 8))
        assert [env(receiver), env(receiver)] == ["env0", "env1"]
        forger.send(forged(2, 4, session=b"C" * 8))
        with pytest.raises(
            rlwire.StepGapError, match="expected message 0 of a new sender session, got 4"
        ):
            receiver.receive(timeout=LONG)
        assert env(receiver) == "env2"


@pytest.mark.parametrize("option", [None, "ranks"])
def test_a_shared_message_cannot_move_a_per_rank_receiver(
    tmp_path: Path, raw_socket: RawSocket, option: str | None
) -> None:
    """A receiver of the ranks pattern (set by its storage option, or by the first
    message) refuses a message flagged shared, whatever its step or rank: a typed error,
    and the receiver still expects the step it expected."""
    url = f"zmq+ipc://{tmp_path}/sock"
    forger = Forger(raw_socket, url)
    options = {} if option is None else {"pattern": option}
    with rlwire.open_receiver(url, storage_options=options) as receiver:
        forger.handshake()
        for step in range(6):
            forger.send(forged(step, step))
        assert [env(receiver) for _ in range(6)] == [f"env{s}" for s in range(6)]
        forger.send(forged(100, 6, shared=True, rank=7))
        with pytest.raises(rlwire.CorruptFrameError) as info:
            receiver.receive(timeout=LONG)
        assert "step 100 is of the 'shared' pattern; this receiver expects the 'ranks'" in str(
            info.value
        )
        assert receiver.next_step == 6
        forger.send(forged(6, 7))  # message 6 was the refused one: a gap in the sequence
        with pytest.raises(rlwire.StepGapError, match="expected message 6 of this sender"):
            receiver.receive(timeout=LONG)
        assert env(receiver) == "env6"


def test_the_pattern_option_refuses_the_other_pattern_from_the_first_message(
    tmp_path: Path, raw_socket: RawSocket
) -> None:
    """A receiver opened with pattern="ranks" refuses a shared message even as the
    first one; one opened with pattern="shared" refuses a per-rank one, and takes shared
    messages of any step above the last, refusing one that goes back."""
    url = f"zmq+ipc://{tmp_path}/sock"
    for option, packets, found in [
        ("ranks", forged(0, 0, shared=True), "'shared' pattern; this receiver expects the 'ranks'"),
        ("shared", forged(0, 0), "'ranks' pattern; this receiver expects the 'shared'"),
    ]:
        forger = Forger(raw_socket, url)
        with rlwire.open_receiver(url, storage_options={"pattern": option}) as receiver:
            forger.handshake()
            forger.send(packets)
            with pytest.raises(rlwire.CorruptFrameError, match=found):
                receiver.receive(timeout=LONG)
            if option == "shared":
                for step, seq in [(3, 0), (7, 1), (5, 2), (8, 3)]:
                    forger.send(forged(step, seq, session=b"T" * 8, shared=True))
                assert [env(receiver), env(receiver)] == ["env3", "env7"]
                with pytest.raises(rlwire.StepOrderError, match="step 5, behind step 8"):
                    receiver.receive(timeout=LONG)
                assert env(receiver) == "env8"
        forger.router.close()


def test_an_end_after_lost_steps_is_a_gap_then_the_end(
    tmp_path: Path, raw_socket: RawSocket
) -> None:
    """In the ranks pattern, an end beyond the expected step says which steps were lost,
    then the stream ends; an end from a session other than the messages' (a sender that
    restarted and finished) ends the stream too."""
    url = f"zmq+ipc://{tmp_path}/sock"
    forger = Forger(raw_socket, url)
    with rlwire.open_receiver(url) as receiver:
        forger.handshake()
        forger.send(forged(0, 0))
        forger.send(forged(1, 1))
        forger.send([control.end_packet(5)])
        assert [env(receiver), env(receiver)] == ["env0", "env1"]
        with pytest.raises(rlwire.StepGapError, match="finished the stream at step 5: steps 2-4"):
            receiver.receive(timeout=LONG)
        with pytest.raises(rlwire.EndOfStream, match="step 4 was its last"):
            receiver.receive(timeout=LONG)
    forger.router.close()
    forger = Forger(raw_socket, url)
    with rlwire.open_receiver(url) as receiver:
        forger.handshake()
        forger.send(forged(0, 0, session=b"A" * 8))
        forger.send([control.end_packet(1)])  # the end carries no session
        assert env(receiver) == "env0"
        assert list(receiver) == []


def test_a_message_stopped_midway_is_dropped_and_counts_as_lost(
    tmp_path: Path, raw_socket: RawSocket
) -> None:
    """The data packets of a message whose seal never comes are never returned, in part
    or whole: they are dropped on the sender's abort of that message (an abort of another
    is ignored), on the first data packet of the next message, or on the end. Data
    packets of a message whose start never came, and a seal without its message, are
    discarded without a word. Each dropped message is a lost one: the message returned
    after it reports the gap, or the end does."""
    url = f"zmq+ipc://{tmp_path}/sock"
    forger = Forger(raw_socket, url)
    with rlwire.open_receiver(url) as receiver:
        forger.handshake()
        forger.send(forged(0, 0, cut=(2,)))
        assert env(receiver) == "env0"
        one = forged(1, 1, cut=(2, 2))
        forger.send([*one[:2], control.abort_packet(b"S" * 8, 0)])  # another message's
        forger.send([one[2], control.abort_packet(b"S" * 8, 1), one[3]])
        forger.send(forged(2, 2, cut=(2,)))
        with pytest.raises(rlwire.StepGapError, match="expected step 1, got step 2"):
            receiver.receive(timeout=LONG)
        assert env(receiver) == "env2"
        forger.send(forged(3, 3, cut=(2,))[:1])
        forger.send(forged(4, 4, cut=(2,)))
        with pytest.raises(rlwire.StepGapError, match="expected step 3, got step 4"):
            receiver.receive(timeout=LONG)
        assert env(receiver) == "env4"
        forger.send(forged(5, 5, cut=(2,))[1:])
        with pytest.raises(rlwire.ReceiveTimeout):
            receiver.receive(timeout=SHORT / 4)
        forger.send(forged(6, 6, cut=(3, 1)))
        with pytest.raises(rlwire.StepGapError, match="expected step 5, got step 6"):
            receiver.receive(timeout=LONG)
        assert env(receiver) == "env6"
        forger.send([*forged(7, 7, cut=(2,))[:1], control.end_packet(8)])
        with pytest.raises(rlwire.StepGapError, match="finished the stream at step 8: steps 7"):
            receiver.receive(timeout=LONG)
        with pytest.raises(rlwire.EndOfStream):
            receiver.receive(timeout=LONG)


# -- absent (2.2): a step that has no message for a rank -----------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_step_sent_to_fewer_ranks_sends_absent_to_the_receivers_of_2_2_only(
    tmp_path: Path, raw_socket: RawSocket
) -> None:
    """Step 0 goes to ranks 0-2, step 1 to rank 0 alone: the receiver of rank 1, which
    announced minor version 2, is sent ``absent`` (step 1, 1 rank) as soon as step 1 is
    sent, with no sequence number of its own; the receiver of rank 2 announced 2.1, which
    would refuse an unknown packet as corrupt, and is sent nothing until the end."""
    url = f"zmq+ipc://{tmp_path}/sock"
    dealers = [raw_socket(zmq.DEALER) for _ in range(3)]
    async with rlwire.open_sender(url, storage_options={"linger": SHORT}) as sender:
        for rank, dealer in enumerate(dealers):
            dealer.connect(url.removeprefix("zmq+"))
            minor = 1 if rank == 2 else 2
            dealer.send_multipart([b"ready", msgspec.msgpack.encode([2, rank, None, minor])])
        await sender.send_ranks([make_batch(1, 8, seed=rank) for rank in range(3)])
        await sender.send(make_batch(1, 8, seed=9))
        for dealer in dealers:
            receive_message(dealer)  # step 0
        assert dealers[1].recv_multipart() == [b"absent", struct.pack("<QQ", 1, 1)]
        await sender.finish()
    data, _seal = receive_message(dealers[0])  # step 1
    assert msgspec.msgpack.decode(data[0][0][PRELUDE.size :])[1:3] == [1, 1]  # seq 1, step 1
    for dealer in dealers:
        assert dealer.recv_multipart() == [b"end", struct.pack("<Q", 2)]


def test_an_absent_step_is_a_gap_said_once(tmp_path: Path, raw_socket: RawSocket) -> None:
    """``absent`` of the step a receiver expects raises StepGapError naming the step and
    the ranks it went to, once: the next whole step then follows on with no second
    gap, whether the receiver ``skip()``-ped the step or not, and so does the end. An
    ``absent`` of a step passed, or of one after a gap (the next message reports the gap),
    says nothing."""
    url = f"zmq+ipc://{tmp_path}/sock"
    forger = Forger(raw_socket, url)
    with rlwire.open_receiver(url, rank=2) as receiver:
        forger.handshake()
        forger.send([*forged(0, 0, rank=2), control.absent_packet(1, 2)])
        assert env(receiver) == "env0"
        with pytest.raises(rlwire.StepGapError, match=r"step 1 was sent to ranks 0\.\.1 only"):
            receiver.receive(timeout=LONG)
        with pytest.raises(rlwire.ReceiveTimeout):  # nothing more is said of step 1
            receiver.receive(timeout=SHORT / 4)
        forger.send(forged(2, 1, rank=2))
        assert env(receiver) == "env2"  # not skipped: no second gap either
        forger.send([control.absent_packet(3, 1)])
        with pytest.raises(rlwire.StepGapError, match="step 3 was sent to rank 0 only"):
            receiver.receive(timeout=LONG)
        assert receiver.skip() == 3
        forger.send([control.absent_packet(3, 1), *forged(4, 2, rank=2)])  # passed: ignored
        assert env(receiver) == "env4"
        forger.send([control.absent_packet(6, 1), *forged(7, 3, rank=2)])  # after a gap
        with pytest.raises(rlwire.StepGapError, match="expected step 5, got step 7"):
            receiver.receive(timeout=LONG)
        assert env(receiver) == "env7"
        forger.send([control.absent_packet(8, 1), control.end_packet(9)])
        with pytest.raises(rlwire.StepGapError, match="step 8 was sent to rank 0 only"):
            receiver.receive(timeout=LONG)
        assert list(receiver) == []  # the end at step 9: no gap to report


@pytest.mark.parametrize("skips", [False, True])
def test_absent_steps_in_a_row_are_each_said_at_once(
    tmp_path: Path, raw_socket: RawSocket, skips: bool
) -> None:
    """Steps 1 and 2 both leave rank 2 out: each is said when it is the step to come,
    ``skip()``-ped or not (the second packet was dropped while the receiver still
    expected step 1, so step 2 was said only when step 3 came), and step 3 follows on."""
    url = f"zmq+ipc://{tmp_path}/sock"
    forger = Forger(raw_socket, url)
    with rlwire.open_receiver(url, rank=2) as receiver:
        forger.handshake()
        forger.send([*forged(0, 0, rank=2), control.absent_packet(1, 2)])
        forger.send([control.absent_packet(2, 1)])
        assert env(receiver) == "env0"
        for step in (1, 2):
            with pytest.raises(rlwire.StepGapError, match=f"step {step} was sent to"):
                receiver.receive(timeout=LONG)
            if skips:
                assert receiver.skip() == step
        forger.send(forged(3, 1, rank=2))
        assert env(receiver) == "env3"
