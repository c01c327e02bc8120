"""Consumption marks and retention, for stores that keep each step as named files.

Each rank's receiver records, in a small mark beside the steps, the first step it has not
moved past (:func:`~rlwire.transport._stored.marks.consumed_mark`). A sender with ``keep_last``
or ``max_ahead`` reads the marks of its ranks before each send, and deletes steps every
rank has moved past; this module holds what the file and fsspec sinks share.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, cast

from rlwire.transport._stored.marks import CONSUMED_MAGIC, MARK_BYTES, parse_mark, too_long
from rlwire.transport._stored.names import (
    FIELDS_RE,
    RANK_FILE_RE,
    SEAL_RE,
    STEP_PART_RE,
    STORED_RE,
    consumed_name,
    seal_name,
)
from rlwire.transport._stored.parts import MAX_SEAL_FILE_BYTES, parse_seal

__all__ = [
    "RetainedSink",
    "held_back",
    "prune_steps",
    "read_consumed",
    "sealed_ranks",
    "steps_to_prune",
]


def read_consumed(
    load: Callable[[str], bytes | bytearray | memoryview | None],
    locate: Callable[[str], str],
    ranks: int,
    sent: int,
) -> list[int | None]:
    """For each rank below ``ranks``, the first step its receiver has not moved past, or
    ``None`` if it has recorded nothing yet. ``load`` returns a file's bytes or
    ``None``; ``locate`` names it for errors.

    A mark beyond ``sent`` (the steps below it are all that were sent) is returned as
    it is: a receiver of the run before a rewrite (``overwrite``, ``truncate``), still
    waiting for a later step, wrote it after the rewrite deleted the marks. Such a rank
    holds ``max_ahead`` back no more, and is never a reason to delete (:func:`held_back`,
    and the sender prunes nothing while one is ahead).

    Raises:
        CorruptFrameError: a mark is garbled.
    """
    found: list[int | None] = []
    for rank in range(ranks):
        name = consumed_name(rank)
        data = load(name)
        if data is None:
            found.append(None)
            continue
        found.append(parse_mark(data, CONSUMED_MAGIC, locate(name)))
    return found


def steps_to_prune(names: Iterable[str], below: int) -> list[list[list[str]]]:
    """The stored steps before ``below``, oldest first, each as the batches of names to
    delete in order: rank 0's main file, the other main files, then the sidecars. A
    deletion cut short then leaves the oldest step without rank 0, which ``resume``
    tells apart from a failed commit (visible from rank 0 up). A step filled part by
    part goes likewise: its seal first, then its parts' main files, then their
    sidecars (cut short, it is the oldest step with parts and no seal, which ``resume``
    passes over too)."""
    steps: dict[int, list[list[str]]] = {}
    for name in names:
        if m := SEAL_RE.fullmatch(name):
            where = 0
        elif m := STORED_RE.fullmatch(name):
            where = 2 if m.group(3) else 0 if int(m.group(2)) == 0 else 1
        elif m := STEP_PART_RE.fullmatch(name):
            where = 2 if m.group(4) else 1
        elif m := FIELDS_RE.fullmatch(name):  # appended fields go first, with the seal
            where = 2 if m.group(4) else 0
        if m and int(m.group(1)) < below:
            steps.setdefault(int(m.group(1)), [[], [], []])[where].append(name)
    return [[sorted(batch) for batch in steps[step]] for step in sorted(steps)]


def held_back(
    names: Sequence[str],
    below: int,
    read: Callable[[int, int], list[int | None]],
    sealed_for: Callable[[int], int],
) -> int:
    """``below`` lowered to the first stored step before it that some rank of it has not
    moved past: every rank with files among the steps to prune is asked, not only those
    of the send that prunes (a send to fewer ranks than an earlier one, or a sender
    resumed after a run with more ranks), and every rank a sealed step's seal counts,
    those without parts of it too (they read it, empty). ``names`` lists the
    destination; ``read(ranks, sent)`` reads the marks of ranks ``0..ranks-1``, as
    :func:`read_consumed` does (``sent``: one past the newest stored step, files or
    seal); ``sealed_for(step)`` says how many ranks the seal of ``step`` counts (0 if
    it is gone), read only for sealed steps before ``below``. A rank with no mark has
    moved past nothing, nor has one whose mark is beyond the stored steps (another
    run's receiver wrote it).

    Raises:
        CorruptFrameError: from ``read``: a garbled mark; from ``sealed_for``: a
            garbled seal.
    """
    held: dict[int, set[int]] = {}  # by rank, the steps before below it is a rank of
    newest = -1  # a step sealed with no part has a seal only: it was sent all the same
    sealed = []
    for name in names:
        if m := SEAL_RE.fullmatch(name):
            newest = max(newest, int(m.group(1)))
            if int(m.group(1)) < below:
                sealed.append(int(m.group(1)))
        elif m := RANK_FILE_RE.fullmatch(name):
            step, rank = int(m.group(1)), int(m.group(2))
            newest = max(newest, step)
            if step < below:
                held.setdefault(rank, set()).add(step)
    for step in sealed:
        for rank in range(sealed_for(step)):
            held.setdefault(rank, set()).add(step)
    if not held:
        return below
    marks = read(max(held) + 1, newest + 1)
    for rank, steps in held.items():
        mark = marks[rank]
        kept = [step for step in steps if mark is None or mark > newest + 1 or step >= mark]
        if kept:
            below = min(below, *kept)
    return below


def prune_steps(
    names: Sequence[str],
    below: int,
    read: Callable[[int, int], list[int | None]],
    sealed_for: Callable[[int], int],
    remove: Callable[[list[str]], None],
    check: Callable[[int], None],
    retire: Callable[[list[str]], None] | None = None,
) -> int:
    """Delete the stored steps before ``below`` that :func:`held_back` lets go (``names``,
    ``read`` and ``sealed_for`` as it takes them), by ``remove``, after ``check(below)``
    (the fence) if there is any; returns the first step kept, as a sink's ``prune``.
    ``retire``, if given, takes the newest such step's files in ``remove``'s place (a
    recycling directory moves them into its pool, to write the next step into).

    Every step's main files go first (seals, main files, parts' and appended fields'
    main files, oldest step first, in :func:`steps_to_prune`'s order), then the marks
    are read again, then the sidecars of the steps they still let go. A trainer
    restarted at a step lowers its mark before it reads anything, and reads a main file
    before its sidecar: one that read a main file before it was deleted had lowered its
    mark before this second read, which keeps the step's sidecars for it (a later prune
    deletes them); one too late finds the main file gone (a step gap). So the newest
    step's sidecars are retired only if the marks read again still let it go (its main
    files were retired before: a recycling sink deletes them, rather than write into
    them, when they do not).
    """
    below = held_back(names, below, read, sealed_for)
    steps = steps_to_prune(names, below)
    if not steps:
        return below
    check(below)
    last = retire or remove
    for i, step in enumerate(steps):
        for batch in step[:2]:
            (last if i == len(steps) - 1 else remove)(batch)
    kept = held_back(names, below, read, sealed_for)
    let_go = steps_to_prune(names, kept)
    for i, step in enumerate(let_go):
        if step[2]:
            (last if kept == below and i == len(let_go) - 1 else remove)(step[2])
    return kept


def sealed_ranks(
    load: Callable[[str], bytes | bytearray | memoryview | None],
    locate: Callable[[str], str],
    step: int,
) -> int:
    """How many ranks the seal of ``step`` counts (each reads the step, with or without
    parts of its own), 0 if it is gone; ``load`` and ``locate`` as for
    :func:`read_consumed`.

    Raises:
        CorruptFrameError: the seal is garbled.
    """
    name = seal_name(step)
    data = load(name)
    if data is None:
        return 0
    return parse_seal(memoryview(data), step=step, where=locate(name)).ranks


class _Store(Protocol):
    """What of a :class:`~rlwire.transport._stored.sink.StoredSink` this module uses."""

    def load_head(self, name: str, size: int) -> bytes | bytearray | memoryview | None: ...
    def locate(self, name: str | None = None) -> str: ...
    def errors(
        self, action: str, name: str | None = None
    ) -> contextlib.AbstractContextManager[None]: ...


class RetainedSink:
    """The part of a stored sink that reads what :func:`held_back` asks: the ranks'
    consumption marks and the ranks a seal counts, each a small file."""

    def load_mark(self, name: str, limit: int, what: str) -> bytes | bytearray | memoryview | None:
        """The file ``name``, a ``what`` (a mark, a seal) of at most ``limit`` bytes, or
        ``None`` if it is not there: no more than ``limit + 1`` bytes of it read.

        Raises:
            CorruptFrameError: it is longer than ``limit``: named, with its size
                (:meth:`size_of`), not read further.
            TransportError: it cannot be read.
        """
        store = cast(_Store, self)
        with store.errors("read", name):
            data = store.load_head(name, limit + 1)
            if data is not None and len(data) > limit:
                raise too_long(what, self.size_of(name), limit, store.locate(name))
        return data

    def size_of(self, name: str) -> int | None:
        """The size of the file ``name`` (``None``: not known, or gone), for the message
        of :meth:`load_mark`; stores that can tell it cheaply say."""
        return None

    def read_consumption(self, ranks: int, sent: int) -> list[int | None]:
        """The marks of ranks ``0..ranks-1``, as :func:`read_consumed` reads them; a
        file at a mark's name longer than a mark is refused by its size (it was read
        up to 4096 bytes, and a 4 GiB one named as 4096 bytes long)."""

        def load(name: str) -> bytes | bytearray | memoryview | None:
            return self.load_mark(name, MARK_BYTES, "consumption mark")

        return read_consumed(load, cast(_Store, self).locate, ranks, sent)

    def sealed_for(self, step: int) -> int:
        """How many ranks the seal of ``step`` counts (0: gone), as :func:`sealed_ranks`
        reads it: whole up to the largest a reader accepts (a seal of many parts read
        as far as a mark was cut short, taken for garbled, and every send of a sender
        with ``keep_last`` after it raised)."""

        def load(name: str) -> bytes | bytearray | memoryview | None:
            return self.load_mark(name, MAX_SEAL_FILE_BYTES, "seal")

        return sealed_ranks(load, cast(_Store, self).locate, step)
