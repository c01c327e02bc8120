"""The receiving side of steps filled part by part: :class:`Part`, what a part decodes
to for a receiver's type, and ``parts()`` / ``aparts()`` of a receiver.

A part stores a list of samples. A receiver of type ``T`` decodes it as ``T``'s one
list field (``list[TrainingSample]`` for :class:`~rlwire.TrainingBatch`) and hands it
over as a ``T`` holding only those samples; a receiver of a list type (or ``Any``,
``object``, ``list``) hands over the list itself. ``receive()`` of such a step waits for
its seal and returns one ``T`` holding the samples of all the rank's parts, in commit
order.
"""

from __future__ import annotations

import threading
import time
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from rlwire._api.consumption import ConsumptionMarks
from rlwire._api.handed_keys import HandedKeys
from rlwire._api.joined_parts import joined_columns
from rlwire._api.runs import RunChecks
from rlwire._api.sealed import SealedStep, read_handed_part
from rlwire._api.stats import ReceiveStats, parts_added, parts_ended, received
from rlwire._core.deadlines import deadline_after
from rlwire._core.errors import ClosedError, ConfigError, CorruptFrameError, RlwireError
from rlwire._core.offload import drive_sliced
from rlwire._core.slicing import Held, Sliced, run_sliced
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source
from rlwire.transport._parts import Key, Seal

__all__ = ["NOTHING", "Part", "PartsReader", "part_types"]

T = TypeVar("T")
#: What the receiver's core returns while the next step (or part) is not there yet.
NOTHING: Any = object()
_NOTHING = NOTHING
_DONE: Any = object()


@dataclass(frozen=True)
class Part(Generic[T]):
    """One part of a step, as a receiver's ``parts()`` / ``aparts()`` yield it.

    Attributes:
        step: the step it belongs to.
        key: the key its producer put it with; ``None`` for a step sent whole, which
            ``parts()`` yields as one part.
        rank: the rank it was assigned to (the receiver's).
        index: its place among the rank's parts of the step, from 0, in commit order.
        value: its samples, decoded as the receiver's type: a ``TrainingBatch`` holding
            the part's samples for the default type (see :func:`part_types`).
        message_id: its message's :attr:`~rlwire.Frame.message_id`. Fields appended
            to a step filled part by part are tied to its part 0's: pass that one as
            ``add_fields(..., of=)``.

    Example:
        >>> import rlwire
        >>> rlwire.Part(step=0, key="g0", rank=0, index=0, value=[]).key
        'g0'
    """

    step: int
    key: Key | None
    rank: int
    index: int
    value: T
    message_id: bytes = b""


def part_types(type_: Any) -> tuple[Any, Callable[[Any], Any]]:
    """What a part decodes to for a receiver of ``type_``, and what makes a value of
    ``type_`` of the decoded samples.

    A msgspec Struct with exactly one ``list[...]`` field, every other field having a
    default, is filled through that field; a list type is itself; ``Any``, ``object``
    and ``list`` decode plain lists.

    Raises:
        ConfigError: ``type_`` is none of these.

    Example:
        >>> import rlwire
        >>> decode_as, make = part_types(rlwire.TrainingBatch)
        >>> decode_as, make([]).samples
        (list[rlwire.TrainingSample], [])
    """
    if type_ in (Any, object, list):
        return list, _same
    if typing.get_origin(type_) is list:
        return type_, _same
    if isinstance(type_, type) and issubclass(type_, msgspec.Struct):
        hints = typing.get_type_hints(type_)
        info = msgspec.structs.fields(type_)
        lists = [f.name for f in info if typing.get_origin(hints[f.name]) is list]
        required = [f.name for f in info if f.required]
        if len(lists) == 1 and set(required) <= set(lists):
            name = lists[0]
            return hints[name], lambda samples: type_(**{name: samples})
    raise ConfigError(
        f"a step filled part by part holds lists of samples: a receiver's type must be a "
        f"list type, Any, or a msgspec Struct with one list field whose other fields have "
        f"defaults; {type_!r} is none of these"
    )


def _same(value: Any) -> Any:
    return value


class PartsReader(RunChecks, ConsumptionMarks, Generic[T]):
    """The ``parts()`` and ``aparts()`` of :class:`~rlwire.TrainingBatchReceiver`,
    over the receiver's core, moving the rank's marks part by part."""

    _source: Source
    _rank: int | None
    _type: Any
    _mutex: threading.Lock
    _next_step: int
    _step: int | None
    _peeked: Any
    _limiter: Any
    _as_columns: bool
    _writable: bool
    _closed: bool
    _part_next: int = 0  # the next part of the next step to yield
    _last_stats: Any
    _step_stats: ReceiveStats | None = None  # the parts yielded of a step, summed
    # Where the receiver stood before the last step or part it took (see _give_back).
    _taken_from: tuple[int | None, int, int, Any, Any] | None = None
    _handed_keys: HandedKeys | None = None  # the keys of the parts handed out, for the seal

    @property
    def next_part(self) -> int:
        """The part of ``next_step`` that ``parts()`` yields next, by its place among
        the rank's parts: 0, unless the receiver is part way through a step filled part
        by part (or was opened with ``resume=True`` where its rank's marks say so)."""
        return self._part_next

    def _take_from_here(self) -> None:
        """Note where the receiver stands, just before it moves past what it takes (the
        mutex held)."""
        stats = (self._last_stats, self._step_stats)
        self._taken_from = (self._step, self._next_step, self._part_next, *stats)

    def _give_back(self, taken: Any) -> None:
        """Move back to before ``taken``, a step or part that a take returned in a trip
        to a worker thread whose caller asyncio had cancelled meanwhile (its own
        ``task.cancel()``): no one received it, so the next take returns it again."""
        if taken is _NOTHING or taken is _DONE:
            return
        with self._mutex:
            if self._taken_from is not None:
                self._step, self._next_step, self._part_next, *stats = self._taken_from
                self._last_stats, self._step_stats = stats
                self._taken_from = None

    # The receiver's core, which it defines.
    def _take(self, started: float, as_columns: bool | None = None) -> Sliced[Any]:
        raise NotImplementedError

    def _decode(
        self, frame: Frame | SealedStep, seconds: dict[str, float], as_columns: bool, type_: Any
    ) -> Sliced[Any]:
        raise NotImplementedError

    def _read(self) -> tuple[int, Any] | None:
        raise NotImplementedError

    def _check(self, obj: Any, step: int) -> Sliced[None]:
        raise NotImplementedError

    def _left(
        self, deadline: float | None, timeout: float | None, part: bool = False
    ) -> float | None:
        raise NotImplementedError

    def parts(
        self, timeout: float | None = None, *, as_columns: bool | None = None
    ) -> Iterator[Part[T]]:
        """Yield this rank's parts of the next step as each becomes visible, in commit
        order, and end at the step's seal; the receiver then moves to the step after.
        A step sent whole is yielded as one part (``key`` ``None``). A later call goes on
        where an interrupted one stopped (after an error, or a ``break``).

        Visible parts are found as steps are: by polling at the receiver's
        ``poll_interval`` on object stores (which back off up to a second while
        nothing arrives); on a local directory the receiver is woken as each file
        appears (inotify, on Linux) and still polls; on ``ray://`` the board wakes it.

        Raises:
            ReceiveTimeout: ``timeout`` seconds passed without a new part (the wait
                for each part has its own ``timeout``, not the whole step).
            EndOfStream: the sender finished before the step.
            ConfigError: the receiver's type cannot hold a part (:func:`part_types`).
            RlwireError: the others of ``receive`` (``CorruptFrameError``,
                ``DecodeError``, ``SchemaError``, ``TransportError``, ...).

        Example:
            >>> import anyio, rlwire, tempfile
            >>> path = tempfile.mkdtemp()
            >>> async def produce() -> None:
            ...     async with rlwire.open_sender(path) as sender:
            ...         async with sender.open_step() as writer:
            ...             await writer.put([], key="a")
            ...             await writer.put([], key="b")
            >>> anyio.run(produce)
            >>> with rlwire.open_receiver(path) as receiver:
            ...     [part.key for part in receiver.parts(timeout=5)]
            ['a', 'b']
        """
        deadline, started = deadline_after(timeout), time.perf_counter()
        while True:
            got = run_sliced(self._take_part(as_columns, started))
            if got is _DONE:
                return
            if got is _NOTHING:
                self._source.wait(self._left(deadline, timeout, part=True))
                continue
            yield got
            if got.key is None:
                return
            deadline, started = deadline_after(timeout), time.perf_counter()

    async def aparts(
        self, timeout: float | None = None, *, as_columns: bool | None = None
    ) -> AsyncIterator[Part[T]]:
        """:meth:`parts` without blocking the event loop: reads and decoding run in
        worker threads."""
        deadline, started = deadline_after(timeout), time.perf_counter()
        while True:
            got = await drive_sliced(
                self._take_part(as_columns, started), self._limiter, dropped=self._give_back
            )
            if got is _DONE:
                return
            if got is _NOTHING:
                await self._source.await_message(self._left(deadline, timeout, part=True))
                continue
            yield got
            if got.key is None:
                return
            deadline, started = deadline_after(timeout), time.perf_counter()

    def _take_part(self, as_columns: bool | None, started: float) -> Sliced[Any]:
        """The next part of the next step, ``_NOTHING`` if it is not there yet, or
        ``_DONE`` once the step's parts are all yielded (the receiver moves on)."""
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        step, rank = self._next_step, self._rank or 0
        if self._source.stores_parts:
            step = self._source.moved_to(step)  # after a gap the source said, skipped or not
        if _holds_sealed(self._peeked):
            self._peeked = None  # read by wait_next() to be joined: read part by part instead
        if self._source.stores_parts:
            held = Held(self._mutex)
            try:
                yield from held.take()
                began = time.perf_counter()
                self._record_position()  # asking for this part: done with the one before
                got = read_handed_part(self._source, step, self._part_next)
                seal = None if got is not None else self._source.read_seal(step)
                if seal is not None and got is None:
                    # Committed before its seal, the part may have come between the two
                    # reads: look again before calling it missing.
                    got = read_handed_part(self._source, step, self._part_next)
                if got is not None:
                    info, frame = got
                    self._check_run(step, info, frame)
                    self._check_keys(seal, rank, (info.index, info.key))
                    # A step read whole by wait_next() is another run's (or stale): the
                    # receiver goes through this one's parts, and never returns it after.
                    self._peeked = None
                    decode_as, make = part_types(self._type)
                    seconds = {
                        "read": time.perf_counter() - began,
                        "decompress": 0.0,
                        "decode": 0.0,
                    }
                    try:
                        columns = self._as_columns if as_columns is None else as_columns
                        samples = yield from self._decode(frame, seconds, columns, decode_as)
                        value = make(samples)
                        yield from self._check(value, step)
                    except RlwireError as exc:
                        where = self._source.describe_part(step, info.index)
                        exc.add_context(where=where, step=step, rank=rank)
                        raise
                    self._take_from_here()
                    self._next_step, self._part_next = step, self._part_next + 1
                    self._keys_handed().note(step, info.index, info.key)
                    stats = received(step, rank, frame.nbytes, frame.message_id, seconds, started)
                    self._last_stats = stats
                    self._step_stats = parts_added(self._step_stats, stats, info.index)
                    return Part(step, info.key, info.rank, info.index, value, frame.message_id)
                if seal is not None:
                    self._check_sealed_run(step)
                    self._check_keys(seal, rank)
                    count = len(seal.keys[rank]) if rank < seal.ranks else 0
                    if self._part_next >= count:
                        self._peeked = None  # (as above: past the step)
                        self._step, self._next_step, self._part_next = step, step + 1, 0
                        self._record_position()  # past its last part: past the step, now
                        stats = parts_ended(self._step_stats, step, rank, started)
                        self._last_stats, self._step_stats = stats, None
                        return _DONE
                    raise CorruptFrameError(
                        f"part {self._part_next} of rank {rank} is missing; the seal lists "
                        f"{count} parts",
                        where=self._source.describe_part(step, self._part_next),
                    )
                if self._part_next:
                    self._check_waiting_run(step)
                    return _NOTHING
            finally:
                held.release()
        if self._part_next:
            return _NOTHING
        return (yield from self._take_whole(as_columns, started))

    def _keys_handed(self) -> HandedKeys:
        if self._handed_keys is None:
            self._handed_keys = HandedKeys()
            self._handed_keys.resumed(*self._resumed_at)  # those handed out before a resume
        return self._handed_keys

    def _check_keys(
        self, seal: Seal | None, rank: int, extra: tuple[int, Key] | None = None
    ) -> None:
        """Refuse the step once its seal (``None``: not read yet, nothing to check)
        contradicts the key of a part handed out of it (or of ``extra``, the one about
        to be): a corrupt or forged step, unless the step was sent again meanwhile
        (another run, whose seal this is).

        Raises:
            StepGapError: the seal is of another run than the parts handed out.
            CorruptFrameError: the seal lists another key at a part's index, or fewer
                parts than were handed out.
        """
        if seal is None:
            return
        handed, source = self._keys_handed(), self._source
        refused = handed.refused(seal, rank, source.describe_part, extra, source.part_key)
        if refused is not None:
            self._check_sealed_run(seal.step)
            raise refused

    def _take_whole(self, as_columns: bool | None, started: float) -> Sliced[Any]:
        """The next step as one part (``key`` ``None``) if it was sent whole, or
        ``_NOTHING``; a step sealed since :meth:`_take_part` looked for its parts is read
        part by part."""
        rank = self._rank or 0
        if self._source.stores_parts:
            held = Held(self._mutex)
            try:
                yield from held.take()
                if self._peeked is None:
                    self._peeked = self._read()
                there, sealed_since = self._peeked is not None, _holds_sealed(self._peeked)
            finally:
                held.release()
            if sealed_since:
                # Its parts and seal were committed after the reads above: read it part
                # by part (its parts are all there now), never joined as one part.
                return (yield from self._take_part(as_columns, started))
            if not there:
                return _NOTHING
        whole = yield from self._take(started, as_columns)
        if whole is _NOTHING:
            return _NOTHING
        # The step taken: a source handed messages may go on past a gap it said.
        stats = self._last_stats
        return Part(stats.step, None, rank, 0, whole, stats.message_id)

    def _decode_sealed(
        self, sealed: SealedStep, seconds: dict[str, float], as_columns: bool
    ) -> Sliced[Any]:
        """The receiver's object of a sealed step: its parts' samples, joined (as one
        Columns with ``as_columns``, :mod:`rlwire._api.joined_parts`)."""
        decode_as, make = part_types(self._type)
        got = []
        for _, frame in sealed.parts:
            got.append((yield from self._decode(frame, seconds, as_columns, decode_as)))
        if as_columns:
            return make((yield from joined_columns(got, writable=self._writable)))
        return make([sample for samples in got for sample in samples])


def _holds_sealed(peeked: Any) -> bool:
    """Whether a step read whole (``(step, frame)``, its frame maybe wrapped with the
    fields appended to it) is a step filled part by part and sealed."""
    if not isinstance(peeked, tuple):
        return False
    return isinstance(getattr(peeked[1], "inner", peeked[1]), SealedStep)
