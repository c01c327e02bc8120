"""What ties a message of fields appended to a step (``add_fields``) to the step's
message it was checked against, in a store (format 1.5, docs/format.md "Appended
fields"): its envelope's ``of`` is that message's ``id``, which :func:`message_id`
reads; readers keep the messages :func:`checked_against` the step's as they read it,
and a writer's :class:`TiedStaging` checks the step again once it has committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rlwire._core.errors import ConfigError, StepExistsError, TransportError
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selector
from rlwire.transport._base import Staged
from rlwire.transport._stored.layout import _parse, _whole_envelope
from rlwire.transport._stored.names import fields_name
from rlwire.transport._stored.selected import Ranged, parse_selected

__all__ = [
    "AppendedReader",
    "TiedStaging",
    "checked_against",
    "message_id",
    "parse_appended",
    "read_appended_message",
    "removed",
    "tied",
]


def parse_appended(
    data: memoryview,
    *,
    step: int,
    rank: int,
    load_sidecar: Callable[[int], memoryview],
    where: str,
    verify: bool = True,
) -> tuple[bytes | None, Frame]:
    """A message of appended fields, read as a whole step's main file is, and the id of
    the step's message it was checked against (``None``: written before 1.5)."""
    env = _whole_envelope(data, where)
    return env.of, _parse(env, data, step, rank, load_sidecar, where, verify)


class AppendedReader(Protocol):
    """What of a :class:`~rlwire.transport._stored.source.StoredSource`
    :func:`read_appended_message` uses."""

    rank: int
    verify: bool
    select: Selector | None

    def load(self, name: str) -> memoryview | None: ...
    def open_ranged(self, name: str) -> Ranged | None: ...
    def locate(self, name: str) -> str: ...
    def _sidecar_loader(self, side: str) -> Callable[[int], memoryview]: ...
    def _sidecar_opener(self, side: str) -> Callable[[int], Ranged]: ...


def read_appended_message(
    reader: AppendedReader, step: int, index: int
) -> tuple[bytes | None, Frame] | None:
    """The appended message ``index`` of ``step`` for the reader's rank, as
    :func:`parse_appended` returns it, or ``None`` if there is none. With the reader's
    ``select`` set (a receiver's ``fields=``), read by ranges, only the buffers it asks
    for: none of a message that holds none of the fields (its frame lists every
    buffer as :attr:`~rlwire.Frame.missing`)."""
    name = fields_name(step, reader.rank, index)
    side, where = fields_name(step, reader.rank, index, sidecar=True), reader.locate(name)
    if reader.select is None:
        data = reader.load(name)
        if data is None:
            return None
        load_sidecar = reader._sidecar_loader(side)
        return parse_appended(
            data,
            step=step,
            rank=reader.rank,
            load_sidecar=load_sidecar,
            where=where,
            verify=reader.verify,
        )
    main = reader.open_ranged(name)
    if main is None:
        return None
    env, _, frame = parse_selected(
        main,
        reader._sidecar_opener(side),
        step=step,
        rank=reader.rank,
        part=None,
        select=reader.select,
        where=where,
        verify=reader.verify,
    )
    return env.of, frame


def checked_against(appended: list[tuple[bytes | None, Frame]], of: bytes) -> list[Frame]:
    """The messages of ``appended`` checked against the step's message ``of`` (or
    written before 1.5, which does not say): those of a step deleted and written
    again under its number belong to no step a reader may get."""
    return [frame for tied, frame in appended if tied is None or tied == of]


def message_id(
    id_of: Callable[[int, int, int | None], bytes | None], step: int, rank: int
) -> bytes:
    """The id of ``rank``'s message of ``step`` as stored now, what appended fields are
    tied to: its main file's, or its first part's; ``b""`` when it has neither (a step
    with no part for the rank, or none at all). ``id_of(step, rank, part)`` reads the
    id of the main file of that step and rank (``part`` None) or of that part, checked
    as such, or returns None if there is no such file."""
    for part in (None, 0):
        found = id_of(step, rank, part)
        if found is not None:
            return found
    return b""


def removed(exc: Exception) -> StepExistsError:
    """The error that tells ``add_fields`` to write its file again: ``exc``, a failure
    to write or commit it caused by a FileNotFoundError, was a sender opening (resume,
    overwrite, truncate) that removed the file in the making (on S3: aborted its
    multipart upload) as a killed writer's leftover, the step kept."""
    return StepExistsError(
        "the file of the fields in the making was removed (a sender opening took it for a "
        f"killed writer's leftover): {exc.__cause__}",
        where=getattr(exc, "where", None),
    )


class TiedStaging(Staged):
    """Staged fields whose commit then checks that the step is still the message they
    were checked against (``check`` raises if not: readers pass over them). A commit
    that fails, nothing made visible, checks it too: a sender opening (resume,
    overwrite, truncate) removes the file in the making as a killed writer's leftover,
    so the caller is told the step was deleted (what ``check`` raises) or, the step
    kept, to write the file again (StepExistsError, as when another stage took its
    number). ``after``, when given, runs once the commit made the fields visible and
    ``check`` passed (what a writer does that needs its own file committed first)."""

    def __init__(
        self, staged: Staged, check: Callable[[], None], after: Callable[[], None] | None = None
    ) -> None:
        self.staged, self.check, self.after = staged, check, after

    def commit(self) -> None:
        try:
            self.staged.commit()
        except Exception as exc:
            if isinstance(exc, StepExistsError) or self.staged.visible:
                raise
            try:
                self.check()
            except ConfigError as why:
                raise why from exc
            if isinstance(exc.__cause__, FileNotFoundError):
                raise removed(exc) from exc
            raise
        finally:
            self.visible = self.staged.visible
        self.check()
        if self.after is not None:
            self.after()

    def discard(self) -> None:
        self.staged.discard()


def tied(
    staging: Sliced[Staged], check: Callable[[], None], after: Callable[[], None] | None = None
) -> Sliced[TiedStaging]:
    """The fields ``staging`` stages (a sink's ``_staged``), tied by ``check``, then
    ``after`` (see :class:`TiedStaging`). A write that fails for a FileNotFoundError
    (S3: the multipart upload in the making aborted by a sender opening) checks the step
    too: the ``ConfigError`` of ``check``, or :func:`removed`."""
    try:
        staged = yield from staging
    except TransportError as exc:
        if not isinstance(exc.__cause__, FileNotFoundError):
            raise
        check()
        raise removed(exc) from exc
    return TiedStaging(staged, check, after)
