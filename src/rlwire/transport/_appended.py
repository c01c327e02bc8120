"""What fields appended to a committed step (``sender.add_fields``) are to a sink and a
source: :class:`FieldsSink` and :class:`FieldsSource`, bases of
:class:`~rlwire.abc.Sink` and :class:`~rlwire.abc.Source`.

A call of ``add_fields`` stores one message of its own per step and rank (the codec's
business what it holds: rlwire's msgpack codec writes ``{"fields": Columns}``), beside
the step, committed atomically: the ``n``-th such message of a step and rank is
visible whole or not at all, and only after the ``n - 1`` before it. A sink that keeps
committed steps (a store, ``ray://``) says so with :attr:`FieldsSink.appends_fields`
and implements the methods below; its source reads those messages back with
:meth:`FieldsSource.read_appended`. By default neither does (a socket hands a step over
and forgets it).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from rlwire._core.errors import ConfigError
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selector

__all__ = ["FieldsSink", "FieldsSource", "no_such_rank", "step_replaced"]


def no_such_rank(step: int, rank: int, ranks: int) -> str:
    """Why ``add_fields`` refuses ``rank`` of a committed ``step`` of ``ranks`` ranks,
    all below it: the fields would belong to no receiver's step.

    Example:
        >>> no_such_rank(3, 5, 2), no_such_rank(3, 1, 1)
        ('step 3 has 2 ranks (0-1), not rank 5', 'step 3 has 1 rank (0), not rank 1')
    """
    which = "rank (0)" if ranks == 1 else f"ranks (0-{ranks - 1})"
    return f"step {step} has {ranks} {which}, not rank {rank}"


def step_replaced(step: int, sent_again: bool) -> str:
    """Why ``add_fields`` refuses, or reports void, fields checked against ``step``'s
    message: the step was deleted since (and ``sent_again``: a new step of that number
    was written), so they belong to no receiver's step.

    Example:
        >>> step_replaced(3, False)
        'step 3 was deleted since its message was read to check the fields against it'
    """
    again = " and sent again (another run)" if sent_again else ""
    return (
        f"step {step} was deleted{again} since its message was read to check the fields against it"
    )


class FieldsSink:
    """What a :class:`~rlwire.abc.Sink` offers for fields appended to committed steps;
    by default, nothing (:attr:`appends_fields` is False, and every method raises
    ConfigError naming the sink). The stored sinks (files, fsspec) and ``ray://`` do.
    The sender calls these methods from worker threads."""

    #: The sink keeps committed steps, and fields can be appended to them.
    appends_fields: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A plugin written for an earlier rlwire overrides stage_fields(step, rank, frame): it
        # numbers its messages when it stages them, and is called as before.
        old = cls.__dict__.get("stage_fields")
        if old is not None and "names" not in inspect.signature(old).parameters:

            def stage_fields(
                self: FieldsSink,
                step: int,
                rank: int,
                frame: Frame,
                *,
                names: frozenset[str] = frozenset(),
            ) -> Sliced[Any]:
                staged: Sliced[Any] = old(self, step, rank, frame)
                return staged

            cls.stage_fields = stage_fields  # type: ignore[method-assign]

    def _no_fields(self) -> ConfigError:
        return ConfigError(
            f"add_fields needs a destination that keeps steps (files, fsspec/S3, ray://); "
            f"{self!r} keeps none (a socket hands a step over and forgets it)"
        )

    def attach_fields(self) -> None:
        """Make the sink ready to append fields without opening the destination: no
        step is deleted, resumed or truncated, no mark touched (what ``add_fields`` of
        a sender that never opened the sink calls, for a stage that only appends,
        beside a live producer).

        Raises:
            TransportError: the destination cannot be reached.
            ConfigError: the sink cannot append fields (the default), or (``ray://``)
                no sender has made the destination yet.
        """
        raise self._no_fields()

    def read_committed(
        self, step: int, rank: int, select: Selector, *, again: bool = False
    ) -> list[Frame] | None:
        """``rank``'s message of the committed ``step``, as stored: one frame for a step
        sent whole, one per part (in index order) for a sealed step filled part by part;
        ``None`` when the step is not committed (absent, or not sealed yet). The next
        :meth:`stage_fields` of that step and rank ties its message to what was read
        (readers never take it with another message of the step); ``again`` (a retry of
        the same ``add_fields``, another stage having taken its index) keeps the tie of
        the first read, and refuses a step deleted and sent again since. A sink that
        can read part of a message reads only the buffers ``select`` asks for (the
        others empty, :attr:`~rlwire.Frame.missing`) and checks their checksums; any
        other returns them all.

        Raises:
            CorruptFrameError: a stored message is garbled.
            TransportError: the destination cannot be read.
            RlwireError: what ``select`` raises (a field the step does not hold).
            ConfigError: the sink cannot append fields (the default), the step is
                committed for fewer ranks than ``rank + 1`` (the fields would belong
                to no receiver's step: :func:`no_such_rank` says so), or (``again``)
                it is not the one the first read found (:func:`step_replaced`).
        """
        raise self._no_fields()

    def read_appended(self, step: int, rank: int) -> list[Frame]:
        """The messages of fields appended to ``step`` for ``rank`` so far, in the
        order they were committed, each read whole and checked.

        Raises:
            CorruptFrameError: one is garbled, or not of this step and rank.
            TransportError: the destination cannot be read.
            ConfigError: the sink cannot append fields (the default).
        """
        raise self._no_fields()

    def stage_fields(
        self, step: int, rank: int, frame: Frame, *, names: frozenset[str] = frozenset()
    ) -> Sliced[Any]:
        """Write ``frame`` where readers cannot see it yet as the next message of fields
        appended to ``step`` for ``rank``, and return its :class:`~rlwire.abc.Staged`:
        committing it makes the message visible, whole, after those before it. If the
        generator is closed before it returns, or raises, nothing is left behind.

        ``names`` are the fields the message holds (``add_fields`` passes them). A sink
        that numbers the messages itself at their commit, atomically (``ray://``: its
        board), refuses there a message holding a field another writer appended
        meanwhile, and lets writers appending other fields at once all commit; one that
        names a message by its index when staging it (files, S3) gives it the index
        after the messages its last :meth:`read_appended` of the step and rank read
        (those the fields were checked against), and raises StepExistsError when
        another writer took that index (from the commit, or at once when it is taken
        already): the sender checks the fields again and tries again, for as long as
        other writers append.

        Raises:
            ConfigError: ``step`` is not committed; the sink cannot append fields (the
                default).
            StepExistsError: another writer appended to the step and rank meanwhile
                (from the commit), or the step holds as many appended messages as the
                sink allows.
            SchemaError: (from the commit, a sink that numbers messages at their
                commit) another writer appended a field of ``names`` meanwhile.
            TransportError: the destination cannot be written.
        """
        raise self._no_fields()


class FieldsSource:
    """What a :class:`~rlwire.abc.Source` offers for fields appended to committed steps;
    by default, nothing: :attr:`appends_fields` is False and :meth:`read_appended`
    finds none."""

    #: The source reads fields appended to its steps.
    appends_fields: ClassVar[bool] = False

    def read_appended(self, step: int) -> list[Frame]:
        """The messages of fields appended to ``step`` for this rank so far, in commit
        order, each read whole and checked; never blocks. (Always none, for a source
        whose sink cannot append fields.)

        Raises:
            CorruptFrameError: one is garbled, or not of this step and rank.
            TransportError: the store cannot be read.
        """
        del step
        return []

    def appended_still_tied(self, step: int) -> bool:
        """Whether the messages the last :meth:`read_appended` of ``step`` returned are
        still tied to the step's message as stored: False when the step was deleted and
        written again since (the reader then reads both again). True for a source that
        does not tie them (the default).

        Raises:
            CorruptFrameError: the step's message is garbled.
            TransportError: the store cannot be read.
        """
        del step
        return True

    def expect_fields(self, step: int, count: int) -> None:
        """The receiver found ``count`` messages of fields appended to ``step`` and
        needs a field none of them holds: the next :meth:`~rlwire.abc.Source.wait`
        (or ``await_message``) should return once another one is appended (it may
        return sooner). Sources that poll need do nothing (the default)."""
        del step, count
