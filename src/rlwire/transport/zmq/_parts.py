"""Steps filled part by part over ZeroMQ (docs/format.md, "ZeroMQ messages", 2.1).

A part travels to its rank's receiver as a message of its own, whose head says
``kind=PART`` and carries the part's index, key and cost; the step's seal travels to
every rank's receiver of the step as one more message, ``kind=STEP_SEAL``, whose one
segment is the msgpack array ``[keys, costs]`` of :class:`~rlwire.abc.Seal`. Both are
sequenced, sealed and checksummed as a whole step's message is.

Nothing is stored: a receiver keeps the parts of the step it is reading until it asks
for a later step (:class:`StepParts`), and a sender knows only the parts it sent itself
(:class:`SentParts`).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from rlwire._core.errors import ConfigError, CorruptFrameError, StepExistsError, StepOrderError
from rlwire._frame.frame import Frame
from rlwire.transport._parts import Key, PartInfo, Seal, check_key
from rlwire.transport.zmq._protocol import PART, STEP_SEAL, Head

__all__ = [
    "SentParts",
    "StepParts",
    "decode_seal",
    "encode_seal",
    "part_head",
    "refuse_shared",
    "seal_head",
]

_seal_decoder = msgspec.msgpack.Decoder(tuple[list[list[str | int]], list[list[float]]])


def refuse_shared(pattern: str, *, where: str) -> None:
    """Refuse parts for the ``shared`` pattern, which deals each step whole to one
    consumer (a step's parts are for its ranks).

    Raises:
        ConfigError: ``pattern`` is ``"shared"``.
    """
    if pattern == "shared":
        raise ConfigError(
            "the 'shared' pattern deals each step whole to one consumer: a step filled "
            "part by part (open_step) needs pattern='ranks'",
            where=where,
        )


def part_head(head: Head, info: PartInfo) -> Head:
    """``head`` (of a part's frame, made as a whole step's) as the head of part ``info``."""
    return msgspec.structs.replace(
        head, rank=info.rank, kind=PART, part=info.index, key=info.key, cost=info.cost
    )


def seal_head(session: bytes, seal: Seal, rank: int, *, checksum: str | None) -> Head:
    """The head of ``seal``'s message to the receiver of ``rank``: one segment, the body."""
    return Head(
        session, 0, seal.step, rank, False, "", [], b"", [], checksum, 1, 0, 0, kind=STEP_SEAL
    )


def encode_seal(seal: Seal) -> bytes:
    """The one segment of a seal's message: msgpack ``[keys, costs]``.

    Example:
        >>> encode_seal(Seal(step=3, keys=(("a",), ()), costs=((2.0,), ())))
        b'\\x92\\x92\\x91\\xa1a\\x90\\x92\\x91\\xcb@\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x90'
    """
    return msgspec.msgpack.encode([seal.keys, seal.costs])


def decode_seal(step: int, body: bytes | memoryview, *, where: str) -> Seal:
    """The seal of ``step`` that ``body`` (the one segment of a seal's message) carries.

    Raises:
        CorruptFrameError: a malformed body, ranks whose keys and costs disagree, a key
            that cannot name a part, or a key listed twice.
    """
    try:
        keys, costs = _seal_decoder.decode(body)
        if len(keys) != len(costs) or any(map(_differ, keys, costs)):
            raise ValueError("the keys and costs of its ranks disagree")
        seen: set[tuple[type, Key]] = set()
        for key in (key for rank in keys for key in rank):
            if (type(key), check_key(key)) in seen:
                raise ValueError(f"key {key!r} is listed twice")
            seen.add((type(key), key))
    except (msgspec.DecodeError, ValueError, ConfigError) as exc:
        raise CorruptFrameError(f"malformed seal of step {step}: {exc}", where=where) from exc
    return Seal(step, tuple(map(tuple, keys)), tuple(map(tuple, costs)))


def _differ(keys: Sequence[object], costs: Sequence[object]) -> bool:
    return len(keys) != len(costs)


class StepParts:
    """What a receiver got of the step filled part by part it is reading: its parts by
    index, and its seal once that came, of one sender session.

    Example:
        >>> parts = StepParts()
        >>> parts.forget_before(5)
        >>> parts.get(5, 0), parts.seal_of(5)
        (None, None)
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.step: int | None = None
        self._session = b""
        self._parts: dict[int, tuple[PartInfo, Frame]] = {}
        self._seal: Seal | None = None
        self._handed = 0  # parts handed out by get()

    def forget_before(self, step: int) -> None:
        """Drop what is kept of a step before ``step``: the receiver moved past it."""
        if self.step is not None and self.step < step:
            self._reset()

    def sealed(self, step: int) -> bool:
        """True once the seal of ``step`` came: nothing after it is read for ``step``."""
        return self._seal is not None and self.step == step

    def get(self, step: int, index: int) -> tuple[PartInfo, Frame] | None:
        """Part ``index`` of ``step``, if it came."""
        got = self._parts.get(index) if self.step == step else None
        if got is not None:
            self._handed = max(self._handed, index + 1)
        return got

    def seal_of(self, step: int) -> Seal | None:
        """The seal of ``step``, if it came."""
        return self._seal if self.step == step else None

    def add_part(self, head: Head, frame: Frame, *, where: str) -> None:
        """Keep part ``head.part`` of ``head.step``.

        Raises:
            CorruptFrameError: its key cannot name a part.
            StepOrderError: it starts the step again from a new sender session after
                parts of the old one were handed out (it is kept: the step is the new
                session's from now on).
        """
        try:
            key = check_key(head.key)
        except ConfigError as exc:
            raise CorruptFrameError(f"part {head.part}: {exc}", where=where) from exc
        restarted = self._begin(head)
        self._parts[head.part] = (PartInfo(head.rank, head.part, key, head.cost), frame)
        if restarted:
            raise StepOrderError(
                f"a new sender session sends step {head.step} again from its part "
                f"{head.part}, after {restarted} parts of it were read from a sender that "
                "never sealed it: those are void; receive() returns the step whole once "
                "the new session seals it",
                where=where,
                step=head.step,
                rank=head.rank,
            )

    def add_seal(self, head: Head, body: memoryview, *, where: str) -> None:
        """Keep the seal ``head``'s message carries.

        Raises:
            CorruptFrameError: a malformed seal.
        """
        seal = decode_seal(head.step, body, where=where)
        self._begin(head)
        self._seal = seal

    def _begin(self, head: Head) -> int:
        """Make ``head``'s step and session the ones kept; the parts handed out of
        another session's run of that step (which never sealed it), if any."""
        if self.step == head.step and self._session == head.session:
            return 0
        restarted = self._handed if self.step == head.step else 0
        self._reset()
        self.step, self._session = head.step, head.session
        return restarted


class SentParts:
    """What a sender's sink sent of the step it fills part by part: the parts whose
    commit made them visible, and the ranks sent the seal, for the same sender to open
    the step again after an error. A sink of a new sender (a new process) knows none.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.parts: list[PartInfo] = []
        self.sealed_to: set[int] = set()
        self._sealed: int | None = None  # the last step sealed

    def open(self, step: int) -> list[PartInfo]:
        """The parts of ``step`` sent so far (none if it is not the step under way).

        Raises:
            StepExistsError: this sink sealed ``step`` already.
        """
        if step == self._sealed:
            raise StepExistsError(f"step {step} was sealed already by this sender", step=step)
        if self.step != step:
            self.step, self.parts, self.sealed_to = step, [], set()
        return list(self.parts)

    def sent(self, step: int, info: PartInfo) -> None:
        """Record that part ``info`` of ``step`` may be visible to its receiver."""
        if self.step != step:
            self.step, self.parts, self.sealed_to = step, [], set()
        self.parts.append(info)

    def close(self, step: int) -> None:
        """Record that every receiver of ``step`` was sent its seal."""
        self._sealed = step
        if self.step == step:
            self.step, self.parts, self.sealed_to = None, [], set()
