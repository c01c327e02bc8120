"""JSON-lines files, streamed in slices; :mod:`rlwire.codecs.jsonl` is its face."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Iterator
from typing import Any

import anyio
import msgspec
import orjson
from anyio import CapacityLimiter, to_thread

from rlwire._core.args import check_int
from rlwire._core.errors import (
    ConfigError,
    CorruptFrameError,
    DecodeError,
    EncodeError,
    FrameTooLargeError,
    RlwireError,
    transport_error,
)
from rlwire._core.offload import drive_sliced, make_limiter
from rlwire._core.slicing import Sliced, SliceTimer, run_sliced
from rlwire.codecs._json.cost import refuse_costly
from rlwire.codecs._json.files import (
    BinaryReader,
    JsonlDestination,
    JsonlSource,
    OutputFile,
    check_binary,
    name_of,
)
from rlwire.codecs._json.parse import parse
from rlwire.codecs._json.values import OPTION, convert, dumps, type_name

__all__ = ["DEFAULT_MAX_LINE_BYTES", "adump_jsonl", "aload_jsonl", "dump_jsonl", "load_jsonl"]

#: Longest line :func:`load_jsonl` accepts by default (bytes, newline excluded).
DEFAULT_MAX_LINE_BYTES = 256 << 20

_LINE_OPTION = OPTION | orjson.OPT_APPEND_NEWLINE

# Bytes read per chunk, bytes encoded before a write, records taken at a time from an
# async iterable.
_READ_CHUNK = 1 << 20
_WRITE_BYTES = 1 << 20
_ASYNC_RECORDS = 256


class _LineWriter:
    """Encodes records as lines and writes them about a megabyte at a time."""

    def __init__(self, output: OutputFile) -> None:
        self.output = output
        self.buf = bytearray()
        self.count = 0
        self.slicer = SliceTimer()

    def feed(self, records: Iterable[Any]) -> Sliced[None]:
        """Encode and write ``records``; on an error, the lines of the records before
        the failing one are written (whole), then the EncodeError is raised."""
        for record in records:
            try:
                self.buf += dumps(record, _LINE_OPTION, None, f"record {self.count}: ")
            except EncodeError:
                self._write()
                raise
            self.count += 1
            if len(self.buf) >= _WRITE_BYTES:
                yield
                self._write()  # a slice of its own: os.write releases the GIL
                yield
                self.slicer.restart()
            elif self.slicer.due():
                yield
                self.slicer.restart()

    def finish(self) -> Sliced[None]:
        """Write what is left and commit (rename the temporary file into place)."""
        yield
        self._write()
        self.output.commit()

    def _write(self) -> None:
        if self.buf:
            buf, self.buf = self.buf, bytearray()
            self.output.write(buf)


def _dump_sliced(records: Iterable[Any], file: JsonlDestination, append: bool) -> Sliced[int]:
    output = OutputFile(file, append)
    try:
        writer = _LineWriter(output)
        yield from writer.feed(records)
        yield from writer.finish()
    except BaseException:
        output.abort()
        raise
    return writer.count


def dump_jsonl(records: Iterable[Any], file: JsonlDestination, *, append: bool = False) -> int:
    """Write ``records`` as JSON lines (one JSON document per line) and return how many.

    Records follow the value rules of :mod:`rlwire.codecs._json.codec` (arrays become lists,
    NaN/Inf become ``null``). They are encoded one by one and written about a megabyte at a time, so
    the file is never held in memory whole.

    Given a path, the lines go to a temporary file beside it that is renamed into place
    at the end: a reader sees the old file or the whole new one, never one cut short. With
    ``append=True`` the lines are appended to the file (created if missing) directly, in
    whole lines. A binary file object is written at its position and not closed.

    Raises:
        EncodeError: a record holds a value JSON cannot carry; the message names the
            record and the path inside it (``record 17: $.extras.x: ...``). A path given
            without ``append`` is then left untouched; with ``append=True`` or a file
            object, exactly the records before the failing one have been written.
        TransportError: the file cannot be created or written.
        ConfigError: ``file`` is a text file object, or ``append=True`` with a file object.

    Example:
        >>> import numpy as np, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "rollouts.jsonl"
        >>> dump_jsonl([{"ids": np.arange(3)}, {"ids": np.arange(2), "r": 0.5}], path)
        2
        >>> path.read_bytes()
        b'{"ids":[0,1,2]}\\n{"ids":[0,1],"r":0.5}\\n'
    """
    return run_sliced(_dump_sliced(records, file, append))


async def adump_jsonl(
    records: Iterable[Any] | AsyncIterable[Any],
    file: JsonlDestination,
    *,
    append: bool = False,
    limiter: CapacityLimiter | int | None = None,
) -> int:
    """:func:`dump_jsonl` for async code: encoding and writing run in worker threads
    under ``limiter``, in slices short enough that the event loop stays responsive.

    ``records`` may be an async iterable; its records are taken on the event loop and
    encoded up to 256 at a time. Cancelling leaves nothing at a path
    written without ``append``. Raises what :func:`dump_jsonl` raises.

    Example:
        >>> import anyio, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "log.jsonl"
        >>> anyio.run(adump_jsonl, [{"step": 1}, {"step": 2}], path)
        2
    """
    lim = make_limiter(limiter)
    if not isinstance(records, AsyncIterable):
        return await drive_sliced(_dump_sliced(records, file, append), lim)
    output = await to_thread.run_sync(OutputFile, file, append, limiter=lim)
    try:
        writer = _LineWriter(output)
        taken: list[Any] = []
        async for record in records:
            taken.append(record)
            if len(taken) >= _ASYNC_RECORDS:
                await drive_sliced(writer.feed(taken), lim)
                taken = []
        if taken:
            await drive_sliced(writer.feed(taken), lim)
        await drive_sliced(writer.finish(), lim)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await to_thread.run_sync(output.abort, limiter=lim)
        raise
    return writer.count


class _LineReader:
    """Reads a file a chunk at a time, splits lines, and parses them."""

    def __init__(self, file: JsonlSource, tp: Any, max_line_bytes: int) -> None:
        self.type = tp
        self.max_line_bytes = check_int(max_line_bytes, "max_line_bytes", low=1)
        self.owned = isinstance(file, str | os.PathLike)
        self.name: object
        if isinstance(file, str | os.PathLike):
            self.name = os.fspath(file)
            try:
                self.file: BinaryReader = open(file, "rb", buffering=0)  # noqa: SIM115
            except OSError as exc:
                raise transport_error(exc, "open the file", where=self.name) from exc
        else:
            check_binary(file, "read", "load_jsonl")
            self.file = file
            self.name = name_of(file)
        self.pending: list[bytes] = []  # the start of a line that continues in later chunks
        self.pending_len = 0
        self.lineno = 0
        self.done = False
        self.error: RlwireError | None = None
        self.slicer = SliceTimer()

    def close(self) -> None:
        """Close the file if it was opened here (from a path)."""
        if self.owned:
            self.file.close()  # type: ignore[attr-defined]

    def _read(self) -> bytes:
        try:
            chunk = self.file.read(_READ_CHUNK)
        except OSError as exc:
            raise transport_error(exc, "read", where=self.name) from exc
        if not isinstance(chunk, bytes | bytearray):
            raise ConfigError(
                f"load_jsonl needs a binary file, read gave {chunk!r}", where=self.name
            )
        return bytes(chunk)

    def _too_long(self) -> FrameTooLargeError:
        return FrameTooLargeError(
            f"line {self.lineno + 1}: longer than max_line_bytes={self.max_line_bytes}; "
            "pass a larger max_line_bytes if this is expected",
            where=self.name,
        )

    def next_records(self) -> Sliced[list[Any] | None]:
        """The records of the lines completed by the next chunk(s), or None at the end.

        A bad line ends the run of lines: the records before it are returned, and the error is
        raised by the next call."""
        if self.error is not None:
            error, self.error, self.done = self.error, None, True
            raise error
        while not self.done:
            chunk = self._read()
            yield  # the read released the GIL; parsing is the next slice
            if not chunk:
                return self._last_records()
            lines = self._complete_lines(chunk)
            if lines is not None:
                return (yield from self._parse_lines(lines))
        return None

    def _last_records(self) -> list[Any] | None:
        """At the end of the file: the record of a last line without a newline, if any."""
        self.done = True
        tail = b"".join(self.pending)
        self.pending = []
        if not tail or tail.isspace():
            return None
        if len(tail) > self.max_line_bytes:
            raise self._too_long()
        self.lineno += 1
        return [self._parse(tail, last=True)]

    def _complete_lines(self, chunk: bytes) -> list[bytes] | None:
        """The lines that ``chunk`` completes (None if it ends none); the start of the
        line it leaves open is kept for later chunks."""
        lines = chunk.split(b"\n")
        if len(lines) == 1:
            self.pending.append(chunk)
            self.pending_len += len(chunk)
            if self.pending_len > self.max_line_bytes:
                raise self._too_long()
            return None
        if self.pending:
            self.pending.append(lines[0])
            lines[0] = b"".join(self.pending)
        tail = lines.pop()
        self.pending = [tail] if tail else []
        self.pending_len = len(tail)
        return lines

    def _parse_lines(self, lines: list[bytes]) -> Sliced[list[Any]]:
        """The records of ``lines``; a bad line ends them, its error held for the next
        call (or raised now if it is the first)."""
        records: list[Any] = []
        try:
            for line in lines:
                if len(line) > self.max_line_bytes:
                    raise self._too_long()
                self.lineno += 1
                if line and not line.isspace():
                    records.append(self._parse(line, last=False))
                if self.slicer.due():
                    yield
                    self.slicer.restart()
        except RlwireError as exc:
            if not records:
                raise
            self.error = exc
        return records

    def _parse(self, line: bytes, *, last: bool) -> Any:
        """The record on line ``self.lineno``; ``last``: the file ends without a newline."""
        refuse_costly(line, len(line), f"line {self.lineno}", self.name)
        try:
            raw = parse(line)
        except orjson.JSONDecodeError as exc:
            problem = (
                "truncated: the file ends without a newline in the middle of a JSON "
                f"document ({exc})"
                if last
                else f"malformed JSON: {exc}"
            )
            raise CorruptFrameError(f"line {self.lineno}: {problem}", where=self.name) from None
        try:
            return convert(raw, self.type)
        except msgspec.ValidationError as exc:
            raise DecodeError(
                f"line {self.lineno}: does not match {type_name(self.type)}: {exc}",
                where=self.name,
            ) from None


def load_jsonl(
    file: JsonlSource, *, type: Any = Any, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[Any]:
    """Yield the records of a JSON-lines file, decoded into ``type`` (default: plain
    dicts, lists and numbers; see :meth:`rlwire.codecs._json.codec.JsonCodec.decode` for arrays).

    The file is read a megabyte at a time and never whole; blank lines are skipped. A
    last line without a newline is read if it is complete JSON. A path is opened (and
    closed when the iterator ends or is closed); a binary file object is read from its
    position and not closed.

    Raises:
        CorruptFrameError: a line is not valid JSON, or the last line is cut short; the
            message names the file and the line number.
        DecodeError: a record does not match ``type``; names the line and the path.
        FrameTooLargeError: a line is longer than ``max_line_bytes`` (bytes, newline
            excluded), so a file without newlines cannot exhaust memory, or parsing a
            line could build more Python objects than 256 MiB plus 16 times its length
            (a line of tiny values, such as empty lists).
        TransportError: the file cannot be opened or read.

    Example:
        >>> import io
        >>> list(load_jsonl(io.BytesIO(b'{"a": 1}\\n\\n[1, 2]\\n')))
        [{'a': 1}, [1, 2]]
    """
    reader = _LineReader(file, type, max_line_bytes)
    try:
        while (records := run_sliced(reader.next_records())) is not None:
            yield from records
    finally:
        reader.close()


async def aload_jsonl(
    file: JsonlSource,
    *,
    type: Any = Any,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    limiter: CapacityLimiter | int | None = None,
) -> AsyncGenerator[Any, None]:
    """:func:`load_jsonl` for async code: an async generator that reads the file a chunk
    at a time and parses its lines in worker threads under ``limiter``, in slices short
    enough that the event loop stays responsive. Raises what :func:`load_jsonl` raises.

    Close it (``contextlib.aclosing``) if you stop iterating early.

    Example:
        >>> import anyio, io
        >>> async def main() -> list[int]:
        ...     return [r["step"] async for r in aload_jsonl(io.BytesIO(b'{"step": 7}\\n'))]
        >>> anyio.run(main)
        [7]
    """
    lim = make_limiter(limiter)
    reader = await to_thread.run_sync(_LineReader, file, type, max_line_bytes, limiter=lim)
    try:
        while (records := await drive_sliced(reader.next_records(), lim)) is not None:
            for record in records:
                yield record
    finally:
        reader.close()
