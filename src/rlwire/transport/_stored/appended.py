"""Fields appended to a committed step (``sender.add_fields``), in a store.

Each call stores one message of its own per step and rank, beside the step's files:
``step-SSSSSSSS.rank-RRRR.fields-NNN.rlw`` (and ``….fields-NNN.sidecar.rlw`` when it
has a sidecar), ``NNN`` counting from 0 the calls that appended to that step and rank.
It is written and made visible as any message is (temporary name, checksums, sidecar
first, a commit that never replaces a file), so a reader sees the whole call's fields
or none of them. Readers find them by index, as they find parts: 0, 1, … until one is
missing. What they hold is the codec's business (:mod:`rlwire._api.appending`).
"""

from __future__ import annotations

from collections.abc import Callable

from rlwire._core.errors import CorruptFrameError, StepExistsError
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selector
from rlwire.transport._base import Staged
from rlwire.transport._stored.layout import _PRELUDE, MAX_ENVELOPE, _envelope, parse_main
from rlwire.transport._stored.names import (
    FIELDS_RE,
    fields_name,
    main_name,
    part_name,
    part_sidecar_name,
    seal_name,
    sidecar_name,
)
from rlwire.transport._stored.parts import parse_seal
from rlwire.transport._stored.selected import HEAD_BYTES, WholeFile, parse_selected
from rlwire.transport._stored.sink import StoredSink, StoredStaging
from rlwire.transport._stored.source import StoredSource

__all__ = ["keeps_steps", "read_appended", "sink_appended", "stage_fields", "stored_frames"]

#: The most appended-field files one step and rank may hold.
MAX_APPENDS = 1000


def _load_whole(sink: StoredSink, name: str) -> memoryview | None:
    """The whole file ``name`` through the sink (its envelope says how long it is)."""
    with sink.errors("read", name):
        head = sink.load_head(name, HEAD_BYTES)
        if head is None:
            return None
        head = memoryview(head)
        if head.nbytes >= _PRELUDE.size:
            end = _PRELUDE.size + int(_PRELUDE.unpack_from(head)[3])
            if head.nbytes < end <= _PRELUDE.size + MAX_ENVELOPE:
                head = memoryview(sink.load_head(name, end) or b"")
        size = _envelope(head, sink.locate(name), whole=False).size
        if size > head.nbytes:
            head = memoryview(sink.load_head(name, size) or b"")
        return head


def keeps_steps(end: object) -> bool:
    """Whether ``end`` (a sink or a source) is a store, whose steps fields are appended to."""
    return isinstance(end, StoredSink | StoredSource)


def stored_frames(sink: StoredSink, step: int, rank: int, select: Selector) -> list[Frame] | None:
    """The frames of ``rank``'s message of ``step`` as stored (one for a whole step, one
    per part, in index order, for a sealed step filled part by part), with only the
    buffers ``select`` asks for checked; ``None`` when the step is not committed.

    Raises:
        CorruptFrameError: a file is garbled.
        RlwireError: what ``select`` raises (a field the step does not hold).
    """

    def selected(name: str, side: str, part: int | None) -> Frame:
        data = _load_whole(sink, name)
        if data is None:
            raise CorruptFrameError("missing; the seal lists it", where=sink.locate(name))

        def open_side() -> WholeFile:
            got = _load_whole_side(sink, side)
            return WholeFile(got)

        return parse_selected(
            WholeFile(data),
            open_side,
            step=step,
            rank=rank,
            part=part,
            select=select,
            where=sink.locate(name),
        )[1]

    with sink.errors(f"read step {step}"):
        names = set(sink.names())
    if main_name(step, rank) in names:
        return [selected(main_name(step, rank), sidecar_name(step, rank), None)]
    if seal_name(step) not in names:
        return None
    with sink.errors("read", seal_name(step)):
        data = sink.load(seal_name(step))
    if data is None:
        return None
    seal = parse_seal(data, step=step, where=sink.locate(seal_name(step)))
    count = len(seal.keys[rank]) if rank < seal.ranks else 0
    return [
        selected(part_name(step, rank, i), part_sidecar_name(step, rank, i), i)
        for i in range(count)
    ]


def _load_whole_side(sink: StoredSink, name: str) -> memoryview:
    """A sidecar file whole (its length is not in its own prelude: read until short)."""
    size = 1 << 20
    with sink.errors("read", name):
        while True:
            data = sink.load_head(name, size)
            if data is None:
                raise CorruptFrameError(
                    "missing; the main file refers to it", where=sink.locate(name)
                )
            if len(data) < size:
                return memoryview(data)
            size *= 4


def stage_fields(
    sink: StoredSink, step: int, rank: int, frame: Frame
) -> Sliced[tuple[int, Staged]]:
    """Stage ``frame`` as the next file of fields appended to ``step`` for ``rank``:
    its index and the staging, which the caller commits.

    Raises:
        StepExistsError: the step holds :data:`MAX_APPENDS` such files already.
        TransportError: the store cannot be listed or written.
    """
    with sink.errors(f"list the fields appended to step {step}"):
        names = sink.names()
    taken = {
        int(m.group(3))
        for n in names
        if (m := FIELDS_RE.fullmatch(n)) and (int(m.group(1)), int(m.group(2))) == (step, rank)
    }
    index = max(taken, default=-1) + 1
    if index >= MAX_APPENDS:
        raise StepExistsError(
            f"step {step} rank {rank} holds {index} files of appended fields already",
            where=sink.locate(),
        )
    names_ = (fields_name(step, rank, index), fields_name(step, rank, index, sidecar=True))

    def write(staging: StoredStaging) -> Sliced[None]:
        yield from sink._write(staging, step, rank, frame, names_, None)

    return index, (yield from sink._staged(step, write))


def read_appended(source: StoredSource, step: int) -> list[Frame]:
    """Every file of fields appended to ``step`` for the source's rank, in index order,
    each read whole and checked.

    Raises:
        CorruptFrameError: a file is garbled, or not of this step and rank.
    """
    frames = []
    load: Callable[[str], memoryview | None] = source.load
    for index in range(MAX_APPENDS):
        name = fields_name(step, source.rank, index)
        data = load(name)
        if data is None:
            break
        side = fields_name(step, source.rank, index, sidecar=True)
        frames.append(
            parse_main(
                data,
                step=step,
                rank=source.rank,
                load_sidecar=source._sidecar_loader(side),
                where=source.locate(name),
                verify=source.verify,
            )
        )
    return frames


def sink_appended(sink: StoredSink, step: int, rank: int) -> list[Frame]:
    """:func:`read_appended`, through the sink (what ``add_fields`` checks against)."""
    frames = []
    for index in range(MAX_APPENDS):
        name = fields_name(step, rank, index)
        data = _load_whole(sink, name)
        if data is None:
            break
        side = fields_name(step, rank, index, sidecar=True)
        frames.append(
            parse_main(
                data,
                step=step,
                rank=rank,
                load_sidecar=lambda side=side: _load_whole_side(sink, side),  # type: ignore[misc]
                where=sink.locate(name),
            )
        )
    return frames
