"""Fields appended to a committed step (``sender.add_fields``), in a store: the
:class:`~rlwire.transport._appended.FieldsSink` of
:class:`~rlwire.transport._stored.sink.StoredSink` and the
:class:`~rlwire.transport._appended.FieldsSource` of
:class:`~rlwire.transport._stored.source.StoredSource`.

Each call stores one message of its own per step and rank, beside the step's files:
``step-SSSSSSSS.rank-RRRR.fields-NNN.rlw`` (and ``….fields-NNN.sidecar.rlw`` when it
has a sidecar), ``NNN`` counting from 0 the calls that appended to that step and rank.
It is written and made visible as any message is (temporary name, checksums, sidecar
first, a commit that never replaces a file), so a reader sees the whole call's fields
or none of them; its files say version 1.5
(:data:`~rlwire.transport._stored.layout.FIELDS_VERSION`). Readers find them
by index, as they find parts: 0, 1, … until one is missing. A writer takes the index
after the files it checked its fields against (else StepExistsError: it checks again).

Each is tied to the step's message it was checked against (its envelope's ``of``, that
message's ``id``): readers pass over one whose ``of`` is not the step's as they read it,
and the writer, after its commit, tells its caller when the step's id changed (the file
stays until the step goes: removing it could hide later ones from readers).

The sink reads what ``add_fields`` checks against by prefixes of the step's files (a
sink reads the first bytes of a file, not a range, :mod:`~rlwire.transport._stored.prefixed`):
the envelope and codec header, and only as far as the last buffer the check asks for, so
the rows of a step whose ``token_ids`` come first cost a few pages, not the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from rlwire._core.errors import ConfigError, CorruptFrameError, StepExistsError, TransportError
from rlwire._core.slicing import Sliced
from rlwire._frame.checksums import checksum_segments
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selector
from rlwire.transport._appended import FieldsSink, FieldsSource, no_such_rank, step_replaced
from rlwire.transport._base import Staged
from rlwire.transport._stored.appended_numbers import next_number, without_sidecar
from rlwire.transport._stored.appended_tie import (
    AppendedReader,
    checked_against,
    message_id,
    parse_appended,
    read_appended_message,
    tied,
)
from rlwire.transport._stored.layout import MAX_ENVELOPE, plan
from rlwire.transport._stored.names import (
    fields_name,
    main_name,
    part_name,
    part_sidecar_name,
    seal_name,
    sidecar_name,
)
from rlwire.transport._stored.parts import parse_seal
from rlwire.transport._stored.prefixed import SinkFile, whole_main, whole_side
from rlwire.transport._stored.selected import (
    HEAD_BYTES,
    Ranged,
    WholeFile,
    parse_selected,
    read_envelope,
)

__all__ = ["MAX_APPENDS", "StoredFieldsSink", "StoredFieldsSource"]

#: The most appended-field files one step and rank may hold.
MAX_APPENDS = 1000
#: How many times ``read_committed`` reads a step deleted (and written again) while read.
_READ_TRIES = 3

_Bytes = bytes | bytearray | memoryview


class _Staging(Protocol):
    def add(self, name: str, chunks: Sequence[bytes | memoryview], *, main: bool) -> Sliced[None]:
        raise NotImplementedError


class _Store(Protocol):
    """What of a :class:`~rlwire.transport._stored.sink.StoredSink` this module uses."""

    checksum: bool

    def names(self) -> list[str]: ...
    def load_head(self, name: str, size: int) -> _Bytes | None: ...
    def locate(self, name: str | None = None) -> str: ...
    def errors(
        self, action: str, name: str | None = None
    ) -> contextlib.AbstractContextManager[None]: ...
    def prepare(self) -> None: ...
    def remove(self, names: Sequence[str]) -> None: ...
    def _staged(
        self, step: int, write: Callable[[_Staging], Sliced[None]], fields: str
    ) -> Sliced[Staged]: ...


class _Reader(Protocol):
    """What of a :class:`~rlwire.transport._stored.source.StoredSource` this module uses."""

    rank: int
    verify: bool

    def load(self, name: str) -> memoryview | None: ...
    def open_head(self, name: str) -> Ranged | None: ...
    def locate(self, name: str) -> str: ...
    def _sidecar_loader(self, side: str) -> Callable[[], memoryview]: ...


def _no_such_rank(step: int, rank: int, ranks: int, store: _Store) -> ConfigError:
    return ConfigError(f"add_fields: {no_such_rank(step, rank, ranks)}", where=store.locate())


class StoredFieldsSink(FieldsSink):
    """Appended fields in a store (a base of
    :class:`~rlwire.transport._stored.sink.StoredSink`)."""

    appends_fields = True
    #: (step, rank, id) of the message :meth:`read_committed` last read (its
    #: :func:`~rlwire.transport._stored.appended_tie.message_id`): the fields staged
    #: next for that step and rank are tied to it.
    _read_message: tuple[int, int, bytes] | None = None
    #: (step, rank, n) of the last :meth:`read_appended`: it read files 0 to n - 1, which
    #: the fields staged next for that step and rank are checked against: they take n.
    _appended_read: tuple[int, int, int] | None = None

    def attach_fields(self) -> None:
        store = cast(_Store, self)
        with store.errors("reach the destination"):
            store.prepare()

    def read_committed(
        self, step: int, rank: int, select: Selector, *, again: bool = False
    ) -> list[Frame] | None:
        store = cast(_Store, self)
        for tries in range(1, _READ_TRIES + 1):
            ids: list[bytes] = []
            gone: list[str] = []
            try:
                read = self._read_step(step, rank, select, ids, gone)
                break
            except CorruptFrameError as exc:
                # A file of the step gone since it was listed, or another one in its
                # place while it was read: a producer deleted the step meanwhile (and
                # wrote it again), unless its message is still the one read, or a file
                # stays missing (damaged).
                now = message_id(self._id_of, step, rank)
                if not (ids[0] != now if ids else gone) or tries == _READ_TRIES:
                    raise
                if again:  # the message the first try read is gone
                    why = step_replaced(step, sent_again=bool(now))
                    raise ConfigError(f"add_fields: {why}", where=store.locate()) from exc
        if read is None:
            return None
        first, now = self._read_message, read[0][0] if read else b""
        if again and first is not None and first[:2] == (step, rank) and first[2] != now:
            raise ConfigError(f"add_fields: {step_replaced(step, True)}", where=store.locate())
        self._read_message = (step, rank, now)
        return [frame for _, frame in read]

    def _read_step(
        self, step: int, rank: int, select: Selector, ids: list[bytes], gone: list[str]
    ) -> list[tuple[bytes, Frame]] | None:
        """What :meth:`read_committed` reads: each file's id and frame, or ``None``;
        ``ids`` gets the id of each file as it is opened, ``gone`` the name of a file
        listed that is missing (both: what a CorruptFrameError raised here was)."""
        store = cast(_Store, self)

        def selected(name: str, side: str, part: int | None) -> tuple[bytes, Frame]:
            with store.errors("read", name):
                head = store.load_head(name, HEAD_BYTES)
            if head is None:
                gone.append(name)
                what = "the seal lists it" if part is not None else "it was listed"
                raise CorruptFrameError(f"missing; {what}", where=store.locate(name))
            file = SinkFile(store, name, head)
            ids.append(file.id)
            return file.id, parse_selected(
                file,
                lambda _size: WholeFile(whole_side(store, side)),
                step=step,
                rank=rank,
                part=part,
                select=select,
                where=store.locate(name),
            )[2]

        with store.errors(f"read step {step}"):
            names = set(store.names())
        if main_name(step, rank) in names:
            return [selected(main_name(step, rank), sidecar_name(step, rank), None)]
        if main_name(step, 0) in names:  # sent whole, to fewer ranks
            ranks = next(r for r in range(1, rank + 1) if main_name(step, r) not in names)
            raise _no_such_rank(step, rank, ranks, store)
        if seal_name(step) not in names:
            return None
        with store.errors("read", seal_name(step)):
            data = store.load_head(seal_name(step), MAX_ENVELOPE + 64)
        if data is None:
            return None
        seal = parse_seal(memoryview(data), step=step, where=store.locate(seal_name(step)))
        if rank >= seal.ranks:
            raise _no_such_rank(step, rank, seal.ranks, store)
        return [
            selected(part_name(step, rank, i), part_sidecar_name(step, rank, i), i)
            for i in range(len(seal.keys[rank]))
        ]

    def _id_of(self, step: int, rank: int, part: int | None) -> bytes | None:
        store = cast(_Store, self)
        name = main_name(step, rank) if part is None else part_name(step, rank, part)
        with store.errors("read", name):
            head = store.load_head(name, HEAD_BYTES)
        if head is None:
            return None
        file, where = SinkFile(store, name, head), store.locate(name)
        return read_envelope(file, where, step=step, rank=rank, part=part)[1].id

    def _tied_to(self, step: int, rank: int) -> bytes:
        """The id of the message the fields of ``step`` and ``rank`` are checked
        against: the one :meth:`read_committed` read, else the one stored now."""
        read = self._read_message
        if read is not None and read[:2] == (step, rank):
            return read[2]
        return message_id(self._id_of, step, rank)

    def read_appended(self, step: int, rank: int) -> list[Frame]:
        store = cast(_Store, self)
        got = []
        for index in range(MAX_APPENDS):
            name = fields_name(step, rank, index)
            data = whole_main(store, name)
            if data is None:
                break
            side = fields_name(step, rank, index, sidecar=True)
            got.append(
                parse_appended(
                    data,
                    step=step,
                    rank=rank,
                    load_sidecar=lambda _, side=side: whole_side(store, side),  # type: ignore[misc]
                    where=store.locate(name),
                )
            )
        self._appended_read = (step, rank, len(got))
        return checked_against(got, self._tied_to(step, rank))

    def stage_fields(
        self, step: int, rank: int, frame: Frame, *, names: frozenset[str] = frozenset()
    ) -> Sliced[Staged]:
        del names  # a taken index is a StepExistsError: add_fields checks again, and retries
        store = cast(_Store, self)
        with store.errors(f"list the fields appended to step {step}"):
            stored = store.names()
        if main_name(step, rank) not in stored and seal_name(step) not in stored:
            raise ConfigError(
                f"add_fields: step {step} is not committed (sent whole, or sealed)",
                where=store.locate(),
            )
        # The lowest number with no main file, as readers count (see appended_numbers).
        index, orphan = next_number(stored, step, rank)
        frame = without_sidecar(frame) if orphan else frame
        read = self._appended_read
        if read is not None and read[:2] == (step, rank) and read[2] != index:
            # Checked against files 0 to n - 1, they take n: one appended since goes unchecked.
            raise StepExistsError(
                f"another stage appended to step {step} rank {rank} since the fields were "
                f"checked against its {read[2]} files of appended fields (it holds {index})",
                where=store.locate(fields_name(step, rank, read[2])),
            )
        if index >= MAX_APPENDS:
            raise StepExistsError(
                f"step {step} rank {rank} holds {index} files of appended fields already",
                where=store.locate(),
            )
        main, side = fields_name(step, rank, index), fields_name(step, rank, index, sidecar=True)
        of = self._tied_to(step, rank)

        def write(staging: _Staging) -> Sliced[None]:
            with store.errors(f"write the fields appended to step {step}", main):
                sums = (yield from checksum_segments(frame)) if store.checksum else None
                layout = plan(frame, step, rank, sums, of=of)
                if layout.sidecar:
                    yield from staging.add(side, layout.sidecar, main=False)
                yield from staging.add(main, layout.main, main=True)

        def check() -> None:
            try:
                now = message_id(self._id_of, step, rank)
            except (TransportError, CorruptFrameError):
                return  # committed, and tied: readers tell, if this cannot
            if now != of:
                why = step_replaced(step, sent_again=bool(now))
                raise ConfigError(f"add_fields: {why}", where=store.locate(main))

        def clean() -> None:  # the main file is this one's: no file refers to the sidecar
            with contextlib.suppress(TransportError), store.errors("remove", side):
                store.remove([side])

        staged = store._staged(step, write, f"append fields to step {step} rank {rank}")
        return (yield from tied(staged, check, clean if orphan else None))


class StoredFieldsSource(FieldsSource):
    """Appended fields read from a store (a base of
    :class:`~rlwire.transport._stored.source.StoredSource`): a reader takes those tied
    to the step's message as stored when it looks (or written before 1.5)."""

    appends_fields = True
    #: (step, id) of the step's message the last :meth:`read_appended` tied its
    #: messages to (None: it found none that says, 1.3's)
    _tied: tuple[int, bytes] | None = None

    def _id_of(self, step: int, rank: int, part: int | None) -> bytes | None:
        reader = cast(_Reader, self)
        name = main_name(step, rank) if part is None else part_name(step, rank, part)
        file = reader.open_head(name)
        if file is None:
            return None
        where = reader.locate(name)
        return read_envelope(file, where, step=step, rank=rank, part=part)[1].id

    def appended_still_tied(self, step: int) -> bool:
        tied = self._tied
        if tied is None or tied[0] != step:
            return True
        return message_id(self._id_of, step, cast(_Reader, self).rank) == tied[1]

    def read_appended(self, step: int) -> list[Frame]:
        reader = cast(_Reader, self)
        self._tied = None
        got = []
        for index in range(MAX_APPENDS):
            one = read_appended_message(cast(AppendedReader, self), step, index)
            if one is None:
                break
            got.append(one)
        if all(of is None for of, _ in got):
            return [frame for _, frame in got]
        self._tied = (step, message_id(self._id_of, step, reader.rank))
        return checked_against(got, self._tied[1])
