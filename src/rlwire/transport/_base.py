"""What every sink and source provides. Transport never imports codecs."""

from __future__ import annotations

import abc
import time
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import anyio
from anyio import CapacityLimiter, to_thread

from rlwire._core.errors import ConfigError
from rlwire._core.offload import drive_sliced, offload
from rlwire._core.plugin_calls import is_plugin
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selector
from rlwire.transport._appended import FieldsSink, FieldsSource
from rlwire.transport._guarded import guard_sink, guard_source, guard_staged
from rlwire.transport._marks import MarksSource
from rlwire.transport._options import SinkOptions, SourceOptions
from rlwire.transport._parts import PartsSink, PartsSource
from rlwire.transport._url import URL

__all__ = [
    "OnExisting",
    "PendingFrame",
    "Sink",
    "Source",
    "Staged",
    "take_frame",
]

#: What a sink does with steps that already exist at its destination when it opens.
OnExisting = Literal["error", "overwrite", "resume", "truncate"]

#: One rank's message as :meth:`Sink.stage` receives it: the :class:`~rlwire.Frame`
#: itself, or a sliced generator that encodes it (what the sender passes, so that only
#: the rank being staged is held encoded in memory). Take it with :func:`take_frame`.
PendingFrame = Frame | Sliced[Frame]


def take_frame(pending: PendingFrame) -> Sliced[Frame]:
    """The frame of one rank, produced in slices if it is still to be encoded.

    A sink's :meth:`~Sink.stage` calls ``frame = yield from take_frame(frames[rank])``
    once per rank, in rank order, when it is ready to write that rank. Errors are those
    of the encoding (``SchemaError``, ``EncodeError``, ...), raised from that point.

    Example:
        >>> from rlwire import Frame
        >>> from rlwire.aio import run_sliced
        >>> from rlwire.transport import take_frame
        >>> run_sliced(take_frame(Frame(b"hdr"))).header
        b'hdr'
    """
    if isinstance(pending, Frame):
        return pending
    return (yield from pending)


class Staged(abc.ABC):
    """A step written in full but not yet visible to any reader."""

    #: True once any rank's main message may be visible to readers. A sender then counts
    #: the step as used even if :meth:`commit` fails, so a retry never reuses its number.
    #: ``None`` when a failed commit cannot tell (the store could not be asked): the
    #: sender then refuses further sends until it is reopened with ``"resume"``. A
    #: commit that raises anything but an rlwire error (:class:`~rlwire.RlwireError`)
    #: is taken to leave it unknown too, unless it set ``visible = True``: the sender
    #: passes that error on as it is, and never assumes nothing was made visible.
    visible: bool | None = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if is_plugin(cls):  # its calls raise rlwire errors only (rlwire.transport._guarded)
            guard_staged(cls)

    def commit(self) -> None:
        """Make the step visible to readers: sidecars first, main messages last, with
        everything that can fail routinely done before the first main message appears.
        Short: safe to run shielded.

        Raises:
            TransportError: the step could not be committed; :attr:`visible` says whether
                some ranks can nevertheless see it.
        """
        raise NotImplementedError(f"{type(self).__name__} commits only asynchronously")

    @abc.abstractmethod
    def discard(self) -> None:
        """Remove everything staged; the step never becomes visible. Idempotent: the
        sender calls it after any failed commit that left nothing visible, even if the
        sink already cleaned up."""

    async def acommit(self, limiter: CapacityLimiter) -> None:
        """What the sender awaits: :meth:`commit` in a worker thread, as one trip of
        :func:`~rlwire._core.offload.drive_sliced`, so that once it starts it finishes
        (a cancellation waits for it), save a read it makes before anything is visible
        (S3's read of the fence), which gives up on a cancelled caller
        (:func:`~rlwire._core.offload.abandoned`): the caller's cancellation is then
        raised, nothing of the step visible. Sinks whose commit waits on the network (a
        socket applying backpressure) override this with a cancellable async version
        that sets :attr:`visible` as soon as any rank may have received its message.
        """
        await drive_sliced(_committing(self), limiter)


class Sink(PartsSink, FieldsSink, abc.ABC):
    """Moves frames to a destination, one step (one frame per rank) at a time.

    Blocking methods are called from worker threads; the ``a``-prefixed methods are what
    the sender awaits, and by default run the blocking ones in threads. A sink found
    through the ``rlwire.sinks`` entry point group (keyed by URL scheme) is built with
    :meth:`from_url`, and its readers with :meth:`open_source`.

    A buffer of a frame may be a :class:`~rlwire.abc.Pieces` (the runs of one buffer, to
    be written back to back with no padding, as the one buffer they join into). A sink
    that writes them itself sets :attr:`gathers`; for any other sink the sender joins
    them first (a copy, in its worker threads), so its frames hold memoryviews only.
    """

    #: The sink writes :class:`~rlwire.abc.Pieces` buffers itself (``writev``, one run
    #: after another). False, the default: the frames it is handed hold memoryviews only.
    gathers: ClassVar[bool] = False

    #: Set by the sync sender before it opens the sink: True when it is opened on a
    #: thread that runs an event loop, which each of its calls then blocks. The sink
    #: must not wait for work of that loop (``ray://`` then puts a step's objects
    #: itself rather than have its board call the producer's actor).
    caller_blocks_loop: bool = False

    #: Set by :meth:`open` with ``"resume"``: the steps kept before the first to send,
    #: as ``(step, ranks)`` where the count of ranks sent the step changes (``None``:
    #: every rank reads it, a step filled part by part). ``max_ahead`` then counts a
    #: rank left out of one as past it. Empty (the default): not known.
    resumed_widths: Sequence[tuple[int, int | None]] = ()

    @classmethod
    def from_url(cls, url: URL, options: SinkOptions) -> Sink:
        """The sink for ``url``, a URL of a scheme this class is registered for, parsed
        once by the registry (``url.rest`` is what follows ``scheme://``).

        Raises:
            ConfigError: the URL or an option is malformed or unknown.
        """
        raise ConfigError(f"{cls.__name__} cannot be opened from a URL ({url!r})")

    @classmethod
    def open_source(cls, url: URL, options: SourceOptions) -> Source:
        """The source that reads what this kind of sink wrote to ``url``.

        Raises:
            ConfigError: the URL or an option is malformed or unknown.
        """
        raise ConfigError(f"{cls.__name__} has no source for {url!r}")

    @abc.abstractmethod
    def open(self, on_existing: OnExisting, start_step: int | None = None) -> int:
        """Prepare the destination and return the first step a new sender should use.

        ``start_step`` is the sender's (``None`` when not given). A store applies the
        ``on_existing`` rules to what it holds and deletes what they say (a
        :class:`~rlwire.transport.layout.StoredSink` does both); a stream starts at
        ``start_step`` or 0.

        Raises:
            StepExistsError: stored steps conflict with ``on_existing``.
            TransportError: the destination cannot be written.
        """

    @abc.abstractmethod
    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        """Write the frame of every rank of ``step`` where readers cannot see it yet.
        If the generator is closed before it returns, or raises, nothing is left behind.

        ``frames[rank]`` is taken with ``frame = yield from take_frame(frames[rank])``,
        once per rank and in rank order. A sink that writes each rank as it is taken and
        then drops the frame holds one rank's encoded message at a time.

        Raises:
            StepExistsError: the step exists at the destination.
            TransportError: the destination cannot be written.
            RlwireError: whatever taking a frame raised (a rank that fails validation or
                encoding), after what was staged for earlier ranks is removed.
        """

    def finish(self, end: int) -> None:
        """Mark the end of the stream: no step at or after ``end`` will come, and
        readers waiting for one get :class:`~rlwire.EndOfStream`. Called once, after the
        last step is committed; a sender opened later with ``"resume"``, ``"truncate"``
        or ``"overwrite"`` removes the mark when it opens.

        Raises:
            TransportError: the mark cannot be written.
        """
        raise ConfigError(f"{type(self).__name__} cannot mark the end of a stream")

    def read_consumption(self, ranks: int, sent: int) -> list[int | None]:
        """For each rank below ``ranks``, the first step its receiver has not moved past
        (its consumption mark), or ``None`` if it has recorded none; what ``keep_last``
        and ``max_ahead`` go by (a step read part by part is moved past once a part
        after its rank's last is asked for). The steps below ``sent`` are those sent so
        far; a mark beyond them (a receiver of the run before a rewrite) is returned.

        Raises:
            CorruptFrameError: a mark is garbled.
            TransportError: the marks cannot be read.
            ConfigError: the sink does not track consumption (the default; streams
                have backpressure of their own).
        """
        raise ConfigError(f"{type(self).__name__} does not track what receivers consumed")

    def consumed(self, ranks: int, sent: int) -> list[int | None]:
        """Deprecated name of :meth:`read_consumption`."""
        warnings.warn(
            "Sink.consumed() is deprecated: call read_consumption()",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.read_consumption(ranks, sent)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A plugin written for an earlier rlwire implements consumed(): it is its read_consumption.
        old = cls.__dict__.get("consumed")
        if old is not None and "read_consumption" not in cls.__dict__:
            warnings.warn(
                f"{cls.__qualname__}.consumed() is deprecated: name it read_consumption()",
                DeprecationWarning,
                stacklevel=2,
            )
            cls.read_consumption = old  # type: ignore[method-assign]
        if is_plugin(cls):  # its calls raise rlwire errors only
            guard_sink(cls, sink=Sink, source=Source, staged=Staged)

    def check_retention(self, keep_last: int | None, max_ahead: int | None) -> None:
        """Refuse retention settings this sink, as configured, cannot work with: the
        sender calls it once, with its ``keep_last`` and ``max_ahead``. Accepts any by
        default.

        Raises:
            ConfigError: an option of the sink needs a setting that is missing.
        """
        del keep_last, max_ahead  # any will do

    def prune(self, below: int) -> int | None:
        """Delete every stored step before ``below``: each step's main files from rank
        0 up, then its sidecars, oldest step first. A sink must keep a step some rank
        holding files of it has not moved past, whatever the ranks of the send that
        prunes (the stores rlwire ships lower ``below`` to the first such step).

        Returns:
            The first step before ``below`` it kept (``below`` if it deleted them all):
            the sender prunes again only once its ``below`` is past it, so a step held
            back is deleted at the first send after its rank moved past it. ``None``
            says nothing (the sender asks again at its next send).

        Raises:
            TransportError: a step cannot be deleted.
            ConfigError: the sink deletes no steps (the default; a sender with
                ``keep_last`` refuses such a sink when it is made).
        """
        raise ConfigError(f"{type(self).__name__} implements no prune(): it deletes no steps")

    async def afinish(self, end: int, limiter: CapacityLimiter) -> None:
        """:meth:`finish` in a worker thread, shielded."""
        with anyio.CancelScope(shield=True):
            await offload(self.finish, end, limiter=limiter)

    def close(self) -> None:
        """Release resources. Sinks that hold none need not override this."""

    async def aopen(
        self, on_existing: OnExisting, limiter: CapacityLimiter, start_step: int | None = None
    ) -> int:
        """:meth:`open` in a worker thread."""
        return await to_thread.run_sync(self.open, on_existing, start_step, limiter=limiter)

    async def aclose(self, limiter: CapacityLimiter) -> None:
        """:meth:`close` in a worker thread, shielded: what was accepted is flushed."""
        with anyio.CancelScope(shield=True):
            await offload(self.close, limiter=limiter)


class Source(PartsSource, FieldsSource, MarksSource, abc.ABC):
    """Reads the frames a :class:`Sink` wrote, for one rank; records how far its
    receiver got (:meth:`mark_consumed`, :meth:`mark_part`, :meth:`read_consumption`).

    Blocking methods may be called from worker threads, one at a time.
    """

    #: Longest wait between two checks for a message, in seconds.
    poll_interval: float = 0.01
    #: True when a message can be read only once, because reading takes it away (a
    #: socket): the receiver then moves past a step that fails to decode or validate
    #: instead of waiting for it again. Stored messages (files, objects) stay put until
    #: the receiver skips them.
    reads_once: bool = False
    #: Set by a receiver opened with ``fields=``: which buffers of a message it needs
    #: (:mod:`rlwire._frame.selection`). A source that can read part of a message reads
    #: the codec header, asks, and reads only those buffers (the frame it returns lists
    #: the others in :attr:`~rlwire.Frame.missing`); any other source ignores it.
    select: Selector | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A plugin written for an earlier rlwire sets consumes: it is its reads_once.
        if "consumes" in cls.__dict__ and "reads_once" not in cls.__dict__:
            warnings.warn(
                f"{cls.__qualname__}.consumes is deprecated: name it reads_once",
                DeprecationWarning,
                stacklevel=2,
            )
            cls.reads_once = bool(cls.__dict__["consumes"])
        if is_plugin(cls):  # its calls raise rlwire errors only
            guard_source(cls)

    @property
    def consumes(self) -> bool:
        """Deprecated name of :attr:`reads_once`."""
        warnings.warn(
            "Source.consumes is deprecated: read reads_once", DeprecationWarning, stacklevel=2
        )
        return self.reads_once

    @abc.abstractmethod
    def read(self, step: int) -> Frame | None:
        """Return the frame of ``step`` if it is complete, else ``None``; never blocks
        waiting for it.

        Raises:
            CorruptFrameError: the stored data is truncated or garbled.
        """

    def read_next(self, step: int) -> tuple[int, Frame] | None:
        """Return ``(step, frame)`` for the next message, or ``None`` if it has not arrived.

        Sources that store steps by number read ``step``. Sources that are handed
        messages (a socket shared by several consumers) return whichever step comes
        next and raise :class:`~rlwire.errors.StepGapError` when one was lost.
        """
        frame = self.read(step)
        return None if frame is None else (step, frame)

    @property
    def interval(self) -> float:
        """How long :meth:`wait` sleeps now: :attr:`poll_interval`, unless the source
        backs off while nothing arrives."""
        return self.poll_interval

    def wait(self, timeout: float | None) -> None:
        """Block until a message may have arrived, or ``timeout`` seconds (``None``: no
        limit) have passed. Polling sources sleep; sources that can be woken override it.
        """
        time.sleep(self.interval if timeout is None else min(timeout, self.interval))

    async def await_message(self, timeout: float | None) -> None:
        """Async :meth:`wait`, without blocking the event loop."""
        await anyio.sleep(self.interval if timeout is None else min(timeout, self.interval))

    def describe(self, step: int) -> str:
        """Names the message of ``step`` in error messages (e.g. its path)."""
        return f"{self!r}: step {step}"

    def describe_part(self, step: int, index: int) -> str:
        """Names this rank's part ``index`` of ``step`` in error messages (its path)."""
        return f"{self.describe(step)} part {index}"

    def close(self) -> None:
        """Release resources. Sources that hold none need not override this."""


def _committing(staged: Staged) -> Sliced[None]:
    """``staged``'s :meth:`~Staged.commit` as one slice (:meth:`Staged.acommit`)."""
    staged.commit()
    return
    yield  # a generator: a trip of drive_sliced
