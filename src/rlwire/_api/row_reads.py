"""The ``manifest()`` and ``read_rows()`` of :class:`~rlwire.TrainingBatchReceiver`:
a handle on a stored message, and rows ``[a, b)`` of one of its columns read through it.

Both are methods of a receiver (not functions of a URL) because a receiver already holds
what they need: its store's connection (an S3 client, its credentials and
``storage_options``), whether it verifies checksums, its decode limits, its worker
threads and its sync and async faces. Any receiver of the store reads rows through any
manifest of it, whatever the rank it was opened for.

A manifest is made from the message's envelope and codec header alone. A row read opens
the message's head again (a few pages of a file; S3: its first ranged GET), checks that
it is still the message the manifest names (its id), reads the column's offsets whole
(checked against their checksum) and only the bytes of the rows asked for. Those bytes
cannot be checked against the values' checksum, which covers the whole buffer: what is
checked is that they lie inside the buffer, and the offsets that point at them. A
compressed values buffer is read whole, checked and decompressed.
"""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from typing import Any

import numpy as np

from rlwire._api.decoding import FrameDecoding
from rlwire._api.manifest import Manifest, ManifestColumn
from rlwire._core.args import check_int
from rlwire._core.errors import (
    ClosedError,
    ConfigError,
    CorruptFrameError,
    FieldNotFoundError,
    RlwireError,
    StaleManifestError,
)
from rlwire._core.offload import drive_sliced
from rlwire._core.ragged import Ragged, offsets_problem
from rlwire._core.slicing import Held, Sliced, run_sliced
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source
from rlwire.transport._heads import Head, read_head_of, sealed, store_url

__all__ = ["RowReads"]


class RowReads:
    """:meth:`manifest` and :meth:`read_rows`, with their awaitable twins, over a
    receiver's source."""

    _source: Source
    _rank: int | None
    _mutex: threading.Lock
    _limiter: Any
    _closed: bool
    _decoding: FrameDecoding
    _writable: bool

    def manifest(
        self, step: int, *, part: int | None = None, rank: int | None = None
    ) -> Manifest | None:
        """The :class:`~rlwire.Manifest` of ``step`` (with ``part``, of that part of it)
        for ``rank`` (default: the receiver's), made from its envelope and codec header
        only; ``None`` when it is not stored (yet). It does not move the receiver.

        Raises:
            ConfigError: the source is not a store (ZeroMQ, ``ray://``: their messages
                are not kept to be read again), or ``step`` was filled part by part and
                no ``part`` was given.
            CorruptFrameError: the envelope or header is damaged.
            FrameTooLargeError: the compressed header declares more than the
                receiver's ``limits`` allow.
            ClosedError: the receiver is closed.
            TransportError: the store cannot be read.

        Example:
            >>> import numpy as np, rlwire, tempfile
            >>> path = tempfile.mkdtemp()
            >>> with rlwire.open_sync_sender(path) as sender:
            ...     _ = sender.send({"samples": [{"token_ids": np.arange(4)}]})
            >>> with rlwire.open_receiver(path) as receiver:
            ...     m = receiver.manifest(0)
            >>> m.rows, [(c.name, c.dtype) for c in m.columns]
            (1, [('token_ids', '<i8')])
        """
        return run_sliced(self._manifest(step, part, rank))

    async def amanifest(
        self, step: int, *, part: int | None = None, rank: int | None = None
    ) -> Manifest | None:
        """:meth:`manifest` in a worker thread."""

        return await drive_sliced(self._manifest(step, part, rank), self._limiter)

    def _manifest(self, step: int, part: int | None, rank: int | None) -> Sliced[Manifest | None]:
        """The work of :meth:`manifest`, sliced where it waits for the mutex."""
        source = self._open()
        check_int(step, "step")
        rank = self._which_rank(rank)
        if part is not None:
            check_int(part, "part")
        held = Held(self._mutex)
        try:
            yield from held.take()
            head = read_head_of(source, step, rank, part)
            if head is None:
                if part is None and sealed(source, step):
                    raise ConfigError(
                        f"step {step} was filled part by part: ask for the manifest of "
                        "one of its parts (manifest(step, part=i))",
                        where=source.describe(step),
                    )
                return None
            table = self._table(head)
        except RlwireError as exc:
            exc.add_context(step=step, rank=rank)
            raise
        finally:
            held.release()
        return _manifest(head, table, store_url(source), step, rank)

    def read_rows(self, manifest: Manifest, column: str, start: int, stop: int) -> Ragged:
        """Rows ``[start, stop)`` of the ragged ``column`` of the message ``manifest``
        names: an :class:`~rlwire.Ragged` whose values are views over what was read
        (copies when the receiver is ``writable``, and for a column small enough to be
        kept in the codec header), offsets from 0.

        Only the column's offsets and the bytes of those rows are read (after the
        message's head, to check it is still the one named): on files only their
        pages, on S3 only their byte ranges.

        Raises:
            FieldNotFoundError: the message has no column ``column``.
            ConfigError: ``start:stop`` is not a range of its rows, or the column is
                not ragged (a column of other values, kept in the header: read it with
                ``open_receiver(url, fields=...)``), or the source is not a store.
            StaleManifestError: the message is no longer stored, was written again
                since (another id), or is of another store than the receiver's.
            CorruptFrameError: the offsets do not match their checksum or the values,
                or the header is damaged.
            FrameTooLargeError: the header or a compressed values buffer it reads whole
                declares more than the receiver's ``limits`` allow.
            ClosedError, TransportError: as :meth:`manifest`.

        Each error from the message itself names its file (or object) and step.

        Example:
            >>> import numpy as np, rlwire, tempfile
            >>> path = tempfile.mkdtemp()
            >>> rows = [{"token_ids": np.arange(n)} for n in (3, 1, 2)]
            >>> with rlwire.open_sync_sender(path) as sender:
            ...     _ = sender.send({"samples": rows})
            >>> with rlwire.open_receiver(path) as receiver:
            ...     got = receiver.read_rows(receiver.manifest(0), "token_ids", 1, 3)
            >>> [row.tolist() for row in got]
            [[0], [0, 1]]
        """
        return run_sliced(self._read_rows(manifest, column, start, stop))

    async def aread_rows(self, manifest: Manifest, column: str, start: int, stop: int) -> Ragged:
        """:meth:`read_rows` in a worker thread."""

        return await drive_sliced(self._read_rows(manifest, column, start, stop), self._limiter)

    def _read_rows(self, manifest: Manifest, column: str, start: int, stop: int) -> Sliced[Ragged]:
        """The work of :meth:`read_rows`, sliced where it waits for the mutex."""
        source = self._open()
        if not isinstance(manifest, Manifest):
            raise ConfigError(f"read_rows needs an rlwire.Manifest, got {type(manifest).__name__}")
        described = _described(manifest, column)
        check_int(start, "start")
        check_int(stop, "stop")
        rows = manifest.rows or 0
        if not 0 <= start <= stop <= rows:
            raise ConfigError(
                f"rows {start}:{stop} are not a range of the {rows} rows of {column!r} "
                f"(step {manifest.step}, rank {manifest.rank})"
            )
        url = store_url(source)
        if manifest.url != url:
            raise StaleManifestError(
                f"the manifest is of {manifest.url}, and this receiver reads {url}"
            )
        try:
            held = Held(self._mutex)
            try:
                yield from held.take()
                return self._rows(source, manifest, described, start, stop)
            finally:
                held.release()
        except RlwireError as exc:
            exc.add_context(step=manifest.step, rank=manifest.rank)
            raise

    def _open(self) -> Source:
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        store_url(self._source)  # a store, or ConfigError
        return self._source

    def _which_rank(self, rank: int | None) -> int:
        if rank is None:
            return self._rank if self._rank is not None else getattr(self._source, "rank", 0)
        check_int(rank, "rank")
        return rank

    def _header(self, head: Head) -> Frame:
        """``head``'s frame, its header decompressed."""
        return run_sliced(self._decoding.decompressed(head.frame))

    def _table(self, head: Head) -> Any:
        codec = self._decoding.codec(head.frame.codec)
        describe = getattr(codec, "describe_columns", None)  # msgpack's; not a plugin's
        if describe is None:
            return None
        try:
            table = describe(self._header(head))
        except RlwireError as exc:  # damaged, or past a limit when decompressed
            exc.add_context(where=head.where)
            raise
        n = len(head.files)
        for col in table.columns if table else ():
            if any(not 0 <= b < n for b in col.buffers):
                raise CorruptFrameError(
                    f"column {col.name!r} refers to buffers {list(col.buffers)}; the "
                    f"message has {n}",
                    where=head.where,
                )
            if col.dtype is not None:  # ragged: its buffers' sizes, as the decode checks them
                _check_sizes(head, col, table.rows)
        return table

    def _values(self, head: Head, view: memoryview, col: Any, count: int) -> np.ndarray:
        """``count`` items of ``col``'s values over ``view``, made by the codec."""
        codec: Any = self._decoding.codec(head.frame.codec)  # describe_columns' codec
        made: np.ndarray = codec.column_values(view, col, count, self._writable)
        return made

    def _whole(self, head: Head, index: int) -> memoryview:
        """Buffer ``index`` read whole, checked, decompressed."""
        view = head.read([(index, 0, head.lengths[index])])[0]
        if not head.compressed(index):
            return view
        frame = head.frame
        frame = replace(
            frame,
            buffers=tuple(view if i == index else b for i, b in enumerate(frame.buffers)),
            missing=frame.missing - {index},
        )
        out = run_sliced(self._decoding.decompressed(frame)).buffers[index]
        assert isinstance(out, memoryview)  # decompressed or read: never Pieces
        return out

    def _rows(self, source: Source, manifest: Manifest, name: str, start: int, stop: int) -> Ragged:
        head = read_head_of(source, manifest.step, manifest.rank, manifest.part)
        if head is None or head.id != manifest.id:
            what = "no longer stored" if head is None else "written again since (another id)"
            raise StaleManifestError(
                f"the message the manifest names is {what}: make a new manifest",
                where=source.describe(manifest.step),
            )
        try:
            return self._rows_of(head, manifest, name, start, stop)
        except RlwireError as exc:  # its buffers damaged, past a limit, not read
            exc.add_context(where=head.where)
            raise

    def _rows_of(self, head: Head, manifest: Manifest, name: str, start: int, stop: int) -> Ragged:
        """Rows ``[start, stop)`` of column ``name`` of the message ``head`` opens."""
        table = self._table(head)
        col = next((c for c in table.columns if c.name == name), None) if table else None
        if table is None or col is None or col.dtype is None or table.rows != manifest.rows:
            raise CorruptFrameError(
                f"holds no column {name!r} of {manifest.rows} rows, as its manifest says",
                where=head.where,
            )
        offsets = self._offsets(head, col, table.rows)
        first, last = int(offsets[start]), int(offsets[stop])
        values: Any = col.values
        if isinstance(values, np.ndarray):  # kept in the header: a view of its bytes
            got = values[first:last].copy()
            got.flags.writeable = self._writable
        else:
            row_bytes = np.dtype(col.dtype).itemsize * math.prod(col.row_shape)
            if head.compressed(values) or (col.order != "C" and col.row_shape):
                whole = self._whole(head, values)
                got = self._values(head, whole, col, col.length)[first:last]
            else:  # its size checked with the table
                span = head.read([(values, first * row_bytes, last * row_bytes)])[0]
                got = self._values(head, span, col, last - first)
        return Ragged(got, offsets[start : stop + 1] - first)

    def _offsets(self, head: Head, col: Any, rows: int) -> np.ndarray:
        """``col``'s offsets, read whole and checked (against its checksum, and as
        boundaries of its values)."""
        offsets: np.ndarray
        if isinstance(col.offsets, np.ndarray):
            offsets = col.offsets
        else:
            assert col.offsets is not None
            view = self._whole(head, col.offsets)
            if view.nbytes != 8 * (rows + 1):
                raise CorruptFrameError(
                    f"column {col.name!r}: offsets of {view.nbytes} bytes for {rows} rows",
                    where=head.where,
                )
            offsets = np.frombuffer(view, "<i8")
        problem = (
            offsets_problem(offsets, col.length)
            if len(offsets) == rows + 1
            else (f"are {len(offsets)}, for {rows} rows")
        )
        if problem:
            raise CorruptFrameError(f"column {col.name!r}: offsets {problem}", where=head.where)
        return offsets


def _check_sizes(head: Head, col: Any, rows: int) -> None:
    """Refuse ragged column ``col`` if a buffer it stores uncompressed is not the size
    its table gives (the values: its items; the offsets: ``rows + 1`` of 8 bytes)."""
    sizes = []
    if not isinstance(col.values, np.ndarray) and not head.compressed(col.values):
        row_bytes = np.dtype(col.dtype).itemsize * math.prod(col.row_shape)
        if col.order == "C" or not col.row_shape:
            sizes.append((col.values, col.length * row_bytes, f"{col.length} items"))
    if isinstance(col.offsets, int) and not head.compressed(col.offsets):
        sizes.append((col.offsets, 8 * (rows + 1), f"offsets of {rows} rows"))
    for index, size, what in sizes:
        if head.lengths[index] != size:
            raise CorruptFrameError(
                f"column {col.name!r}: buffer {index} holds {head.lengths[index]} bytes, "
                f"for {what} ({size} bytes)",
                where=head.where,
            )


def _described(manifest: Manifest, column: str) -> str:
    """``column``, checked against the manifest's columns."""
    col: ManifestColumn | None = manifest.column(column)
    if col is None:
        names = ", ".join(c.name for c in manifest.columns) or "no column"
        raise FieldNotFoundError(
            f"column {column!r} is not in the message (its samples hold: {names})"
        ).add_context(step=manifest.step, rank=manifest.rank)
    if col.dtype is None:
        what = "one value a row, one array" if col.buffers else "values kept in the codec header"
        raise ConfigError(
            f"column {column!r} is not ragged ({what}): read it with open_receiver(url, fields=...)"
        )
    return column


def _manifest(head: Head, table: Any, url: str, step: int, rank: int) -> Manifest:
    sums = head.checksums
    columns = tuple(
        ManifestColumn(
            name=c.name,
            dtype=c.dtype,
            row_shape=c.row_shape,
            size=sum(head.lengths[b] for b in c.buffers)
            + sum(a.nbytes for a in (c.values, c.offsets) if isinstance(a, np.ndarray)),
            buffers=c.buffers,
            checksums=tuple(sums[b + 1] for b in c.buffers) if sums else (),
        )
        for c in (table.columns if table else ())
    )
    return Manifest(
        url=url,
        step=step,
        rank=rank,
        part=None if head.info is None else head.info.index,
        key=None if head.info is None else head.info.key,
        id=head.id,
        codec=head.frame.codec,
        size=head.size,
        rows=None if table is None else table.rows,
        field=None if table is None else table.field,
        columns=columns,
        header_checksum=None if sums is None else sums[0],
    )
