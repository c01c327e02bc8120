"""What a step filled part by part is to a sink and a source: a part's place and key
(:class:`PartInfo`) and the seal that closes the step (:class:`Seal`).

A part is one message of a step, for one rank, committed on its own; its ``key``
(given by the producer) is unique within the step, and its ``index`` is its place among
its rank's parts, in commit order (0, 1, ...). The seal is written last and lists, for
every rank, the keys of its parts in that order, so a reader knows how many to wait for.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar, Union

import anyio
from anyio import CapacityLimiter

from rlwire._core.errors import ConfigError
from rlwire._core.offload import offload
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import Frame

__all__ = ["MAX_KEY_LENGTH", "Key", "PartInfo", "PartsSink", "PartsSource", "Seal", "check_key"]

#: What a producer names a part by: a string or an integer, unique within its step.
Key = Union[str, int]  # noqa: UP007 (a runtime alias, also used with isinstance)

#: The longest string key, in characters.
MAX_KEY_LENGTH = 1024
_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what msgpack carries


def check_key(key: object) -> Key:
    """``key`` if it can name a part, else ConfigError.

    Example:
        >>> check_key("group-7"), check_key(7)
        ('group-7', 7)
    """
    if isinstance(key, str) and 0 < len(key) <= MAX_KEY_LENGTH:
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: the store writes keys as UTF-8
            raise ConfigError(
                f"a part's key must be encodable as UTF-8, got {key!r} ({e.reason} at "
                f"character {e.start})"
            ) from None
        return key
    if isinstance(key, int) and not isinstance(key, bool) and _INT_RANGE[0] <= key <= _INT_RANGE[1]:
        return key
    raise ConfigError(
        f"a part's key must be a non-empty string of at most {MAX_KEY_LENGTH} characters or "
        f"an integer that fits 64 bits, got {key!r}"
    )


@dataclass(frozen=True)
class PartInfo:
    """A committed part as the store records it beside its message.

    Attributes:
        rank: the rank it is for.
        index: its place among the rank's parts of the step, from 0, in commit order.
        key: the producer's key, unique within the step.
        cost: what it weighed when it was assigned (tokens, by default).
        of: the :attr:`~rlwire.Frame.message_id` of its rank's part 0 of the step,
            which it follows (a part of another run of the step follows another);
            ``None`` where the store does not say (part 0 of a store, a part
            written before format 1.6, ZeroMQ).
    """

    rank: int
    index: int
    key: Key
    cost: float
    of: bytes | None = None

    def named(self, step: int) -> str:
        """This part of ``step`` as errors name it.

        Example:
            >>> PartInfo(rank=1, index=0, key="b", cost=3.0).named(7)
            "step 7, rank 1, part 0 (key 'b')"
        """
        return f"step {step}, rank {self.rank}, part {self.index} (key {self.key!r})"


@dataclass(frozen=True)
class Seal:
    """The record that closes a step filled part by part.

    Attributes:
        step: the step.
        keys: for each rank, the keys of its parts in commit order (the final
            assignment); a rank with no parts has an empty tuple.
        costs: for each rank, the cost of each of its parts, in the same order.
    """

    step: int
    keys: tuple[tuple[Key, ...], ...]
    costs: tuple[tuple[float, ...], ...]

    @property
    def ranks(self) -> int:
        """How many ranks the step was assigned to."""
        return len(self.keys)


class PartsSink:
    """What a :class:`~rlwire.abc.Sink` offers for steps filled part by part; by
    default, nothing (:attr:`stores_parts` is False, and every method raises
    ConfigError naming the sink). The stored sinks (files, fsspec) and ``ray://`` store
    parts."""

    #: The sink can store a step part by part; a sender refuses ``open_step`` on any other.
    stores_parts: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A plugin written for an earlier rlwire overrides committed_parts(step): it checks no
        # ranks, and is called as before.
        old = cls.__dict__.get("committed_parts")
        if old is not None and "ranks" not in inspect.signature(old).parameters:

            def committed_parts(
                self: PartsSink, step: int, ranks: int | None = None
            ) -> list[PartInfo]:
                found: list[PartInfo] = old(self, step)
                return found

            cls.committed_parts = committed_parts  # type: ignore[method-assign]

    def check_ranks(self, step: int, ranks: int) -> None:
        """Refuse to send ``step`` (whole, or filled part by part) to ``ranks`` ranks,
        before the sender waits for room for it (``max_ahead``) or writes anything; it
        runs in the event loop, so it must not block. Accepts any by default.

        Raises:
            StepExistsError: the stored sinks, opened with ``on_existing="resume"``:
                ``step`` is the first after the one they resumed after, sent whole,
                which lacks one of ``ranks`` (a commit cut short).
        """
        del step, ranks  # any will do

    def committed_parts(self, step: int, ranks: int | None = None) -> list[PartInfo]:
        """The parts of ``step`` committed so far, in any order: what a producer that
        opens the step again (after a crash, ``on_existing="resume"``) must not put
        again. Removes what a killed commit of a part left behind. ``ranks``: those the
        step is opened for (None: asked again, after an error).

        Raises:
            CorruptFrameError: a stored part is garbled.
            StepExistsError: the step is sealed already, or was sent whole; or it is the
                first a resumed sender sends and the step before it, sent whole, lacks
                one of ``ranks`` (a commit cut short).
            TransportError: the destination cannot be read.
            ConfigError: the sink cannot store parts (the default).
        """
        raise ConfigError(f"{type(self).__name__} cannot store a step part by part")

    def stage_part(self, step: int, part: PartInfo, frame: Frame | Sliced[Frame]) -> Sliced[Any]:
        """Write one part of ``step`` where readers cannot see it yet, as ``stage``
        writes a rank's message (``frame`` as there, taken with ``take_frame``), and
        return its :class:`~rlwire.abc.Staged`: committing it makes the part visible.

        Raises:
            StepExistsError: a part with the same rank and index exists.
            TransportError: the destination cannot be written.
            ConfigError: the sink cannot store parts (the default).
        """
        raise ConfigError(f"{type(self).__name__} cannot store a step part by part")

    def seal(self, seal: Seal) -> None:
        """Close a step filled part by part: write ``seal`` whole, after every part it
        lists is committed.

        Raises:
            StepExistsError: the step is sealed already.
            TransportError: the seal cannot be written.
            ConfigError: the sink cannot store parts (the default).
        """
        raise ConfigError(f"{type(self).__name__} cannot store a step part by part")

    async def aseal(self, seal: Seal, limiter: CapacityLimiter) -> None:
        """:meth:`seal` in a worker thread, shielded."""
        with anyio.CancelScope(shield=True):
            await offload(self.seal, seal, limiter=limiter)


class PartsSource:
    """What a :class:`~rlwire.abc.Source` offers for steps filled part by part; by
    default, nothing: :attr:`stores_parts` is False and :meth:`read_seal` finds none."""

    #: The source reads steps filled part by part.
    stores_parts: ClassVar[bool] = False

    def moved_to(self, step: int) -> int:
        """The step a read of ``step`` goes on with: ``step`` (the default), unless this
        source is handed messages (a socket) and said ``step`` never comes, with those
        up to the one returned (a :class:`~rlwire.errors.StepGapError`, once): then the
        step after them. :meth:`~rlwire.abc.Source.read_next` returns a whole one with
        its number; the parts and seal of one filled part by part are read under the
        number returned here, which the receiver takes as its next step, skipped to or
        not."""
        return step

    def read_part(self, step: int, index: int) -> tuple[PartInfo, Frame] | None:
        """This rank's part ``index`` of ``step`` (its place in commit order, from 0) if
        it is visible, else ``None``; never blocks.

        Raises:
            CorruptFrameError: the stored part is truncated or garbled.
            ConfigError: the source cannot read parts (the default).
        """
        raise ConfigError(f"{type(self).__name__} cannot read a step part by part")

    def part_key(self, step: int, index: int) -> Key | None:
        """The key of this rank's part ``index`` of ``step`` as stored now, which a
        receiver resumed past it checks against the step's seal; ``None`` if it is not
        there, or the source cannot tell (the default: the receiver then checks only
        that the seal lists the part). A stored source reads its envelope only.

        Raises:
            CorruptFrameError: the stored part is garbled.
        """
        del step, index
        return None

    def read_seal(self, step: int) -> Seal | None:
        """The seal of ``step`` if it was filled part by part and is sealed, else
        ``None`` (always, for a source that cannot read parts).

        Raises:
            CorruptFrameError: the seal is garbled.
        """
        del step
        return None

    def first_part(self, step: int) -> bytes | None:
        """The :attr:`~rlwire.Frame.message_id` of this rank's part 0 of ``step`` as
        stored now (on ``ray://``, the run the board names for the step's parts): which
        run of the step is there, what a receiver that went through the
        step's parts checks before it takes a seal as their end. ``b""``: the rank has
        no part 0 (none of the step, or none for the rank); ``None``: the source cannot
        tell (the default), and the receiver checks nothing. Never blocks.

        Raises:
            CorruptFrameError: part 0's envelope is garbled.
            TransportError: the store cannot be read.
        """
        del step
        return None
