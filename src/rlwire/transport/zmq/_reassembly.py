"""A receiver puts each message back together from its data packets, and checks it at its seal.

Data packets arrive one by one; each is hashed as it arrives (while the next one is on
its way), and the message is returned only once its seal closes it whole. What breaks the
run (an ``abort``, another message's data packet 0, a data packet that does not follow
on, an ``end``) drops what came before it (docs/format.md, "ZeroMQ messages").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import msgspec
import numpy as np

from rlwire._core.errors import CorruptFrameError, RlwireError
from rlwire._frame.checksums import CHECKSUM, check_algorithm, compare_digests, segment_digests
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selector
from rlwire.transport.zmq._control import parse_abort, parse_seal
from rlwire.transport.zmq._protocol import Head, frame_of, parse_data

__all__ = ["Reassembly", "Sealed"]


@dataclass
class _Partial:
    """The data packets of a message received so far, hashed as they came."""

    head: Head  # of data packet 0
    segments: list[memoryview] = field(default_factory=list)
    digests: list[int] = field(default_factory=list)
    received: int = 0  # data packets
    nbytes: int = 0  # of the segments received (kept or not)
    keep: frozenset[int] | None = None  # the buffers kept (a partial read), None: all

    def follows(self, head: Head) -> bool:
        """True if ``head`` is of the data packet that comes next in this message."""
        return head.index == self.received and msgspec.structs.replace(head, index=0) == self.head


@dataclass(frozen=True)
class Sealed:
    """A message whose seal arrived after all its data packets, not checked yet.

    Attributes:
        head: the head of its data packet 0.
        segments: its segments, views of the received ZeroMQ frames.
        checksums: what its seal carries (packed little-endian u64, or empty).
        digests: the checksums computed as its data packets arrived (empty when not
            verifying).
    """

    head: Head
    segments: list[memoryview]
    checksums: bytes
    digests: list[int]
    keep: frozenset[int] | None = None

    @property
    def missing(self) -> frozenset[int]:
        """The buffers dropped on arrival (a partial read): empty views, not verified."""
        if self.keep is None:
            return frozenset()
        return frozenset(range(len(self.segments) - 1)) - self.keep

    def frame(self, where: str, *, copy: bool = False, verified: bool = False) -> Frame:
        """The message's frame (its segments copied into writable memory if ``copy``);
        ``verified``: :meth:`check` verified its checksums.

        Raises:
            CorruptFrameError: the head's description does not fit the segments.
        """
        segments = [memoryview(bytearray(s)) for s in self.segments] if copy else self.segments
        frame = frame_of(self.head, segments, where=where)
        if verified:
            frame = replace(frame, verified=True)
        return replace(frame, missing=self.missing) if self.keep is not None else frame

    def check(self, *, rank: int, shared: bool | None, verify: bool, where: str) -> None:
        """Check the message against its head, that it is for a receiver of ``rank``
        expecting the ``shared`` pattern (or either, if ``None``), and, with ``verify``,
        its checksums.

        Raises:
            CorruptFrameError: any of these fails.
            UnsupportedVersionError: a checksum algorithm this reader does not know.
        """
        head, segments = self.head, self.segments
        expected = 8 * head.segments if head.checksum else 0
        if len(segments) != head.segments or len(self.checksums) != expected:
            raise CorruptFrameError(
                f"the message disagrees with its head: {head.segments} segments in the "
                f"head, {len(segments)} received, {len(self.checksums) // 8} checksums",
                where=where,
            )
        _check_recipient(head, rank=rank, shared=shared, where=where)
        if verify and head.checksum is not None:
            check_algorithm(head.checksum, where)
            kept = [k for k in range(len(segments)) if k == 0 or k - 1 not in self.missing]
            stored = np.frombuffer(self.checksums, "<u8")[kept].tobytes()
            digests = [self.digests[k] for k in kept]
            compare_digests(stored, digests, [segments[k] for k in kept], where, names=kept)


class Reassembly:
    """The message under way on one receiver's connection, put back together.

    Example:
        >>> from rlwire.transport.zmq._control import abort_packet
        >>> Reassembly(verify=True).take(abort_packet(b"S" * 8, 0), where="ipc:///run")
    """

    def __init__(self, *, verify: bool) -> None:
        self.verify = verify
        self._partial: _Partial | None = None  # a message whose seal has not come

    def drop(self) -> None:
        """Drop the message under way (the stream ended, or a packet was refused)."""
        self._partial = None

    def held(self, head: Head) -> tuple[int, int]:
        """The segments and bytes received of the message that the data packet of
        ``head`` goes on with; none if it starts a message, or follows on from none."""
        partial = self._partial
        if head.index == 0 or partial is None or not partial.follows(head):
            return 0, 0
        return len(partial.segments), partial.nbytes

    def take(
        self,
        parts: Sequence[bytes | memoryview],
        *,
        where: str,
        select: Selector | None = None,
        head: Head | None = None,
    ) -> Sealed | None:
        """The message that ``parts`` (an ``abort``, a seal or a data packet) completes,
        or ``None`` if it completes none. With ``select`` (a partial read), the buffers
        it does not ask for are dropped as they arrive. ``head``: the data packet's,
        parsed already.

        Raises:
            CorruptFrameError: a data packet or seal that is not well-formed, or that
                takes the message beyond the segments its head declares (the message
                under way is dropped).
            UnsupportedVersionError: a data packet of a major version this reader
                does not know.
        """
        aborted = parse_abort(parts)
        if aborted is not None:
            partial = self._partial
            if partial is not None and aborted == (partial.head.session, partial.head.seq):
                self._partial = None
            return None
        seal = parse_seal(parts, where=where)
        if seal is not None:
            partial, self._partial = self._partial, None
            if (
                partial is None
                or (partial.head.session, partial.head.seq) != (seal.session, seal.seq)
                or partial.received != partial.head.count
            ):
                return None  # the seal of a message not whole here: lost, as below
            return Sealed(
                partial.head, partial.segments, seal.checksums, partial.digests, partial.keep
            )
        try:
            head, segments = parse_data(parts, where=where, head=head)
        except CorruptFrameError:
            self._partial = None
            raise
        if head.index == 0:
            self._partial = _Partial(head)  # one stopped midway is dropped
            if select is not None and segments:
                self._partial.keep = _kept(head, segments[0], select)
        elif self._partial is None or not self._partial.follows(head):
            # Of a message whose start was lost: the whole message is, and the next
            # message reports the loss.
            self._partial = None
            return None
        partial = self._partial
        partial.nbytes += sum(len(s) for s in segments)
        if partial.keep is not None:  # drop the buffers not asked for: their memory goes
            first = len(partial.segments)
            segments = [
                s if k == 0 or k - 1 in partial.keep else _EMPTY
                for k, s in enumerate(segments, start=first)
            ]
        partial.segments += segments
        partial.received += 1
        if len(partial.segments) > head.segments:
            self._partial = None
            raise CorruptFrameError(
                f"data packet {head.index} of step {head.step} takes the message to "
                f"{len(partial.segments)} segments; its head says {head.segments}",
                where=where,
            )
        if self.verify and head.checksum == CHECKSUM:  # while the next packet arrives
            partial.digests += segment_digests(segments)
        return None


_EMPTY = memoryview(b"")


def _kept(head: Head, header: memoryview, select: Selector) -> frozenset[int] | None:
    """The buffers ``select`` asks for, told from the message's header alone; ``None``
    (keep all) if it cannot tell from the header alone, or fails (the decode of the
    whole message then says why)."""
    n = max(0, head.segments - 1)
    missing = frozenset(range(n))
    try:
        frame = Frame(
            header,
            (_EMPTY,) * n,
            codec=head.codec,
            compression=tuple(head.compression),
            raw_sizes=tuple(head.raw_sizes),
            missing=missing,
        )
        chosen = select(frame)
    except (RlwireError, ValueError):
        return None
    return None if chosen is None or not chosen.complete else chosen.buffers & missing


def _check_recipient(head: Head, *, rank: int, shared: bool | None, where: str) -> None:
    """Check that a message is meant for a receiver of ``rank`` that expects the
    ``shared`` pattern (``True``), the ``ranks`` pattern (``False``), or either
    (``None``).

    Raises:
        CorruptFrameError: a message of the other pattern, or another rank's payload.
    """
    if shared is not None and head.shared != shared:
        found, expected = ("shared", "ranks") if head.shared else ("ranks", "shared")
        raise CorruptFrameError(
            f"step {head.step} is of the {found!r} pattern; this receiver expects the "
            f"{expected!r} pattern (the sender and receiver disagree on storage option "
            "'pattern')",
            where=where,
        )
    if not head.shared and head.rank != rank:
        raise CorruptFrameError(f"holds rank {head.rank}'s payload", where=where)
