"""What a sender opened with ``on_existing="resume"`` knows of the steps it goes on
after: how many ranks each was sent to, which its messages record (1.8, the envelope's
``ranks``), and, for steps of an older writer that record none, the steps sent whole
that a commit cut short may have left visible for their first ranks only (on S3 without
sidecars nothing of the other ranks is listed, so
:func:`~rlwire.transport._stored.names.start_step` takes such a step for a step of fewer
ranks, and the first step sent for more ranks is refused)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, Protocol, cast

from rlwire._core.args import MAX_STEP
from rlwire._core.errors import CorruptFrameError, StepExistsError
from rlwire.transport._base import OnExisting
from rlwire.transport._stored.marks import MAX_MARK_BYTES
from rlwire.transport._stored.names import MAIN_RE, SEAL_RE, STORED_RE, main_name
from rlwire.transport._stored.parts import head_envelope

__all__ = [
    "HEADS_AT_ONCE",
    "ReadSentTo",
    "ResumedSink",
    "SentTo",
    "Trail",
    "check_ranks_after",
    "orphan_sidecars",
    "stored_widths",
    "whole_before",
]

#: The steps sent whole that a step follows: ``(first, last, ranks)``, the steps
#: ``first..last`` each visible for ``ranks``.
Trail = tuple[int, int, frozenset[int]]
#: ``sent_to(step, rank)``: how many ranks ``step`` was sent to, as ``rank``'s message
#: of it records (``None``: an older writer recorded nothing).
SentTo = Callable[[int, int], "int | None"]
#: A file's first bytes (None: no such file), or the error reading them raised.
_Head = bytes | bytearray | memoryview | None
#: How many steps' heads a resumed open asks a store for in one call
#: (:meth:`ReadSentTo.every`; S3 keeps s3fs's ``max_concurrency`` of them in flight): a
#: bound on the bytes held at once (``MAX_MARK_BYTES`` each, 1 MiB in all) however many
#: steps are stored.
HEADS_AT_ONCE = 256
#: Ranks are counted in int64 (a stored file of rank ``2**63 - 1`` would make a width
#: of ``2**63``).
_MAX_RANK = 2**63 - 1


def whole_before(names: Iterable[str], step: int) -> Trail | None:
    """The steps sent whole right before ``step``, back to the first of them visible for
    the same ranks as the step before ``step`` (None: that step was not sent whole, or
    ``step`` is the first).

    Example:
        >>> whole_before(["step-00000001.rank-0000.rlw", "step-00000002.rank-0000.rlw"], 3)
        (1, 2, frozenset({0}))
    """
    mains: dict[int, set[int]] = {}
    for name in names:
        if m := MAIN_RE.fullmatch(name):
            mains.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    have = mains.get(step - 1)
    if have is None:
        return None
    first = step - 1
    while mains.get(first - 1) == have:
        first -= 1
    return first, step - 1, frozenset(have)


def stored_widths(
    names: Iterable[str],
    step: int,
    sealed_for: Callable[[int], int] | None = None,
    locate: Callable[[str], str] = str,
) -> list[tuple[int, int | None]]:
    """The steps stored before ``step``, from the oldest, as ``(step, ranks)`` where
    their width changes: the ranks a step sent whole is visible for (rank 0 up; a
    resumed open has refused a step cut short), for a step filled part by part the
    ranks its seal counts (``sealed_for(step)``: each of them reads it), ``None`` where
    that is not known (every rank: no ``sealed_for``, a seal gone or garbled) or for a
    step missing. Time and memory go with the steps stored, however far past them
    ``step`` is (an end mark may put it there).

    Raises:
        CorruptFrameError: a stored file's name (named, ``locate(name)``) gives a step
            past :data:`~rlwire._core.args.MAX_STEP` or a rank past int64, which no
            sender writes.

    Example:
        >>> stored_widths(["step-00000003.rank-0000.rlw", "step-00000003.rank-0001.rlw",
        ...                "step-00000004.rank-0000.rlw", "step-00000005.seal.rlw"], 6)
        [(3, 2), (4, 1), (5, None)]
    """
    ranks: dict[int, int | None] = {}
    for name in names:
        if m := MAIN_RE.fullmatch(name):
            at, rank = _numbers(name, int(m.group(1)), int(m.group(2)), locate)
            ranks[at] = max(ranks.get(at) or 0, rank + 1)
        elif m := SEAL_RE.fullmatch(name):
            at, _ = _numbers(name, int(m.group(1)), 0, locate)
            ranks[at] = _sealed(sealed_for, at)
    runs: list[tuple[int, int | None]] = []

    def run(at: int, width: int | None) -> None:
        if not runs or runs[-1][1] != width:
            runs.append((at, width))

    # The steps stored, not every number up to ``step``: an end mark far past them (a
    # stream finished after a truncate to a far start_step) would make that billions.
    after: int | None = None  # the step after the last one stored seen
    for at in sorted(at for at in ranks if at < step):
        if after is not None and at > after:
            run(after, None)  # the steps between are missing
        run(at, ranks[at])
        after = at + 1
    if after is not None and after < step:
        run(after, None)
    return runs


def _numbers(name: str, step: int, rank: int, locate: Callable[[str], str]) -> tuple[int, int]:
    """``(step, rank)``, the numbers the stored file ``name`` gives, checked."""
    if step > MAX_STEP or rank >= _MAX_RANK:
        raise CorruptFrameError(
            f"not a file a sender writes: its name gives step {step}, rank {rank} (steps "
            f"go up to {MAX_STEP}, ranks below {_MAX_RANK}); delete it to resume",
            where=locate(name),
        )
    return step, rank


def _sealed(sealed_for: Callable[[int], int] | None, step: int) -> int | None:
    try:
        return (sealed_for(step) or None) if sealed_for is not None else None
    except CorruptFrameError:  # its receivers are told; a resumed sender counts every rank
        return None


def check_ranks_after(where: str, before: Trail, ranks: int) -> None:
    """Refuse the first step a resumed sender sends to ``ranks`` ranks when the steps
    ``before`` it (:func:`whole_before`), written by a writer that did not record how
    many ranks they were sent to, lack one of them: a sender killed while committing
    the first of them made it visible for its first ranks only (and a resumed one may
    have sent on to those ranks only), or they were sent to fewer ranks. The message
    names both ways on: the repair (deleting them all, from the first) for the one, a
    truncate past them (keeping them, unchecked) for the other."""
    first, last, have = before
    if set(range(ranks)) <= have:
        return
    if first == last:
        what = f"step {first} has ranks {sorted(have)} only, and it"
        they, them = "it was", "it"
    else:
        what = f"steps {first}..{last} have ranks {sorted(have)} only, and step {first}"
        they, them = "they were", "them"
    raise StepExistsError(
        f"cannot send step {last + 1} to {ranks} ranks after resuming: {what} may be a step "
        "of more ranks cut short (a sender killed while committing it), which the "
        "receivers of the other ranks would never get; steps written by rlwire before "
        "wire format 1.8 do not record how many ranks they were sent to, so it cannot be "
        f"told from a step sent to fewer. If it was cut short, open the sender with "
        f"start_step={first}, on_existing='truncate' to delete step {first} and every "
        f"later one, then send from step {first} again; if {they} sent to fewer ranks on "
        f"purpose (a restart with more ranks), open it with start_step={last + 1}, "
        f"on_existing='truncate', which keeps {them} and goes on",
        where=where,
    )


def orphan_sidecars(names: Iterable[str], first: int) -> list[str]:
    """The sidecar files among ``names`` of steps from ``first`` on: a sender killed
    while committing such a step (no main file is there, or ``first`` would be later)
    left them, and a commit never replaces a file."""
    out = []
    for name in names:
        m = STORED_RE.fullmatch(name)
        if m and m.group(3) and int(m.group(1)) >= first:
            out.append(name)
    return sorted(out)


class _Store(Protocol):
    """What of a :class:`~rlwire.transport._stored.sink.StoredSink` this module uses."""

    heads_cheap: ClassVar[bool]

    def load_head(self, name: str, size: int) -> _Head: ...
    def load_heads(self, names: Sequence[str], size: int) -> Sequence[_Head | Exception]: ...
    def sent_to(self, step: int, rank: int) -> int | None: ...
    def sent_to_many(self, keys: Sequence[tuple[int, int]]) -> list[int | None]: ...
    def locate(self, name: str | None = None) -> str: ...
    def errors(
        self, action: str, name: str | None = None
    ) -> contextlib.AbstractContextManager[None]: ...


class ResumedSink:
    """The part of a stored sink that checks the step sent first after ``"resume"``."""

    #: The steps ``"resume"`` goes on after, sent whole by a writer that did not record
    #: their ranks, and their visible ranks: the step after them is refused if it has a
    #: rank more (:func:`check_ranks_after`). None: nothing to check.
    resumed_after: Trail | None = None
    #: Whether reading the head of every step's message costs little (local files, or
    #: a store that reads many at once, :meth:`load_heads`): ``"resume"`` then reads how
    #: many ranks each step was sent to, not only the first and last of each run of
    #: steps visible for the same ranks.
    heads_cheap: ClassVar[bool] = False

    def load_heads(self, names: Sequence[str], size: int) -> Sequence[_Head | Exception]:
        """At most the first ``size`` bytes of each of the files ``names`` (``None``: no
        such file), how a resumed open reads every step's envelope: a store whose reads
        are requests makes them concurrently. The error a read raised is returned in its
        place (the caller names its file). By default
        :meth:`~rlwire.transport._stored.sink.StoredSink.load_head` of each in turn."""
        store = cast(_Store, self)
        out: list[_Head | Exception] = []
        for name in names:
            try:
                out.append(store.load_head(name, size))
            except Exception as exc:
                out.append(exc)
        return out

    def sent_to(self, step: int, rank: int) -> int | None:
        """How many ranks ``step``, sent whole, was sent to, as the envelope of
        ``rank``'s main file of it records (None: written before 1.8, gone, or not
        readable as that message: a damaged step is its receivers' to skip, and tells
        a resumed sender as little as one of an older writer).

        Raises:
            TransportError: it cannot be read.
        """
        store = cast(_Store, self)
        name = main_name(step, rank)
        return _recorded(store, name, step, rank, lambda size: _read(store, name, size))

    def sent_to_many(self, keys: Sequence[tuple[int, int]]) -> list[int | None]:
        """:meth:`sent_to` of each ``(step, rank)`` of ``keys``, their heads read at once
        (:meth:`load_heads`); again, alone, only an envelope longer than the bytes read.

        Raises:
            TransportError: one cannot be read (the first such, named).
        """
        store = cast(_Store, self)
        names = [main_name(step, rank) for step, rank in keys]
        heads = store.load_heads(names, MAX_MARK_BYTES)
        out = []
        for (step, rank), name, head in zip(keys, names, heads, strict=True):
            if isinstance(head, Exception):
                with store.errors("read", name):
                    raise head
            out.append(_recorded(store, name, step, rank, _ahead(store, name, head)))
        return out

    def resuming(self, names: list[str], step: int, sent_to: SentTo) -> None:
        """Note what the first step sent, ``step``, must be checked against: the steps
        before it, unless the messages of the first and last of them record their ranks
        (then :func:`~rlwire.transport._stored.names.start_step` checked them whole)."""
        trail = whole_before(names, step)
        if trail is not None:
            first, last, have = trail
            if None not in (sent_to(first, min(have)), sent_to(last, min(have))):
                trail = None
        self.resumed_after = trail

    def reading_sent_to(self) -> ReadSentTo:
        """:meth:`sent_to`, each step's answer read once (an open asks twice)."""
        return ReadSentTo(cast(_Store, self))

    def check_ranks(self, step: int, ranks: int) -> None:
        """Refuse ``step`` for ``ranks`` ranks if it is the first after the steps
        ``"resume"`` went on after and those lack one (:func:`check_ranks_after`)."""
        before = self.resumed_after
        if before is not None and step == before[1] + 1:
            check_ranks_after(cast(_Store, self).locate(), before, ranks)


class ReadSentTo:
    """A store's :meth:`ResumedSink.sent_to`, each answer read once; :meth:`every`
    reads those of every step stored, many at once."""

    def __init__(self, store: _Store) -> None:
        self._store = store
        self._known: dict[tuple[int, int], int | None] = {}

    def __call__(self, step: int, rank: int) -> int | None:
        key = (step, rank)
        if key not in self._known:
            self._known[key] = self._store.sent_to(step, rank)
        return self._known[key]

    def every(self, names: Iterable[str], on_existing: OnExisting) -> bool:
        """Whether :func:`~rlwire.transport._stored.names.start_step` asks for every
        step's ranks (the store's ``heads_cheap``); if so and ``on_existing`` is
        ``"resume"``, those of the steps ``names`` holds sent whole, each read from its
        lowest visible rank's message, are read first, :data:`HEADS_AT_ONCE` at a time.

        Raises:
            TransportError: one cannot be read.
        """
        if not self._store.heads_cheap:
            return False
        if on_existing == "resume":
            lowest: dict[int, int] = {}
            for name in names:
                if m := MAIN_RE.fullmatch(name):
                    step, rank = int(m.group(1)), int(m.group(2))
                    lowest[step] = min(rank, lowest.get(step, rank))
            keys = [key for key in sorted(lowest.items()) if key not in self._known]
            for at in range(0, len(keys), HEADS_AT_ONCE):
                batch = keys[at : at + HEADS_AT_ONCE]
                self._known.update(zip(batch, self._store.sent_to_many(batch), strict=True))
        return True


def _read(store: _Store, name: str, size: int) -> _Head:
    with store.errors("read", name):
        return store.load_head(name, size)


def _ahead(store: _Store, name: str, head: _Head) -> Callable[[int], _Head]:
    """``load_head(size)`` of the file ``name`` whose first ``MAX_MARK_BYTES`` were read
    ahead as ``head``: a longer read is made anew."""
    return lambda size: head if size <= MAX_MARK_BYTES else _read(store, name, size)


def _recorded(
    store: _Store, name: str, step: int, rank: int, load: Callable[[int], _Head]
) -> int | None:
    """The ranks ``step``'s message of ``rank``, the file ``name``, records
    (:meth:`ResumedSink.sent_to`), its head read with ``load(size)``."""
    try:
        env = head_envelope(load, store.locate(name))
    except CorruptFrameError:
        return None
    if env is None or (env.step, env.rank, env.part) != (step, rank, None):
        return None
    return env.ranks
